/* tests/test_gguf.c - the GGUF writer and the architecture table of
 * checkpoint/gguf/:
 *   - the byte layout of a small file against ggml's docs/gguf.md, worked
 *     out by hand here (header, each value type, an array of strings, the
 *     tensor infos with offsets, the zero padding to 32 bytes after the
 *     infos and after each tensor);
 *   - a file whose tensors were not all written is refused at close and
 *     leaves neither OUT nor OUT.tmp;
 *   - gguf_arch_for: the automatic choice and each refusal naming its key.
 * The whole export (tensors, tokenizer, llama.cpp) is tests/cli/gguf.sh.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/gguf/gguf.h"
#include "checkpoint/gguf/gguf_export.h"
#include "core/common.h"
#include "core/model/config.h"

static char g_path[256];

static void setup(void)
{
    snprintf(g_path, sizeof g_path, "/tmp/tandem_test_gguf_%d.gguf", (int)getpid());
    unlink(g_path);
}

static void teardown(void) { unlink(g_path); }

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    cr_assert(fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

/* A little-endian reader over the file bytes. */
typedef struct { const unsigned char *b; size_t o, n; } Rd;
static uint64_t rd(Rd *r, int bytes)
{
    cr_assert(r->o + (size_t)bytes <= r->n, "read past the end at %zu", r->o);
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->b[r->o + (size_t)i] << (8 * i);
    r->o += (size_t)bytes;
    return v;
}
static void rd_str(Rd *r, const char *want)
{
    uint64_t n = rd(r, 8);
    cr_assert_eq(n, strlen(want), "string length %llu, want \"%s\"", (unsigned long long)n, want);
    cr_assert(!memcmp(r->b + r->o, want, n), "string at %zu is not \"%s\"", r->o, want);
    r->o += n;
}

TestSuite(gguf, .init = setup, .fini = teardown);

Test(gguf, layout_matches_the_spec_byte_for_byte)
{
    GgufWriter *w;
    char err[256];
    cr_assert_eq(gguf_open(&w, g_path, err, sizeof err), 0, "%s", err);
    gguf_kv_str(w, "general.architecture", "llama", 5);
    gguf_kv_u32(w, "llama.block_count", 7);
    gguf_kv_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_kv_i32(w, "x.i32", -5);
    gguf_kv_array(w, "tokenizer.ggml.tokens", GGUF_STRING, 2);
    gguf_arr_str(w, "a", 1);
    gguf_arr_str(w, "bc", 2);
    gguf_kv_array(w, "tokenizer.ggml.token_type", GGUF_I32, 2);
    gguf_arr_i32(w, 1);
    gguf_arr_i32(w, 6);
    const uint64_t ne_a[2] = { 3, 2 }, ne_b[1] = { 32 };
    gguf_add_tensor(w, "a.weight", 2, ne_a, GGML_TYPE_F32);   /* 24 bytes -> padded to 32 */
    gguf_add_tensor(w, "b.weight", 1, ne_b, GGML_TYPE_Q8_0);  /* one block: 34 bytes */
    cr_assert_eq(gguf_begin_data(w, err, sizeof err), 0, "%s", err);
    float a[6] = { 1, 2, 3, 4, 5, 6 };
    cr_assert_eq(gguf_write_tensor(w, a, 8, err, sizeof err), 0);    /* in two pieces */
    cr_assert_eq(gguf_write_tensor(w, (const char *)a + 8, 16, err, sizeof err), 0);
    unsigned char q[34];
    for (int i = 0; i < 34; i++) q[i] = (unsigned char)(i + 1);
    cr_assert_eq(gguf_write_tensor(w, q, 34, err, sizeof err), 0);
    cr_assert_eq(gguf_close(w, err, sizeof err), 0, "%s", err);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
    cr_expect(access(tmp, F_OK) != 0, "the temporary file was renamed");

    size_t n;
    unsigned char *b = slurp(g_path, &n);
    Rd r = { b, 0, n };
    cr_expect_eq(rd(&r, 4), 0x46554747u, "magic GGUF");
    cr_expect_eq(rd(&r, 4), 3, "version 3");
    cr_expect_eq(rd(&r, 8), 2, "2 tensors");
    cr_expect_eq(rd(&r, 8), 7, "7 keys");
    rd_str(&r, "general.architecture");
    cr_expect_eq(rd(&r, 4), 8, "type STRING");
    rd_str(&r, "llama");
    rd_str(&r, "llama.block_count");
    cr_expect_eq(rd(&r, 4), 4, "type UINT32");
    cr_expect_eq(rd(&r, 4), 7);
    rd_str(&r, "llama.rope.freq_base");
    cr_expect_eq(rd(&r, 4), 6, "type FLOAT32");
    cr_expect_eq(rd(&r, 4), 0x461c4000u, "10000.0f");
    rd_str(&r, "tokenizer.ggml.add_bos_token");
    cr_expect_eq(rd(&r, 4), 7, "type BOOL");
    cr_expect_eq(rd(&r, 1), 1, "one byte");
    rd_str(&r, "x.i32");
    cr_expect_eq(rd(&r, 4), 5, "type INT32");
    cr_expect_eq((int32_t)rd(&r, 4), -5);
    rd_str(&r, "tokenizer.ggml.tokens");
    cr_expect_eq(rd(&r, 4), 9, "type ARRAY");
    cr_expect_eq(rd(&r, 4), 8, "of STRING");
    cr_expect_eq(rd(&r, 8), 2);
    rd_str(&r, "a");
    rd_str(&r, "bc");
    rd_str(&r, "tokenizer.ggml.token_type");
    cr_expect_eq(rd(&r, 4), 9);
    cr_expect_eq(rd(&r, 4), 5, "of INT32");
    cr_expect_eq(rd(&r, 8), 2);
    cr_expect_eq(rd(&r, 4), 1);
    cr_expect_eq(rd(&r, 4), 6);
    /* tensor infos: name, n_dims, ne (innermost first), type, offset */
    rd_str(&r, "a.weight");
    cr_expect_eq(rd(&r, 4), 2);
    cr_expect_eq(rd(&r, 8), 3);
    cr_expect_eq(rd(&r, 8), 2);
    cr_expect_eq(rd(&r, 4), 0, "F32");
    cr_expect_eq(rd(&r, 8), 0, "first offset 0");
    rd_str(&r, "b.weight");
    cr_expect_eq(rd(&r, 4), 1);
    cr_expect_eq(rd(&r, 8), 32);
    cr_expect_eq(rd(&r, 4), 8, "Q8_0");
    cr_expect_eq(rd(&r, 8), 32, "24 bytes padded to the 32-byte alignment");
    size_t data = (r.o + 31) / 32 * 32;
    for (size_t i = r.o; i < data; i++) cr_expect_eq(b[i], 0, "padding byte %zu after the infos", i);
    cr_expect(!memcmp(b + data, a, 24), "tensor a at the data section");
    for (size_t i = 24; i < 32; i++) cr_expect_eq(b[data + i], 0, "padding after tensor a");
    cr_expect(!memcmp(b + data + 32, q, 34), "tensor b at offset 32");
    cr_expect_eq(n, data + 32 + 64, "the file ends with b padded to 64 bytes (%zu)", n);
    for (size_t i = data + 32 + 34; i < n; i++) cr_expect_eq(b[i], 0, "padding after tensor b");
    free(b);
}

Test(gguf, incomplete_data_is_refused_and_nothing_is_left)
{
    GgufWriter *w;
    char err[256];
    cr_assert_eq(gguf_open(&w, g_path, err, sizeof err), 0, "%s", err);
    const uint64_t ne[1] = { 8 };
    gguf_add_tensor(w, "a", 1, ne, GGML_TYPE_F32);
    gguf_add_tensor(w, "b", 1, ne, GGML_TYPE_F16);
    cr_assert_eq(gguf_begin_data(w, err, sizeof err), 0, "%s", err);
    float x[8] = { 0 };
    cr_assert_eq(gguf_write_tensor(w, x, sizeof x, err, sizeof err), 0);
    cr_expect_eq(gguf_close(w, err, sizeof err), -1, "b was never written");
    cr_expect(strstr(err, "1 of 2 tensors written"), "message: %s", err);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_path);
    cr_expect(access(g_path, F_OK) != 0 && access(tmp, F_OK) != 0, "neither OUT nor OUT.tmp remains");
    cr_expect_eq(gguf_tensor_bytes(GGML_TYPE_Q8_0, 2, (const uint64_t[]){ 64, 3 }), 6 * 34);
    cr_expect_eq(gguf_tensor_bytes(GGML_TYPE_F16, 3, (const uint64_t[]){ 5, 3, 2 }), 60);
}

static ModelConfig cfg_of(const char *json)
{
    ModelConfig c;
    char err[256];
    cr_assert_eq(config_parse(&c, json, err, sizeof err), 0, "%s", err);
    return c;
}

#define BASE "\"vocab_size\": 256, \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2"

Test(gguf, arch_follows_the_config)
{
    const GgufArch *a;
    const char *why;
    char err[1024];
    struct { const char *json, *arch; } ok[] = {
        { "{" BASE "}", "llama" },
        { "{" BASE ", \"attention_bias\": true, \"head_dim\": 32}", "llama" },
        { "{" BASE ", \"qk_norm\": \"head\", \"qkv_bias\": true, \"head_dim\": 8}", "qwen3moe" },
        { "{" BASE ", \"num_key_value_heads\": 4, \"qk_norm\": \"full\", \"norm_topk_prob\": false}", "olmoe" },
        { "{" BASE ", \"shared_expert_intermediate_size\": 32, \"shared_expert_gate\": true, \"qkv_bias\": true,"
          " \"norm_topk_prob\": false}", "qwen2moe" },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ModelConfig c = cfg_of(ok[i].json);
        cr_expect_eq(gguf_arch_for(&c, NULL, &a, &why, err, sizeof err), 0, "%s: %s", ok[i].json, err);
        cr_expect_str_eq(a->name, ok[i].arch, "%s", ok[i].json);
    }
    ModelConfig c = cfg_of("{" BASE "}");
    cr_expect_eq(gguf_arch_for(&c, "llama", &a, &why, err, sizeof err), 0);
    cr_expect_str_eq(why, "--arch");
}

Test(gguf, arch_refuses_each_feature_by_key)
{
    const GgufArch *a;
    const char *why;
    char err[1024];
    struct { const char *json, *arch, *msg; } bad[] = {
        { "{" BASE ", \"first_k_dense_replace\": 1}", NULL, "dense layers (first_k_dense_replace 1" },
        { "{" BASE ", \"mlp_only_layers\": [0], \"num_hidden_layers\": 2}", NULL, "1 mlp_only_layers" },
        { "{" BASE ", \"norm_topk_prob\": false}", NULL, "norm_topk_prob=false: its graph always renormalises" },
        { "{" BASE ", \"clip_qkv\": 2}", NULL, "clip_qkv 2: its graph does not clamp" },
        { "{" BASE ", \"qk_norm\": \"head\", \"attention_bias\": true}", NULL, "attention_bias (the o_proj bias)" },
        { "{" BASE ", \"shared_expert_intermediate_size\": 32, \"norm_topk_prob\": false}", NULL,
          "shared_expert_gate=false" },
        { "{" BASE ", \"shared_expert_intermediate_size\": 32, \"shared_expert_gate\": true, \"norm_topk_prob\": false,"
          " \"head_dim\": 32}", NULL, "head_dim 32 != hidden_size / num_attention_heads = 16" },
        { "{" BASE ", \"qk_norm\": \"full\", \"norm_topk_prob\": false}", NULL,
          "num_key_value_heads 2 != num_attention_heads 4" },
        { "{" BASE ", \"num_key_value_heads\": 4, \"qk_norm\": \"full\", \"norm_topk_prob\": false, \"qkv_bias\": true}",
          NULL, "qkv_bias (q, k, v biases): its graph adds none" },
        { "{" BASE "}", "qwen2moe", "no shared expert: its graph requires a gated shared expert" },
        { "{" BASE "}", "qwen3moe", "qk_norm \"none\": its graph applies qk_norm \"head\"" },
        { "{" BASE ", \"n_shared_experts\": 1}", "llama", "a shared expert (width 128" },
        { "{" BASE "}", "mixtral", "--arch mixtral: not one of llama, qwen2moe, qwen3moe, olmoe" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c = cfg_of(bad[i].json);
        err[0] = 0;
        cr_expect_eq(gguf_arch_for(&c, bad[i].arch, &a, &why, err, sizeof err), -1, "%s accepted", bad[i].json);
        cr_expect(strstr(err, bad[i].msg), "%s: message \"%s\" lacks \"%s\"", bad[i].json, err, bad[i].msg);
    }
}
