/* checkpoint/gguf/gguf_vocab.h - the tokenizer.* keys of a GGUF export
 * from a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json,
 * generation_config.json), or the 256 byte tokens of tandem's byte-level
 * models.  The mapping and every refusal: docs/gguf.md.
 *
 *   byte-level BPE (no byte_fallback, a ByteLevel pre-tokenizer)
 *       tokenizer.ggml.model "gpt2": tokens as the vocabulary spells them,
 *       token_type, merges, tokenizer.ggml.pre named after the
 *       pre-tokenizer's regexes (qwen2, llama-bpe, deepseek-v3, gpt-2)
 *   BPE with byte_fallback (SentencePiece-style, Llama 2 / Mixtral)
 *       tokenizer.ggml.model "llama": tokens, scores (minus the rank of
 *       the merge that makes each token, so llama.cpp's score-greedy
 *       merging applies the merges in rank order), token_type with BYTE
 *       for <0xNN>, add_space_prefix from the normalizer or Metaspace
 *   no tokenizer (V = 256)
 *       "llama" with 256 BYTE tokens <0x00>..<0xFF>, id = byte, as
 *       ../shared/peers/llamacpp/write_gguf.py writes them
 * Both HF kinds get bos / eos / padding / unknown ids, add_bos_token and
 * add_eos_token (what tandem's encoder adds with special tokens on), and
 * tokenizer.chat_template when tokenizer_config.json has one.  Ids the
 * tokenizer does not define below V are "[PAD<id>]" of type UNUSED.
 */
#ifndef TANDEM_CHECKPOINT_GGUF_GGUF_VOCAB_H
#define TANDEM_CHECKPOINT_GGUF_GGUF_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/gguf/gguf.h"

/* The tokenizer files as texts (borrowed).  json == NULL: no tokenizer
 * (byte-level model).  config and gen may be NULL. */
typedef struct {
    const char *json;
    size_t json_len;
    const char *config;
    size_t config_len;
    const char *gen;
    size_t gen_len;
} GgufTokFiles;

/* What was written, for the command's summary line. */
typedef struct {
    char model[16];      /* "gpt2" or "llama" */
    char pre[24];        /* tokenizer.ggml.pre, "" for "llama" */
    int32_t n_tokens;    /* = V */
    int32_t n_defined;   /* ids the tokenizer defines (the rest are [PAD<id>]) */
    int32_t n_merges;
    int32_t bos, eos;    /* -1: not written */
    int add_bos, add_eos;
} GgufVocabInfo;

/* Appends the tokenizer.* keys for a model of V ids to w (before
 * gguf_begin_data).  Refuses, with one line in err naming the file and the
 * field, a tokenizer tandem cannot load, one llama.cpp cannot express, or
 * one with more ids than V.  Returns 0 (info filled, may be NULL) or -1;
 * on -1 nothing was added to w. */
int gguf_vocab_write(GgufWriter *w, const GgufTokFiles *f, int32_t V, GgufVocabInfo *info, char *err,
                     size_t err_len);

#endif
