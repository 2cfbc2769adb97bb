/* tests/fuzz/fuzz_safetensors.c - libFuzzer harness for the safetensors
 * header parser and its validation (checkpoint/hf/safetensors.c).
 *
 * Each input is one whole file.  It is opened from an exact-size heap copy
 * (so AddressSanitizer sees any read past its end); when it is accepted,
 * every tensor is read whole (raw bytes and, when the dtype converts,
 * float32) and as a box, so an accepted file whose offsets lied would show
 * up as an out-of-bounds read.  A refusal must be one non-empty line.
 *
 *   make fuzz-safetensors [FUZZ_TIME=120]     (corpus: tests/fuzz/corpus/safetensors)
 */
#include "checkpoint/hf/safetensors.h"
#include "core/common.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, data, size);
    StCheckpoint st;
    char err[512] = "";
    if (st_open_buffer(&st, buf, size, "fuzz.safetensors", err, sizeof err) != 0) {
        if (!err[0] || strchr(err, '\n')) abort();   /* a refusal is one line */
        st_close(&st);
        free(buf);
        return 0;
    }
    for (size_t i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        if (st_find(&st, t->name) != t) abort();
        if (t->nbytes > (64u << 20)) continue;           /* the input bounds it; keep runs fast */
        void *copy;
        const unsigned char *b = st_tensor_bytes(t, &copy);
        volatile unsigned char sink = 0;
        for (size_t k = 0; k < t->nbytes; k++) sink ^= b[k];
        (void)sink;
        td_free(copy);
        uint64_t start[ST_MAX_DIMS], count[ST_MAX_DIMS], numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            start[d] = t->shape[d] / 2;
            count[d] = t->shape[d] - start[d];
            numel *= count[d];
        }
        unsigned char *raw = malloc(numel * st_dtype_size(t->dtype) + 1);
        if (st_read_slice_raw(t, start, count, raw, err, sizeof err) != 0) abort();
        free(raw);
        if (st_dtype_to_f32(t->dtype)) {
            float *y = malloc(t->numel * sizeof(float) + 1);
            if (st_read_f32(t, y, t->numel, err, sizeof err) != 0) abort();
            free(y);
        }
    }
    st_close(&st);
    free(buf);
    return 0;
}
