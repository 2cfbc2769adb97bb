/* checkpoint/ckpt.h - HDF5 checkpoints (SPEC section 4; the on-disk format
 * is documented field by field in docs/checkpoint.md).
 *
 * A checkpoint stores every tensor as the global, unsharded logical tensor
 * (PyTorch nn.Linear layout, row-major), whatever topology wrote it:
 *
 *   /                         attrs format, format_version, config, step, tokens_seen
 *   /topology                 attrs world_size dp tp pp ep stage_layers
 *   /model/..., /lm_head      weights, attr partition (+ dtype="bfloat16")
 *   /optimizer                attrs beta1 beta2 eps weight_decay step lr
 *   /optimizer/exp_avg/<weight path>, /optimizer/exp_avg_sq/<weight path>
 *   /trainer                  attrs step tokens_seen micro_batches lr [run_config]
 *   /trainer/data_rng [4] u64, /trainer/rank_rng [world, 4] u64
 *   /tokenizer/tokenizer.json, tokenizer_config.json, generation_config.json
 *                             [n] uint8: the files' bytes, when the model has them
 *
 * Saving: every rank of the job writes only its own slice of each tensor
 * through parallel HDF5 (MPI-IO, collective transfers); one rank per
 * element writes replicated data; nobody gathers the model.  Datasets are
 * chunked along the saving topology's shards and carry the Fletcher32
 * filter.  The file is written as PATH.tmp, flushed, fsync'ed and renamed.
 *
 * Loading: every rank reads only the hyperslab its Params own under the
 * *target* topology (Param.loff / Param.lshape), so resharding is a load.
 * Everything is validated (format, version, config, every dataset's
 * presence, shape and dtype) before any byte reaches the caller's model;
 * a checksum or I/O failure during the data pass zeroes what was loaded.
 * 16-bit checkpoints (bf16 / f16) are upcast to float32 on load into this
 * float32 (training-layout) model; int8-quantized ones are refused here.
 * The serving commands load into serving models in their dtype instead
 * (checkpoint/ckpt_serve.h).
 *
 * MPI.  A model whose topology spans several ranks (m->topo.world > 1) is
 * saved and loaded by every rank of the job together (collective calls, in
 * the same order; the status is agreed, so every rank returns the same
 * code).  A single-rank model (world == 1) uses the POSIX driver and may be
 * saved or loaded by any one process alone.
 *
 * Threads.  Bulk data moves on the thread pool (core/pool.h): call these
 * functions from the main thread, outside pool regions, one at a time.
 * HDF5 is called by one thread at a time, never concurrently: the calling
 * thread, except during a single-process save, where a writer thread
 * stores one batch of finished chunks (H5Dwrite_chunk) while the calling
 * thread only prepares the next batch on the pool, and is joined before
 * the calling thread calls HDF5 again (ckpt_io.c); the pool threads of a
 * load only pread.  The serialisation is what makes this correct: Debian's
 * parallel HDF5 (1.10) is built without thread-safety (libhdf5.settings:
 * "Threadsafety: no"), and MPI is never called off the main thread (the
 * chunk path is the POSIX driver's only).
 */
#ifndef TANDEM_CHECKPOINT_CKPT_H
#define TANDEM_CHECKPOINT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/config.h"
#include "core/model/model.h"
#include "core/model/topology.h"

#define CKPT_FORMAT "tandem-checkpoint"
#define CKPT_FORMAT_VERSION 1
#define CKPT_NAME_MAX 160   /* dataset path, e.g. "optimizer/exp_avg/model/layers/3/mlp/experts/down_proj" */

/* Storage type of the weight matrices (tensors with ndim >= 2).  1-D norms
 * and the optimizer moments are always float32. */
typedef enum { CKPT_F32, CKPT_BF16, CKPT_F16 } CkptDtype;

/* The tokenizer files of a model (SPEC section 10), as bytes: stored in a
 * checkpoint under /tokenizer, read from a Hugging Face directory.  Each
 * text is NUL-terminated after its len bytes (so it can be parsed as a
 * string) but may hold any bytes; NULL when absent. */
typedef struct {
    char *tokenizer_json;    size_t tokenizer_json_len;     /* NULL when absent */
    char *tokenizer_config;  size_t tokenizer_config_len;   /* NULL when absent */
    char *generation_config; size_t generation_config_len; /* NULL when absent */
} CkptTokFiles;

/* Optimizer and trainer state beside the weights.
 * On save the pointers are borrowed.  On load rank_rng and run_config are
 * allocated (td_malloc) and released by ckpt_state_free. */
typedef struct {
    int64_t step;            /* optimizer steps done */
    int64_t tokens_seen;
    int64_t micro_batches;   /* data cursor: micro-batches consumed (SPEC section 8) */
    uint64_t data_rng[4];    /* data-order RNG (xoshiro256** state, core/rng.h) */
    /* Per-rank RNG states, rows of /trainer/rank_rng [world, 4].  Save:
     * n_rank_rng == 1 means "this rank's own state" (row = world rank, each
     * rank passes its own); n_rank_rng == world means the whole table,
     * identical on every rank; 0 / NULL writes zeros.  Load: the saved table
     * (n_rank_rng = saved world size). */
    int n_rank_rng;
    uint64_t (*rank_rng)[4];
    double lr;               /* learning rate of the last step (schedule position: step) */
    double beta1, beta2, adam_eps, weight_decay;
    int64_t adam_step;       /* AdamW bias-correction step */
    char *run_config;        /* JSON text of the run config, may be NULL */
    bool has_trainer;        /* load: the file had /trainer and /optimizer */
    /* Tokenizer files.  Save (ckpt_save, ckpt_export): borrowed; the
     * /tokenizer group holds a dataset for each file present (normally
     * tokenizer.json and the others; a generation_config.json alone is kept
     * too, so that HF round trips of models without a tokenizer keep it),
     * none when all are NULL; in a parallel save rank 0's files are
     * written, by rank 0.  Load: owned copies, filled when the file has
     * /tokenizer (all NULL otherwise). */
    CkptTokFiles tok;
} CkptState;

/* Releases what ckpt_load allocated in st (tok included); safe on a zeroed
 * struct and twice. */
void ckpt_state_free(CkptState *st);

/* Reads the tokenizer files of a checkpoint (a file, or a run directory:
 * its latest; any other directory, a Hugging Face model directory or one
 * holding only tokenizer files, is read as ckpt_tok_files_from_dir does)
 * into *out (owned; ckpt_tok_files_free).
 * One process.  Returns 0, with every member NULL when the checkpoint has
 * none; or -1 with one line in err (unreadable file, a /tokenizer dataset
 * of the wrong type, a checksum mismatch). */
int ckpt_read_tok_files(const char *ckpt_path, CkptTokFiles *out, char *err, size_t n);
/* Reads hf_dir/tokenizer.json, tokenizer_config.json and
 * generation_config.json, those that exist, into *out (owned).  An empty
 * file counts as absent.  Returns 0 (all NULL when there are none), or -1
 * with one line in err when one exists but cannot be read. */
int ckpt_tok_files_from_dir(const char *hf_dir, CkptTokFiles *out, char *err, size_t n);
/* Frees and zeroes; safe on a zeroed struct and twice. */
void ckpt_tok_files_free(CkptTokFiles *t);

/* What a checkpoint says about itself (root, /topology, which groups). */
typedef struct {
    int format_version;
    int64_t step, tokens_seen;
    int world, dp, tp, pp, ep;  /* topology that saved it */
    int cp;                     /* its context parallelism (1 when /topology has no cp) */
    CkptDtype dtype;            /* of the weight matrices */
    bool has_optimizer, has_trainer;
} CkptMeta;

/* ---------------------------------------------------------------- saving */

/* Saves model m (this rank's slices), optionally the AdamW moments and the
 * trainer state, to `path`.
 *   exp_avg, exp_avg_sq: slabs laid out exactly like m->w (same
 *     Param.offset), or both NULL for a weights-only checkpoint (no
 *     /optimizer, no /trainer).
 *   st: may be NULL (step = tokens_seen = 0).  /optimizer and /trainer are
 *     written only together with the moments.
 *   dtype: storage type of the weight matrices.
 * Every rank of m->topo calls (collective when m->topo.world > 1; then
 * m->topo.world must equal comm_size()).  Writes path.tmp, flushes, fsyncs,
 * renames to path and fsyncs the directory.  Returns 0, or a negative code
 * after printing one line (td_error) naming the file and dataset; every
 * rank returns the same code.  Borrows everything; not thread-safe. */
int ckpt_save(const char *path, const Model *m, const float *exp_avg, const float *exp_avg_sq,
              const CkptState *st, CkptDtype dtype);

/* Like ckpt_save, for a single-process model holding whole tensors
 * (m->topo.world == 1), recording topology `as` instead: /topology, the
 * partition attributes and the chunking are those a job of `as` would
 * write.  as == NULL means m->topo.  Used by `tandem ckpt reshard|export`.
 * Called by one process. */
int ckpt_export(const char *path, const Model *m, const float *exp_avg, const float *exp_avg_sq,
                const CkptState *st, CkptDtype dtype, const Topology *as);

/* Streaming, single-process writes of a weights-only checkpoint, one
 * tensor at a time, so that a writer holds one tensor in memory, not the
 * model (`tandem ckpt import`).  The file is what ckpt_export writes for a
 * one-process topology: the same plan (every tensor of cfg, in model
 * order, chunked and tagged as a one-process save), root attributes with
 * step 0, /topology, and the tokenizer files (tok may be NULL; borrowed).
 * ckpt_stream_open creates PATH.tmp; ckpt_stream_put writes one tensor of
 * the plan (each exactly once, any order) from data: float32 (the whole
 * tensor, row-major), or with raw set the 16-bit values of the storage
 * type, which must then be dtype (matrices only: 1-D tensors are always
 * float32); attr_key (may be NULL) adds a string attribute to its dataset.
 * ckpt_stream_root_attr adds a string attribute to the root.
 * ckpt_stream_close(commit) checks that every tensor was written, flushes,
 * fsyncs and renames to PATH; without commit (or on failure) it deletes
 * PATH.tmp.  It frees s either way (NULL is fine).  Each returns 0 or -1
 * with one line in err. */
typedef struct CkptStream CkptStream;
int ckpt_stream_open(CkptStream **out, const char *path, const ModelConfig *cfg, const CkptTokFiles *tok, char *err,
                     size_t err_len);
/* Tensors of the plan and, for i < count, the name (borrowed), rank and
 * global shape of the i-th. */
int ckpt_stream_count(const CkptStream *s);
const char *ckpt_stream_tensor(const CkptStream *s, int i, int *ndim, size_t *shape);
int ckpt_stream_put(CkptStream *s, const char *name, const void *data, bool raw, CkptDtype dtype,
                    const char *attr_key, const char *attr_val, char *err, size_t err_len);
int ckpt_stream_root_attr(CkptStream *s, const char *key, const char *value, char *err, size_t err_len);
int ckpt_stream_close(CkptStream *s, bool commit, char *err, size_t err_len);

/* ---------------------------------------------------------------- loading */

/* Hugging Face model directories (config.json + safetensors, SPEC section
 * 9) are accepted wherever a checkpoint is read: ckpt_resolve returns the
 * directory itself, ckpt_read_config maps its config.json (meta: step 0,
 * one process, the dtype of its torch_dtype), ckpt_load reads each rank's
 * slices straight from the safetensors and the tokenizer files into
 * st->tok (no optimizer state: moments must be NULL).  The mapping, its
 * refusals and its messages: checkpoint/hf/, docs/import.md. */
bool ckpt_is_hf_dir(const char *path);

/* Opens path, checks format and format_version, parses the config
 * attribute into *cfg and fills *meta (may be NULL).  Any process may
 * call.  Returns 0, or -1 with one line in err naming the file and the
 * attribute. */
int ckpt_read_config(const char *path, ModelConfig *cfg, CkptMeta *meta, char *err, size_t err_len);

/* Loads this rank's slices into m, which is model_init'ed with the file's
 * config (ckpt_read_config) and the target topology; the caller then calls
 * model_pack.  exp_avg / exp_avg_sq (laid out like m->w) may both be NULL
 * (serving, init_from); when given, the file must hold /optimizer.  st may
 * be NULL; when given it is overwritten (free a previous load's with
 * ckpt_state_free first) with step and tokens_seen, and the whole trainer
 * state when the file has it (st->has_trainer).
 * Validates everything first (format, version, config equal to m->cfg,
 * each dataset's presence, shape and dtype); then reads.  On failure
 * returns -1 with one line in err ("<file>: dataset /x: ..."): nothing was
 * written into m if the metadata was wrong; after a failed data read
 * (checksum, I/O) the weights and moments are zeroed, never partial.
 * When m->topo.world > 1 every rank of the job calls and all return the
 * same status (err holds the first failing rank's message). */
int ckpt_load(const char *path, Model *m, float *exp_avg, float *exp_avg_sq, CkptState *st,
              char *err, size_t err_len);

/* Reads every dataset of the checkpoint in full (checksums), and checks the
 * structure against the config as ckpt_load does.  One process.  Returns 0,
 * or -1 with one line in err. */
int ckpt_verify(const char *path, char *err, size_t err_len);

/* ---------------------------------------------------------------- inspecting */

typedef struct {
    char name[CKPT_NAME_MAX];  /* without the leading '/' */
    int ndim;
    size_t shape[PARAM_MAX_DIMS + 1];
    size_t chunk[PARAM_MAX_DIMS + 1];
    char dtype[16];            /* "float32", "float16", "bfloat16", "uint64", ... */
    char partition[64];        /* "" when the dataset has none */
    size_t numel;
    size_t bytes;              /* numel * element size */
    size_t stored_bytes;       /* on disk (chunks + checksums) */
} CkptTensor;

typedef struct {
    ModelConfig cfg;
    char *config_json;         /* the config attribute as stored (owned) */
    CkptMeta meta;
    CkptState st;              /* optimizer / trainer attributes when present (owned parts) */
    CkptTensor *tensors;       /* owned; weights in model order, then moments, then trainer */
    int n_tensors;
    size_t file_bytes;
} CkptInfo;

/* Lists every dataset of a checkpoint with its attributes.  One process.
 * Returns 0 or -1 with one line in err.  ckpt_info_free releases *info
 * (safe on a zeroed struct and twice). */
int ckpt_info(const char *path, CkptInfo *info, char *err, size_t err_len);
void ckpt_info_free(CkptInfo *info);

/* Reads the whole dataset `name` (no leading '/') of a float type (float32,
 * float16, bfloat16) as float32, or an int8 g32 one dequantized (q * s,
 * with name.scale: checkpoint/ckpt_q8.h): returns a td_malloc'd array of
 * *numel elements, or NULL with one line in err.  One process. */
float *ckpt_read_tensor(const char *path, const char *name, size_t *numel, char *err, size_t err_len);

/* ---------------------------------------------------------------- run directories
 * Plain filesystem operations: call them from one process (rank 0). */

/* Points DIR/latest at file_name (a name inside dir): a relative symlink
 * made under a temporary name and rename()d over DIR/latest, then the
 * directory is fsync'ed.  Readers see the old or the new target, never a
 * missing or partial one.  Returns 0 or negative after one td_error line. */
int ckpt_set_latest(const char *dir, const char *file_name);

/* DIR -> the file DIR/latest points at ("DIR/step_00000010.h5"); a file ->
 * itself; a Hugging Face model directory (without latest) -> itself.  Returns 0, or -1 after one td_error line (no latest, missing). */
int ckpt_resolve(const char *dir_or_file, char *out, size_t out_len);

/* Deletes step_*.h5 files of dir beyond the newest keep_last (by step
 * number), never the one latest points at, and what killed saves left
 * behind (step_*.h5.tmp, .latest.tmp.*).
 * keep_last <= 0 keeps everything.  Returns the number deleted, or
 * negative after one td_error line. */
int ckpt_prune(const char *dir, int keep_last);

/* ---------------------------------------------------------------- storage types */

/* (The conversions themselves are core/dtype.h.) */
const char *ckpt_dtype_name(CkptDtype t);   /* "float32", "bfloat16", "float16" */
/* "f32" / "float32", "bf16" / "bfloat16", "f16" / "float16" -> *t; -1 otherwise. */
int ckpt_dtype_parse(const char *s, CkptDtype *t);

#endif
