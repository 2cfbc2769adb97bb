/* core/tok/bpe.h - the BPE model of tokenizer.json (HF
 * tokenizers/src/models/bpe): vocab, merges (both spellings, "a b" and
 * ["a", "b"]), unk_token with fuse_unk, byte_fallback (<0xNN> tokens),
 * continuing_subword_prefix, end_of_word_suffix, ignore_merges.
 *
 * A word is split into chars (each looked up, else its <0xNN> bytes with
 * byte_fallback, else unk, else dropped, as HF does), then merged: the
 * pair of lowest merge rank first, the leftmost of equal ranks, with a
 * binary heap over a linked list of symbols (HF's Word::merge_all), so a
 * word of L chars costs O(L log L).  Words of up to 24 bytes and 9 ids
 * are cached per scratch (bounded 2-way tables, bpe.c).
 *
 * Splitting before '▁': a word without a pre-tokenizer (Llama 2, Mistral:
 * the whole text is one word) is cut before each '▁' (U+2581) that no merge
 * can join to the char before it, and each part is merged (and cached) on
 * its own.  That gives the same ids: merge_all only ever merges adjacent
 * symbols, and if no merge pairs a symbol ending in char p with one
 * starting with '▁' (checked over the merges at load: the left side of
 * every merge whose right side starts with '▁' must not end in p, and p
 * and '▁' must be tokens of their own, so neither falls back to bytes or
 * unk), no heap entry ever spans the cut; the entries of each part are
 * then popped in the same relative order as when the part is merged
 * alone, because the heap order (rank, position) is the same within a
 * part.  Enabled only without prefix/suffix and outside byte mode.
 *
 * Byte mode: when a ByteLevel pre-tokenizer is the last step, pieces stay
 * raw bytes (PIECE_BYTES) and byte b is looked up as the vocabulary's
 * ByteLevel char of b, which gives the same ids without rewriting the text.
 */
#ifndef TANDEM_CORE_TOK_BPE_H
#define TANDEM_CORE_TOK_BPE_H

#include "core/tok/tok_util.h"

typedef struct {
    StrMap vocab;              /* token -> id */
    uint32_t *id_off, *id_len; /* id -> its string in vocab.keys (len UINT32_MAX: no token) */
    int32_t n_ids;             /* 1 + the largest id */
    PairMap merges;
    int32_t unk;               /* -1: no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;     /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    int32_t fallback[256];     /* id of "<0xNN>", -1 when absent */
    /* byte mode */
    bool byte_ok;              /* no prefix/suffix: byte mode allowed */
    int32_t byte_id[256];      /* id of the ByteLevel char of each byte, -1 when absent */
    StrMap byte_vocab;         /* raw bytes of every token that is all ByteLevel chars -> id */
    /* splitting a word before '▁' (bpe_tokenize) */
    bool sep_split;            /* allowed at all (see bpe_load) */
    uint8_t sep_after[128];    /* ASCII char c: a split between c and '▁' is safe */
    uint32_t *sep_keep;        /* the last chars of merges' left sides whose right side starts with '▁' */
    size_t n_sep_keep;
} Bpe;

typedef struct BpeScratch BpeScratch;

/* Reads `model` (its type must be BPE).  0, or -1 with err naming the
 * field (a merge naming a token not in the vocab is refused, as HF does).
 * with_bytes: build the byte-mode tables. */
int bpe_load(Bpe *m, const cJSON *model, bool with_bytes, char *err, size_t n);
void bpe_free(Bpe *m);
/* id -> token string (NULL when the id has none). */
const char *bpe_id_str(const Bpe *m, int32_t id, size_t *len);

BpeScratch *bpe_scratch_new(void);
void bpe_scratch_free(BpeScratch *sc);
/* Appends the ids of word s[0..n) to out (n > 0).  bytes: s is raw bytes
 * standing for their ByteLevel chars (needs m->byte_ok). */
void bpe_tokenize(const Bpe *m, BpeScratch *sc, const char *s, size_t n, bool bytes, TokIds *out);

#endif
