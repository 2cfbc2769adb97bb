/* checkpoint/ckpt_model.h - open a checkpoint as a ready model (config read,
 * topology checked, weights loaded and packed), and small HDF5 outputs of
 * the command layer (`tandem score`). */
#ifndef TANDEM_CHECKPOINT_CKPT_MODEL_H
#define TANDEM_CHECKPOINT_CKPT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckpt.h"
#include "core/model/model.h"

/* path: a checkpoint file or a run directory (its latest).  topo: the
 * layout to load under, NULL for a single process (it is initialised from
 * the checkpoint's config).  Returns 0, or -1 with one line in err (empty
 * when the line was already printed). */
int ckpt_model_open(const char *path, Model *m, Topology *topo, bool with_grads, size_t kv_block,
                    char *err, size_t err_len);

/* The tokenizer of a checkpoint or a Hugging Face model directory, for
 * the commands that read or write text: a tandem checkpoint's /tokenizer
 * (ckpt_read_tok_files; a run directory means its latest), an HF
 * directory's tokenizer.json + tokenizer_config.json (tok_load_dir), or
 * the built-in byte-level tokenizer when there is none.  One process.
 * Returns 0 and *out (free with tok_free), or -1 with one line in err
 * (unreadable checkpoint, a tokenizer.json tandem cannot load). */
struct Tokenizer;
int ckpt_open_tokenizer(const char *ckpt_or_hf_dir, struct Tokenizer **out, char *err, size_t err_len);

/* A --tokenizer (or tokenizer=) argument: a Hugging Face directory, which
 * must hold tokenizer.json (tok_load_dir, its messages), or a tandem
 * checkpoint or run directory (ckpt_open_tokenizer: the byte-level
 * tokenizer when it holds none).  0 and *out (tok_free), or -1 with one
 * line in err. */
int ckpt_open_tokenizer_arg(const char *path, struct Tokenizer **out, char *err, size_t err_len);

/* What the commands that turn a model's output into text need: its
 * tokenizer (ckpt_open_tokenizer) and the ids that end a generation,
 * tok_stop_ids plus generation_config.json's eos_token_id (an id or a list
 * of ids) when the model holds that file; and the files themselves, for a
 * run to store in the checkpoints it writes (CkptState.tok). */
typedef struct {
    struct Tokenizer *tok;   /* owned */
    int32_t *stop_ids;       /* owned (n_stop_ids), ascending, no duplicates */
    size_t n_stop_ids;
    CkptTokFiles files;      /* owned; all NULL when the model holds no tokenizer (tok is byte-level) */
} CkptText;

/* path: a tandem checkpoint, a run directory or an HF directory.
 * required: the path must hold tokenizer files (a tokenizer= run key);
 * else a model without them gets the byte-level tokenizer.  0, or -1 with
 * one line in err (as ckpt_open_tokenizer; a generation_config.json that
 * is not JSON or whose eos_token_id is not an id or a list of ids in the
 * vocabulary is an error naming the field). */
int ckpt_open_text(const char *path, bool required, CkptText *out, char *err, size_t err_len);
/* Safe on a zeroed struct and twice. */
void ckpt_text_free(CkptText *t);

/* Writes OUT.h5 with dataset name [rows, cols] float32 and a double
 * attribute on the root (attr may be NULL).  Written to a temporary name
 * and renamed.  Returns 0 or -1 with one line in err. */
int h5_write_matrix(const char *path, const char *name, const float *data, size_t rows, size_t cols,
                    const char *attr, double attr_value, char *err, size_t err_len);

#endif
