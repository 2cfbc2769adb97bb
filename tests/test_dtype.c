/* tests/test_dtype.c - the element-type conversions of core/dtype.h:
 * float32 <-> bfloat16 and float16 rounding (nearest even, ties, overflow,
 * subnormals, NaN), every 16-bit value through a round trip, the float8
 * e4m3fn decoder against the format's definition, and the array forms
 * against the scalar ones.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/dtype.h"
#include "tests/fixture.h"
#include "train/quant/gptq.h"

Test(dtype, bf16_rounds_to_nearest_even)
{
    cr_expect_eq(dtype_bf16_from_f32(1.0f), 0x3f80);
    /* ties: 1 + 2^-8 lies halfway between 0x3f80 and 0x3f81 -> even 0x3f80;
     * halfway between 0x3f81 and 0x3f82 -> 0x3f82 */
    union { uint32_t u; float f; } a = { 0x3f808000u }, b = { 0x3f818000u }, c = { 0x3f808001u };
    cr_expect_eq(dtype_bf16_from_f32(a.f), 0x3f80);
    cr_expect_eq(dtype_bf16_from_f32(b.f), 0x3f82);
    cr_expect_eq(dtype_bf16_from_f32(c.f), 0x3f81);
    cr_expect_eq(dtype_bf16_from_f32(-2.0f), 0xc000);
    cr_expect_eq(dtype_bf16_from_f32(INFINITY), 0x7f80);
    cr_expect_eq(dtype_bf16_from_f32(3.4028235e38f), 0x7f80, "FLT_MAX rounds to infinity");
    cr_expect(isnan(dtype_f32_from_bf16(dtype_bf16_from_f32(NAN))), "NaN stays NaN");
    union { uint32_t u; float f; } snan = { 0x7f800001u };
    cr_expect(isnan(dtype_f32_from_bf16(dtype_bf16_from_f32(snan.f))), "a NaN with a low payload stays NaN");
    /* every bfloat16 survives the round trip through float32 */
    for (uint32_t h = 0; h < 65536; h++) {
        float x = dtype_f32_from_bf16((uint16_t)h);
        if (isnan(x)) continue;
        cr_assert_eq(dtype_bf16_from_f32(x), h, "bf16 %04x", h);
    }
}

Test(dtype, f16_rounds_to_nearest_even)
{
    cr_expect_eq(dtype_f16_from_f32(1.0f), 0x3c00);
    cr_expect_eq(dtype_f16_from_f32(65504.0f), 0x7bff);
    cr_expect_eq(dtype_f16_from_f32(65519.0f), 0x7bff);
    cr_expect_eq(dtype_f16_from_f32(65520.0f), 0x7c00, "65520 is the tie to infinity");
    cr_expect_eq(dtype_f16_from_f32(-1e9f), 0xfc00);
    cr_expect_eq(dtype_f16_from_f32(0x1p-24f), 0x0001, "smallest subnormal");
    cr_expect_eq(dtype_f16_from_f32(0x1p-25f), 0x0000, "half of it ties to even zero");
    cr_expect_eq(dtype_f16_from_f32(0x1.8p-25f), 0x0001);
    cr_expect_eq(dtype_f16_from_f32(0x1.8p-24f), 0x0002, "1.5 ulp ties to even 2");
    cr_expect_eq(dtype_f16_from_f32(1.0f + 0x1p-11f), 0x3c00, "tie to even");
    cr_expect_eq(dtype_f16_from_f32(1.0f + 0x3p-11f), 0x3c02, "tie to even (up)");
    cr_expect_eq(dtype_f16_from_f32(0x1.ffcp-15f), 0x0400, "rounds up into the normals");
    cr_expect_eq(dtype_f16_from_f32(-0.0f), 0x8000);
    cr_expect_eq(dtype_f16_from_f32(NAN) & 0x7e00, 0x7e00, "quiet NaN");
    for (uint32_t h = 0; h < 65536; h++) {
        float x = dtype_f32_from_f16((uint16_t)h);
        cr_assert_eq(dtype_f16_from_f32(x), h, "f16 %04x -> %a", h, (double)x);
    }
    /* monotone between neighbours: x in (h, h+1) rounds to one of them */
    for (uint32_t h = 0; h < 0x7bff; h += 7) {
        float lo = dtype_f32_from_f16((uint16_t)h), hi = dtype_f32_from_f16((uint16_t)(h + 1));
        float mid = lo + (hi - lo) * 0.25f;
        cr_assert_eq(dtype_f16_from_f32(mid), h, "%a", (double)mid);
    }
}

/* e4m3fn by its definition: (-1)^s 2^(e-7) (1 + m/8), subnormals
 * 2^-6 (m/8) at e = 0, S.1111.111 the only NaN (no infinities). */
static double e4m3_by_definition(unsigned b)
{
    unsigned s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, (int)e - 7);
    return s ? -v : v;
}

Test(dtype, f8e4m3_decodes_every_byte_by_the_definition)
{
    for (unsigned b = 0; b < 256; b++) {
        double want = e4m3_by_definition(b);
        float got = dtype_f32_from_f8e4m3((uint8_t)b);
        if (isnan(want)) {
            cr_expect(isnan(got), "byte %02x is NaN, got %a", b, (double)got);
            continue;
        }
        cr_expect((double)got == want, "byte %02x: got %a, want %a", b, (double)got, want);
        cr_expect((signbit(got) != 0) == (b >= 0x80), "byte %02x: sign", b);
    }
    cr_expect_eq(dtype_f32_from_f8e4m3(0x7e), 448.0f, "the largest value");
    cr_expect_eq(dtype_f32_from_f8e4m3(0x38), 1.0f);
    cr_expect_eq(dtype_f32_from_f8e4m3(0x01), 0x1p-9f, "the smallest subnormal");
    cr_expect_eq(dtype_f32_from_f8e4m3(0x08), 0x1p-6f, "the smallest normal");
    cr_expect(isnan(dtype_f32_from_f8e4m3(0x7f)) && isnan(dtype_f32_from_f8e4m3(0xff)));
    /* strictly increasing over the positive codes */
    for (unsigned b = 0; b + 1 < 0x7f; b++)
        cr_expect(dtype_f32_from_f8e4m3((uint8_t)b) < dtype_f32_from_f8e4m3((uint8_t)(b + 1)), "%02x", b);
}

Test(dtype, array_forms_match_the_scalar_ones)
{
    enum { N = 65536 };
    uint16_t *h = td_malloc(N * sizeof *h);
    uint8_t *b = td_malloc(256);
    float *y = td_malloc(N * sizeof *y);
    for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)i;
    for (uint32_t i = 0; i < 256; i++) b[i] = (uint8_t)i;
    dtype_bf16_to_f32(y, h, N);
    for (uint32_t i = 0; i < N; i++) {
        float x = dtype_f32_from_bf16(h[i]);
        cr_assert(memcmp(&x, &y[i], 4) == 0, "bf16 %04x", i);
    }
    dtype_f16_to_f32(y, h, N);
    for (uint32_t i = 0; i < N; i++) {
        float x = dtype_f32_from_f16(h[i]);
        cr_assert(memcmp(&x, &y[i], 4) == 0, "f16 %04x", i);
    }
    dtype_f8e4m3_to_f32(y, b, 256);
    for (uint32_t i = 0; i < 256; i++) {
        float x = dtype_f32_from_f8e4m3(b[i]);
        cr_assert(memcmp(&x, &y[i], 4) == 0, "f8 %02x", i);
    }
    dtype_bf16_to_f32(y, h, 0);   /* n = 0 is fine */
    td_free(h);
    td_free(b);
    td_free(y);
    cr_expect_eq(td_mem_current(), 0);
}

/* Q8_0 (ggml quantize_row_q8_0_ref): hand-worked blocks.  Block 0 has
 * max |x| = 127, so d = 1 and q = roundf(x) with halves away from zero;
 * block 1 is all zeros (d = 0, q = 0, no division by zero); block 2 has
 * max |x| = 0.3, d = 0.3 / 127 stored as fp16 while the values are divided
 * by the float32 d (so the extreme value is exactly +-127). */
Test(dtype, q8_0_blocks_match_ggml_reference)
{
    float x[96] = { 0 };
    x[0] = 127.0f; x[1] = 0.5f; x[2] = -0.5f; x[3] = 1.49f; x[4] = -126.6f; x[5] = 2.5f; x[31] = -3.0f;
    for (int j = 0; j < 32; j++) x[64 + j] = 0.3f * (float)(j - 16) / 16.0f;   /* -0.3 .. 0.28125 */
    uint8_t q[3 * DTYPE_Q8_0_BYTES];
    memset(q, 0xAA, sizeof q);
    dtype_q8_0_from_f32(q, x, 96);
    uint16_t d0, d1, d2;
    memcpy(&d0, q, 2);
    memcpy(&d1, q + 34, 2);
    memcpy(&d2, q + 68, 2);
    cr_expect_eq(d0, 0x3c00, "d = 127 / 127 = 1.0 (fp16 0x3c00), got %04x", d0);
    int8_t want0[8] = { 127, 1, -1, 1, -127, 3, 0, 0 };
    for (int j = 0; j < 8; j++) cr_expect_eq((int8_t)q[2 + j], want0[j], "block 0 q[%d]", j);
    cr_expect_eq((int8_t)q[2 + 31], -3);
    cr_expect_eq(d1, 0, "all-zero block: d = 0");
    for (int j = 0; j < 32; j++) cr_expect_eq(q[36 + j], 0, "all-zero block q[%d]", j);
    cr_expect_eq(d2, dtype_f16_from_f32(0.3f / 127.0f), "the scale is fp16(amax / 127)");
    cr_expect_eq((int8_t)q[70], -127, "x = -amax quantizes to -127");
    cr_expect_eq((int8_t)q[70 + 16], 0);
    cr_expect_eq((int8_t)q[70 + 8], (int8_t)roundf(-0.15f * (127.0f / 0.3f)));
    /* decode: q * fp16 scale; the error of a value is at most half a step
     * plus the scale's fp16 rounding (|q| <= 127, relative 2^-11) */
    float y[96];
    dtype_q8_0_to_f32(y, q, 96);
    cr_expect_eq(y[0], 127.0f);
    cr_expect_eq(y[2], -1.0f);
    for (int j = 0; j < 32; j++) {
        float step = 0.3f / 127.0f;
        cr_expect(fabsf(y[64 + j] - x[64 + j]) <= 0.5f * step + 127.0f * step * 0x1p-11f,
                  "block 2 value %d: %g vs %g", j, y[64 + j], x[64 + j]);
    }
}

/* GPTQ rounding (dtype_q8_quantize_row_gptq) against a float32 replay of
 * the same algorithm (tests/ref/fixtures_ops.py, gptq.h5): the same bits;
 * and the output error (w - w_q)^T H (w - w_q) below rounding to nearest's. */
static double out_err(const float *w, const int8_t *q, const float *s, const float *H, size_t K)
{
    double *e = td_malloc(K * sizeof(double)), r = 0;
    for (size_t k = 0; k < K; k++) e[k] = (double)w[k] - (double)q[k] * (double)s[k / DTYPE_Q8_GROUP];
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < K; j++) r += e[i] * (double)H[i * K + j] * e[j];
    td_free(e);
    return r;
}

Test(dtype, q8_gptq_matches_reference_and_lowers_output_error)
{
    const char *f = "gptq.h5";
    const int nc = (int)fixture_attr(f, "n_cases");
    cr_assert(nc >= 3, "gptq.h5: %d cases", nc);
    for (int c = 0; c < nc; c++) {
        char nm[64];
        size_t n;
#define DS(x) (snprintf(nm, sizeof nm, "c%d/%s", c, x), nm)
        int32_t *dims = fixture_i32(f, DS("dims"), &n);
        const size_t R = (size_t)dims[0], K = (size_t)dims[1], G = dtype_q8_groups(K);
        float *W = fixture_f32(f, DS("W"), &n), *U = fixture_f32(f, DS("U"), &n), *H = fixture_f32(f, DS("H"), &n);
        float *s_ref = fixture_f32(f, DS("s"), &n);
        int32_t *q_ref = fixture_i32(f, DS("q"), &n), *q_rtn = fixture_i32(f, DS("q_rtn"), &n);
#undef DS
        int8_t *q = td_malloc(K), *qn = td_malloc(K);
        float *s = td_malloc(G * sizeof(float)), *sn = td_malloc(G * sizeof(float)), *work = td_malloc(K * sizeof(float));
        double eg = 0, en = 0;
        for (size_t r = 0; r < R; r++) {
            dtype_q8_quantize_row_gptq(q, s, W + r * K, U, K, work);
            dtype_q8_quantize_row(qn, sn, W + r * K, K);
            for (size_t k = 0; k < K; k++) {
                cr_assert_eq(q[k], q_ref[r * K + k], "case %d row %zu: q[%zu] = %d, reference %d", c, r, k, q[k],
                             q_ref[r * K + k]);
                cr_assert_eq(qn[k], q_rtn[r * K + k], "case %d row %zu: nearest q[%zu]", c, r, k);
                cr_assert(q[k] >= -127 && q[k] <= 127);
            }
            cr_assert(!memcmp(s, s_ref + r * G, G * sizeof(float)), "case %d row %zu: scales differ", c, r);
            eg += out_err(W + r * K, q, s, H, K);
            en += out_err(W + r * K, qn, sn, H, K);
        }
        cr_expect(eg < 0.6 * en, "case %d: GPTQ output error %.6g, rounding to nearest %.6g", c, eg, en);
        /* a diagonal factor: no error is carried, the bits of rounding to nearest */
        float *D = td_calloc(K * K * sizeof(float));
        for (size_t k = 0; k < K; k++) D[k * K + k] = 0.5f + (float)k;
        for (size_t r = 0; r < R; r++) {
            dtype_q8_quantize_row_gptq(q, s, W + r * K, D, K, work);
            dtype_q8_quantize_row(qn, sn, W + r * K, K);
            cr_assert(!memcmp(q, qn, K) && !memcmp(s, sn, G * sizeof(float)), "case %d row %zu: diagonal U", c, r);
        }
        td_free(D);
        td_free(dims);
        td_free(W);
        td_free(U);
        td_free(H);
        td_free(s_ref);
        td_free(q_ref);
        td_free(q_rtn);
        td_free(q);
        td_free(qn);
        td_free(s);
        td_free(sn);
        td_free(work);
    }
}

/* gptq_factor: U^T U = (H damped)^-1, U upper, against PyTorch's float64
 * factor (gptq.h5's U, rounded to float32). */
Test(dtype, gptq_factor_matches_torch)
{
    const char *f = "gptq.h5";
    const int nc = (int)fixture_attr(f, "n_cases");
    for (int c = 0; c < nc; c++) {
        char nm[64];
        size_t n;
        snprintf(nm, sizeof nm, "c%d/dims", c);
        int32_t *dims = fixture_i32(f, nm, &n);
        const size_t K = (size_t)dims[1];
        snprintf(nm, sizeof nm, "c%d/H", c);
        float *h = fixture_f32(f, nm, &n);
        snprintf(nm, sizeof nm, "c%d/U", c);
        float *U = fixture_f32(f, nm, &n);
        double *w = td_malloc(K * K * sizeof(double));
        cr_assert(gptq_factor(h, K, 0.01, w), "case %d: not positive definite", c);
        float umax = 0;
        for (size_t i = 0; i < K * K; i++) umax = fmaxf(umax, fabsf(U[i]));
        snprintf(nm, sizeof nm, "gptq factor, case %d", c);
        EXPECT_CLOSE(h, U, K * K, 1e-5 * umax, 1e-4, nm);
        td_free(w);
        td_free(dims);
        td_free(h);
        td_free(U);
    }
}
