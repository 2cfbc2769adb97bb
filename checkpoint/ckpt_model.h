/* checkpoint/ckpt_model.h - open a checkpoint as a ready model (config read,
 * topology checked, weights loaded and packed), and small HDF5 outputs of
 * the command layer (`tandem score`). */
#ifndef TANDEM_CHECKPOINT_CKPT_MODEL_H
#define TANDEM_CHECKPOINT_CKPT_MODEL_H

#include <stdbool.h>
#include <stddef.h>

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

/* Writes OUT.h5 with dataset name [rows, cols] float32 and a double
 * attribute on the root (attr may be NULL).  Written to a temporary name
 * and renamed.  Returns 0 or -1 with one line in err. */
int h5_write_matrix(const char *path, const char *name, const float *data, size_t rows, size_t cols,
                    const char *attr, double attr_value, char *err, size_t err_len);

#endif
