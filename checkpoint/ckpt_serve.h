/* checkpoint/ckpt_serve.h - checkpoints into serving models (weights held
 * once, in their serving dtype), and quantized checkpoints (SPEC section
 * 11; the format is docs/checkpoint.md "Quantized checkpoints").
 *
 * Loading for serving never builds a float32 copy of the model: each
 * tensor is read (a few experts at a time for expert tensors) into a
 * temporary buffer and packed straight into the serving model's slab in
 * its dtype -- rounded to bf16 or quantized to int8 g32 on the way when the
 * file holds float32, packed as stored when the file holds that dtype
 * already (a quantized checkpoint is served without re-quantizing), or
 * dequantized when a float dtype is asked of an int8 file.  Quantizing at
 * load and `tandem ckpt quantize` run the same function
 * (dtype_q8_quantize_row), so they give the same bits.
 *
 * A quantized checkpoint is a tandem checkpoint (SPEC section 4) whose
 * matrices are stored as
 *     bf16   uint16 with dtype = "bfloat16" (as a bf16 export)
 *     int8   <name> int8 [.., K] with dtype = "int8_g32", group_size = 32,
 *            and <name>.scale float32 [.., ceil(K / 32)]
 * with the root attribute quantized = "bf16" | "int8"; vectors, the router
 * (mlp/gate) and shared_expert_gate stay float32.  It holds no optimizer.
 *
 * What is refused, with one line naming the dataset: a missing, wrong-shape
 * or non-float32 scale dataset; a group size other than 32; a scale that is
 * NaN, infinite or negative, or zero where the group's weights are not; an
 * int8 value of -128; a float tensor holding NaN or infinity; an int8
 * dataset without its dtype attribute.
 *
 * MPI.  Under tensor / expert parallelism each rank reads its own slices
 * (POSIX reads) and all ranks agree on the status (collective over the
 * world when m->topo.world > 1).  int8 under tensor parallelism needs each
 * rank's part of the input dimension to be whole groups of 32.
 */
#ifndef TANDEM_CHECKPOINT_CKPT_SERVE_H
#define TANDEM_CHECKPOINT_CKPT_SERVE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/model/model.h"

/* What a serving command asks for (--dtype, --kv-dtype). */
typedef struct {
    bool dtype_set;   /* false: serve what the checkpoint stores (int8, bf16; f16 and f32 as f32) */
    Dtype dtype;      /* --dtype */
    bool kv_set;      /* false: --kv-dtype auto (ckpt_serve_kv_auto) */
    Dtype kv;         /* --kv-dtype */
    bool expert_cache;            /* --expert-cache-mb given: routed experts offloaded */
    size_t expert_cache_bytes;    /* its budget */
} ServeDtypes;

/* Parses --dtype and --kv-dtype values (NULL: not given; --kv-dtype
 * "auto" is the same as not given).  0, or -1 with one line in err naming
 * the option. */
int ckpt_serve_dtypes(ServeDtypes *sd, const char *dtype, const char *kv_dtype, char *err, size_t err_len);

/* Parses --expert-cache-mb (NULL: not given, the experts resident) into
 * sd (after ckpt_serve_dtypes).  0, or -1 with one line in err. */
int ckpt_serve_expert_cache(ServeDtypes *sd, const char *mb, char *err, size_t err_len);

/* Opens path (a checkpoint file, or a run directory: its latest) as a
 * serving model: config read, the dtypes resolved (sd, the file's own),
 * model_init_serving under topo (NULL: one process), weights loaded, the
 * KV dtype set (m->attn.kv).  A path that is no tandem checkpoint (a
 * Hugging Face directory) goes through ckpt_model_open and is converted
 * (model_quantize_from).  With sd->expert_cache the model is
 * model_init_serving_offload'ed and given a cache of sd->expert_cache_bytes
 * whose loader reads each expert's slice from path when the forward needs
 * it (a tandem checkpoint: its datasets, the file kept open; an HF
 * directory: its safetensors through hf_map.h, and the other tensors read
 * straight into the serving model, no float32 model built); the bits are
 * the resident model's.  Returns 0, or -1 with one line in err (empty
 * when already printed). */
int ckpt_open_serving(const char *path, Model *m, const Topology *topo, const ServeDtypes *sd, char *err,
                      size_t err_len);

/* Loads the weights of file into serving model m (its config and dtypes
 * fixed): what ckpt_open_serving does after model_init_serving, for a
 * model that is already serving (rollout --follow).  Validates everything
 * first; after a failed data read the weights are zeroed, never partial.
 * An expert cache then reads file's experts (its old ones dropped).
 * Returns 0 or -1 with one line in err. */
int ckpt_load_serving(const char *file, Model *m, char *err, size_t err_len);

/* Per-tensor result of ckpt_quantize. */
typedef struct {
    char name[PARAM_NAME_MAX];
    Dtype dtype;          /* stored as */
    size_t numel;
    double rel_err;       /* ||W - deq(W)||_2 / ||W||_2 (0 for float32 and an all-zero W) */
    double max_abs_err;
} CkptQuantTensor;

/* How int8 matrices are rounded, when not to nearest: factor returns, for
 * matrix mat of tensor name (mat: the flat index over the dims before the
 * last two, 0 for a 2-D tensor; K its input dim), the factor U that
 * dtype_q8_quantize_row_gptq takes, or NULL to round that matrix to
 * nearest (train/quant/gptq.h builds one from calibration data). */
typedef struct {
    const float *(*factor)(void *ctx, const char *name, size_t mat, size_t K);
    void *ctx;
} CkptQuantRound;

/* Writes out (a temporary name, flushed and renamed) as the quantized
 * checkpoint of in (a float32, f16 or bf16 tandem checkpoint; a run
 * directory means its latest) with the dtypes dt (dt->mat the `quantized`
 * attribute), carrying config, step, tokens_seen and the tokenizer files.
 * Tensors are converted a slab at a time (no whole-model copy).  *rep gets
 * one entry per tensor (td_malloc'd, *n_rep entries; may be NULL).  round:
 * NULL, or the int8 rounding (above).  One process.  Returns 0 or -1 with
 * one line in err. */
int ckpt_quantize(const char *in, const char *out, const ModelDtypes *dt, const CkptQuantRound *round,
                  CkptQuantTensor **rep, int *n_rep, char *err, size_t err_len);

/* Whether the checkpoint at path (a file or a run directory) has routers
 * fitted by `ckpt quantize --fit-routers` (its root attribute router_fit),
 * and then the KV dtype they were fitted for in *kv.  false for anything
 * else (no such attribute, a Hugging Face directory, an unreadable file). */
bool ckpt_router_fit_kv(const char *path, Dtype *kv);

/* --kv-dtype auto for a model served as sd asks without a checkpoint
 * file (rl's rollout model, plan): bfloat16 when the weights are held in
 * low precision by choice (--dtype bf16 or int8), float32 otherwise.
 * ckpt_open_serving applies the same rule to a tandem file, where without
 * --dtype a file `ckpt quantize` wrote in bf16 or int8 (root attribute
 * quantized) counts as low precision by choice, and a file whose routers
 * were fitted gets the fit's KV dtype.  A training checkpoint or an
 * imported bf16 release served as stored keeps float32: its bf16 weights
 * are exact in float32, and so stays its attention.  bf16, not int8: int8
 * weights compute in float32 over the rounded weights as bf16 ones do, and
 * an int8 cache costs routing accuracy (docs/serving.md). */
Dtype ckpt_serve_kv_auto(const ServeDtypes *sd);

/* A float32 tensor to write: tandem's name (e.g.
 * "model/layers/0/mlp/gate") and its numel values. */
typedef struct {
    const char *name;
    const float *w;
    size_t numel;
} CkptF32;

/* Overwrites the n float32 tensors t[] of the checkpoint file path (each
 * numel must be its dataset's count) and then, when key is not NULL, sets
 * the root string attribute key = value, in one open of the file.  For a
 * file being made (`ckpt quantize --fit-routers` writes its routers before
 * the file is published).  One process.  Returns 0 or -1 with one line in
 * err (the first failure; nothing after it is written). */
int ckpt_overwrite_f32(const char *path, const CkptF32 *t, int n, const char *key, const char *value, char *err,
                       size_t err_len);

#endif
