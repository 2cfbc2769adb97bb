/* checkpoint/gguf/gguf_export.h - a tandem checkpoint as a GGUF file that
 * llama.cpp loads (`tandem ckpt export IN OUT.gguf --format gguf`;
 * docs/gguf.md).
 *
 * Architectures are data: a table of llama.cpp architectures (llama,
 * qwen2moe, qwen3moe, olmoe) with what each one's graph computes (RoPE
 * pairing, top-k renormalisation, q/k norm kind, biases, gated shared
 * expert, free head_dim, ...).  The target is chosen from what the model
 * config expresses (qk_norm "head" -> qwen3moe, "full" -> olmoe, a shared
 * expert -> qwen2moe, otherwise Mixtral's llama) or named by the caller;
 * a config feature the target cannot express is refused by name before
 * anything is written.  Tensor names map by a table of tandem dataset ->
 * GGUF tensor; a dataset the table does not know is refused, never
 * dropped.
 *
 * Weights: matrices in the requested type (F32, F16, or Q8_0 - rows whose
 * length is not a multiple of 32 fall back to F16, as llama.cpp's
 * converter does); norms, biases, the router (ffn_gate_inp) and the
 * shared-expert gate stay F32.  Under llama's adjacent-pair RoPE the rows
 * of q and k (and their biases) are permuted from tandem's rotate-half
 * order.  Tensors stream from the checkpoint one at a time (peak memory
 * about one float32 tensor plus its converted copy).
 */
#ifndef TANDEM_CHECKPOINT_GGUF_GGUF_EXPORT_H
#define TANDEM_CHECKPOINT_GGUF_GGUF_EXPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "checkpoint/gguf/gguf.h"
#include "checkpoint/gguf/gguf_vocab.h"
#include "core/model/config.h"

/* Element type of the weight matrices. */
typedef enum { GGUF_OUT_F32, GGUF_OUT_F16, GGUF_OUT_Q8_0 } GgufOutType;

/* What one llama.cpp architecture's graph computes (src/models/<arch>.cpp
 * of the llama.cpp release the peer ships). */
typedef struct {
    const char *name;        /* general.architecture */
    bool rope_adjacent;      /* LLAMA_ROPE_TYPE_NORM: pairs (2i, 2i+1), so q/k rows are permuted */
    bool renorm_topk;        /* build_moe_ffn(norm_w): top-k weights divided by their sum */
    QkNorm qk_norm;          /* the q/k norm its graph applies (tensors required) */
    bool qkv_bias;           /* attn_{q,k,v}.bias honoured */
    bool o_bias;             /* attn_output.bias honoured */
    bool gated_shared;       /* a sigmoid-gated shared expert, required */
    bool free_head_dim;      /* attention.key_length / value_length honoured (head_dim != d / H) */
    bool k_norm_is_d;        /* attn_k_norm is n_embd wide: needs Hkv == H */
    bool output_optional;    /* output.weight may be absent (tied to token_embd) */
    bool expert_ff_key;      /* experts' width in expert_feed_forward_length (else feed_forward_length) */
} GgufArch;

typedef struct {
    GgufOutType dtype;
    const char *arch;        /* NULL: chosen from the config */
    GgufTokFiles tok;        /* tok.json NULL: byte-level vocabulary */
    const char *name;        /* general.name; NULL: "tandem" */
} GgufExportOpts;

typedef struct {
    const GgufArch *arch;
    const char *why;         /* what chose it */
    int n_tensors;
    int n_f16_fallback;      /* Q8_0 matrices written as F16 (row length % 32 != 0) */
    size_t data_bytes;
    GgufVocabInfo vocab;
} GgufExportReport;

/* The architecture for config c: `want` by name (NULL: chosen as above).
 * Returns 0 with *arch and *why (static strings), or -1 with one line in
 * err naming the feature the architecture cannot express. */
int gguf_arch_for(const ModelConfig *c, const char *want, const GgufArch **arch, const char **why, char *err,
                  size_t err_len);

/* Writes OUT (through OUT.tmp, renamed when complete) from the checkpoint
 * file IN.  Returns 0 (rep filled, may be NULL) or -1 with one line in err
 * naming the file, the tensor or the config key; OUT is then untouched.
 * One process; not thread-safe (HDF5). */
int gguf_export(const char *in, const char *out, const GgufExportOpts *o, GgufExportReport *rep, char *err,
                size_t err_len);

/* `tandem ckpt export IN OUT.gguf --format gguf ...`: argv as cmd_ckpt got
 * it (argv[1] = "export").  Returns the exit code (0, 1 failure, 2 usage). */
int gguf_export_cmd(int argc, char **argv);

#endif
