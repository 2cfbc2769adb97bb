/* tests/fuzz/fuzz_hf_config.c - libFuzzer harness for the mapping of a
 * Hugging Face config.json onto a tandem model config
 * (checkpoint/hf/hf_config.h): the file comes with a downloaded model and
 * is untrusted.
 *
 * Input: the text of a config.json.  Parses and maps it; when it maps,
 * writes it back for its family (v4 and v5 layouts) and maps that again,
 * which must give the same model.  Any outcome is fine except a crash, a
 * sanitizer report, a leak, a refusal without a message, or a round trip
 * that fails or changes the model.
 *   make fuzz-hf_config FUZZ_TIME=60 */
#include "checkpoint/hf/hf_config.h"
#include "core/common.h"
#include "core/model/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    if (strlen(text) != size) {   /* a NUL inside: not a text file */
        free(text);
        return 0;
    }
    HfConfig c;
    char err[1024];
    err[0] = 0;
    td_quiet = 1;
    if (hf_config_parse(&c, text, "config.json", err, sizeof err)) {
        if (!err[0]) abort();
        free(text);
        return 0;
    }
    for (int lay = 0; lay < 2; lay++) {
        char *back = hf_config_write(c.fam, &c.cfg, lay ? HF_V5 : HF_V4, "float32", NULL, err, sizeof err);
        if (!back) continue;   /* a model its family cannot write (refused with a message) */
        HfConfig d;
        if (hf_config_parse(&d, back, "written", err, sizeof err)) abort();
        char why[256];
        if (d.fam != c.fam || !hf_config_same_math(&c.cfg, &d.cfg, why, sizeof why)) abort();
        hf_config_free(&d);
        td_free(back);
    }
    hf_config_free(&c);
    free(text);
    return 0;
}
