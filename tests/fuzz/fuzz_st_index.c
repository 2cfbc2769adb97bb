/* tests/fuzz/fuzz_st_index.c - libFuzzer harness for the sharded-index
 * side of the safetensors reader: each input is a
 * model.safetensors.index.json, opened against two fixed, valid shards
 * (a.safetensors: x F32 [2], y BF16 [3]; b.safetensors: z F16 [1]) in a
 * directory the harness makes once.  Accepted sets are read whole.
 *
 *   make fuzz-st_index [FUZZ_TIME=120]     (corpus: tests/fuzz/corpus/st_index)
 */
#include "checkpoint/hf/safetensors.h"
#include "core/common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64];

static void put(const char *name, const char *hdr, size_t data_len)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    uint64_t n = strlen(hdr);
    for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, f);
    fputs(hdr, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i * 37 & 0xff), f);
    fclose(f);
}

/* The directory goes when the fuzzer exits (libFuzzer exits through exit()). */
static void cleanup(void)
{
    static const char *const names[] = { "a.safetensors", "b.safetensors", ST_INDEX_NAME };
    char p[128];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/tandem_fuzz_index_%d", (int)getpid());
        mkdir(g_dir, 0755);
        atexit(cleanup);
        put("a.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                             "\"y\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}", 14);
        put("b.safetensors", "{\"z\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    }
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, ST_INDEX_NAME);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    StCheckpoint st;
    char err[512] = "";
    if (st_open(&st, g_dir, err, sizeof err) != 0) {
        if (!err[0] || strchr(err, '\n')) abort();
    } else {
        for (size_t i = 0; i < st.n_tensors; i++) {
            float y[4];
            if (st_read_f32(&st.tensors[i], y, st.tensors[i].numel, err, sizeof err) != 0) abort();
        }
    }
    st_close(&st);
    return 0;
}
