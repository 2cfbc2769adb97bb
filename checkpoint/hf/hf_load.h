/* checkpoint/hf/hf_load.h - a Hugging Face model directory used as a
 * checkpoint: its config, a direct load of this rank's slices into a
 * Model, and `tandem ckpt import` (HF directory -> tandem checkpoint).
 * ckpt_read_config / ckpt_load / ckpt_resolve (checkpoint/ckpt.h) call
 * these when given such a directory, so every command that opens a
 * checkpoint takes one too.
 */
#ifndef TANDEM_CHECKPOINT_HF_HF_LOAD_H
#define TANDEM_CHECKPOINT_HF_HF_LOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "checkpoint/ckpt.h"
#include "core/model/model.h"

/* The tandem config of dir's config.json, and (meta may be NULL) what a
 * tandem checkpoint's metadata would say: step 0, one process, the weight
 * dtype of config.json's torch_dtype.  Any process.  0, or -1 with one
 * line in err. */
int hf_read_config(const char *dir, ModelConfig *cfg, CkptMeta *meta, char *err, size_t err_len);

/* Reads this rank's slice of every parameter of m (model_init'ed with
 * dir's config and the target topology) from dir, after validating the
 * whole directory (hf_map.h): for a stack of per-expert tensors only this
 * rank's experts' files are touched.  No collectives: under MPI the caller
 * agrees on the outcome.  Notes (ignored keys, skipped tensors) are printed
 * once, by rank 0.  Returns 0, or -1 with one line in err (m's weights are
 * then unspecified: the caller zeroes them). */
int hf_load(const char *dir, Model *m, char *err, size_t err_len);

/* What an import did. */
typedef struct {
    size_t bytes_read;     /* tensor bytes of the HF files */
    size_t largest;        /* bytes of the largest tandem tensor as stored */
    double seconds;
    CkptDtype dtype;       /* storage of the matrices */
    const char *layout;    /* "v4" or "v5" */
    char architecture[64];
    int n_tensors;
    bool tokenizer;        /* tokenizer.json was carried */
} HfImportReport;

/* `tandem ckpt import DIR OUT.h5 [--dtype]`: a weights-only tandem
 * checkpoint of dir, written one tensor at a time (peak memory: about the
 * largest tensor).  dtype NULL: the HF matrices' own 16-bit type when they
 * all have one, else float32.  Besides the weights and config it records
 * the tokenizer files and, for `ckpt export --format hf`, the root
 * attributes hf_architecture, hf_layout, hf_config (the config.json text)
 * and on each dataset hf_dtype (its HF dtype).  One process.  Returns 0
 * and fills *rep (may be NULL), or -1 with one line in err (nothing is
 * left at out). */
int hf_import(const char *dir, const char *out, const CkptDtype *dtype, HfImportReport *rep, char *err,
              size_t err_len);

#endif
