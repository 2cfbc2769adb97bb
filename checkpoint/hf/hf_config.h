/* checkpoint/hf/hf_config.h - a Hugging Face config.json as a tandem model
 * config, and back (SPEC section 9; the key tables are families.c, the
 * rules and messages docs/import.md).
 *
 * Reading: architectures[0] names the family (any other architecture is
 * refused by name); each key of the family's table is copied, ignored, or
 * handled by its rule, which refuses the settings that change the math in
 * ways tandem does not compute (naming the key and its value); keys the
 * family's modeling code never reads are ignored and listed in a note
 * (transformers ignores them too); the family's constants are added; the
 * result goes through the tandem config parser and its checks.  Nothing
 * here touches the weights.
 *
 * Writing: the family's table read backwards, in transformers' own format
 * (sorted keys, indent 2), for a layout.  A tandem config goes to the first
 * family that expresses it exactly (the config written and read back gives
 * the same parameters and the same math), else it is refused naming what
 * each family would change.
 */
#ifndef TANDEM_CHECKPOINT_HF_HF_CONFIG_H
#define TANDEM_CHECKPOINT_HF_HF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "checkpoint/hf/families.h"
#include "core/model/config.h"

#define HF_CONFIG_NAME "config.json"

typedef struct {
    const HfFamily *fam;
    ModelConfig cfg;
    char *text;            /* config.json as read (owned, NUL-terminated) */
    char dtype[24];        /* its torch_dtype / dtype ("bfloat16" ...), "" when absent */
    char notes[1024];      /* "ignored keys: a, b; attention_dropout 0.1 is not applied", "" when none */
    int fp8_block[2];      /* quantization_config fp8: weight_block_size (rows, columns); 0, 0 when none */
} HfConfig;

/* Whether path is a Hugging Face model directory: a directory holding
 * config.json and model.safetensors or model.safetensors.index.json. */
bool hf_is_dir(const char *path);

/* Reads and maps dir/config.json.  Returns 0, or -1 with one line in err
 * ("DIR/config.json: ..."), c zeroed.  hf_config_free releases c (safe on
 * a zeroed struct and twice). */
int hf_config_read(HfConfig *c, const char *dir, char *err, size_t err_len);
/* The same from text (copied); label names it in messages. */
int hf_config_parse(HfConfig *c, const char *text, const char *label, char *err, size_t err_len);
void hf_config_free(HfConfig *c);

/* config.json for cfg as family fam writes it in `layout` (one of HF_V4,
 * HF_V5), with torch_dtype/dtype = dtype_name ("float32", "bfloat16",
 * "float16") and bos/eos/pad_token_id from gen_json (a
 * generation_config.json text, may be NULL).  td_malloc'd text, or NULL
 * with one line in err (a layout the family does not have). */
char *hf_config_write(const HfFamily *fam, const ModelConfig *cfg, HfLayout layout, const char *dtype_name,
                      const char *gen_json, char *err, size_t err_len);

/* text (a config.json) with its torch_dtype / dtype key (whichever it
 * has; for a config with neither, the one of `layout`) set to dtype_name
 * and without quantization_config (what is written is dtype_name, never
 * FP8), reprinted as transformers prints configs.  td_malloc'd, or NULL when
 * text is not a JSON object. */
char *hf_config_set_dtype(const char *text, HfLayout layout, const char *dtype_name);

/* json.dumps(v, indent=2, sort_keys=True) of a cJSON value (passed as
 * void * so that callers need not include cJSON), with a newline: what
 * transformers writes.  td_malloc'd. */
char *hf_json_dump(const void *cjson);

/* The first family (hf_families order) whose config.json expresses cfg
 * exactly; NULL with one line in err naming, per family, the first thing
 * it cannot express.  Training-loss coefficients it cannot carry
 * (router_z_loss_coef) go into note (may be NULL; "" when none). */
const HfFamily *hf_config_family_of(const ModelConfig *cfg, char *note, size_t note_len, char *err,
                                    size_t err_len);

/* Whether a and b are the same model for export: the same parameters
 * (names and shapes) and the same math (rope_theta, rms_norm_eps,
 * norm_topk_prob, clip_qkv, ...).  When not, the first difference in why. */
bool hf_config_same_math(const ModelConfig *a, const ModelConfig *b, char *why, size_t why_len);

#endif
