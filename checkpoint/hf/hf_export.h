/* checkpoint/hf/hf_export.h - `tandem ckpt export IN OUT_DIR --format hf`:
 * a tandem checkpoint as a Hugging Face model directory (SPEC section 9):
 * config.json, the weights as safetensors under their HF names (sharded,
 * with model.safetensors.index.json), and the tokenizer files.
 *
 * The family and layout are those the checkpoint was imported from (its
 * hf_architecture / hf_layout attributes), else the first family that
 * expresses the config exactly (hf_config_family_of) in the v4 layout;
 * config.json is the imported text when the config is unchanged, else
 * written from the family's table.  Each tensor gets the HF dtype it was
 * imported with (dataset attribute hf_dtype), else the checkpoint's weight
 * dtype; --dtype overrides both.  So HF -> tandem -> HF gives every tensor
 * back bit for bit, in its dtype and layout.
 *
 * Streams: one HF tensor (and the tandem tensor it comes from) in memory
 * at a time.  Files are written under temporary names and renamed.
 */
#ifndef TANDEM_CHECKPOINT_HF_HF_EXPORT_H
#define TANDEM_CHECKPOINT_HF_HF_EXPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "checkpoint/ckpt.h"

typedef struct {
    const CkptDtype *dtype;   /* NULL: per tensor, as imported (else the checkpoint's) */
    size_t shard_bytes;       /* 0: 2 GiB; a tensor larger than a shard gets one of its own */
    int layout;               /* 0: as imported, else v4; or HF_V4 / HF_V5 */
} HfExportOpts;

typedef struct {
    char architecture[64];
    const char *layout;       /* "v4" / "v5" */
    int n_files;              /* safetensors files */
    int n_tensors;
    size_t bytes;             /* tensor bytes written */
    bool original_config;     /* config.json is the imported text */
    bool tokenizer;
    char note[512];           /* what the export could not carry, "" when nothing */
} HfExportReport;

/* Writes out_dir (created when missing; refused when it already holds a
 * config.json or safetensors).  ckpt: a tandem checkpoint file.  One
 * process.  Returns 0 and fills *rep (may be NULL), or -1 with one line in
 * err. */
int hf_export(const char *ckpt, const char *out_dir, const HfExportOpts *o, HfExportReport *rep, char *err,
              size_t err_len);

#endif
