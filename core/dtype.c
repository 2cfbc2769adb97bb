/* core/dtype.c - bfloat16, float16, float8 e4m3fn and Q8_0 conversions
 * (see dtype.h).  Bit manipulation on the IEEE encodings; no FPU rounding
 * mode is involved (Q8_0's roundf rounds halves away from zero whatever the
 * mode), so the results are the same on every machine. */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t dtype_bf16_from_f32(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

float dtype_f32_from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dtype_f16_from_f32(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return sign | 0x7c00u;
        uint16_t h = (uint16_t)(0x7c00u + ((a & 0x7fffffu) >> 13));  /* NaN, payload kept (numpy) */
        return sign | (h == 0x7c00u ? 0x7c01u : h);
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u;         /* >= 65520 rounds to infinity */
    if (a >= 0x38800000u) {                              /* normal: >= 2^-14 */
        uint32_t h = (a >> 13) - (112u << 10);           /* rebias 127 -> 15 */
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }
    if (a <= 0x33000000u) return sign;                   /* <= 2^-25: rounds to zero */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                            /* value / 2^-24 = m >> shift */
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float dtype_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;                   /* subnormal (or zero), exact */
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

float dtype_f32_from_f8e4m3(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 0x7u;
    if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);   /* the only NaN; no infinities */
    if (e == 0) {
        float v = (float)m * 0x1p-9f;                    /* subnormal (or zero): m 2^-3 2^-6 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));       /* rebias 7 -> 127 */
}

void dtype_bf16_to_f32(float *restrict y, const uint16_t *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = bits_f32((uint32_t)x[i] << 16);
}

void dtype_f16_to_f32(float *restrict y, const uint16_t *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_f16(x[i]);
}

void dtype_f8e4m3_to_f32(float *restrict y, const uint8_t *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = dtype_f32_from_f8e4m3(x[i]);
}

/* ggml-quants.c quantize_row_q8_0_ref, value for value: amax over the
 * block, d = amax / 127 in float32, id = 1 / d (0 for an all-zero block),
 * q = roundf(x * id) (halves away from zero); the scale is stored as
 * fp16(d) while the values were divided by the unrounded d. */
void dtype_q8_0_from_f32(uint8_t *restrict y, const float *restrict x, size_t n)
{
    for (size_t b = 0; b < n / DTYPE_Q8_0_BLOCK; b++) {
        const float *xb = x + b * DTYPE_Q8_0_BLOCK;
        uint8_t *yb = y + b * DTYPE_Q8_0_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < DTYPE_Q8_0_BLOCK; j++) {
            float a = fabsf(xb[j]);
            amax = amax > a ? amax : a;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = dtype_f16_from_f32(d);
        memcpy(yb, &h, 2);   /* little-endian host */
        for (int j = 0; j < DTYPE_Q8_0_BLOCK; j++) yb[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
    }
}

void dtype_q8_0_to_f32(float *restrict y, const uint8_t *restrict x, size_t n)
{
    for (size_t b = 0; b < n / DTYPE_Q8_0_BLOCK; b++) {
        const uint8_t *xb = x + b * DTYPE_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, xb, 2);
        const float d = dtype_f32_from_f16(h);
        for (int j = 0; j < DTYPE_Q8_0_BLOCK; j++) y[b * DTYPE_Q8_0_BLOCK + j] = (float)(int8_t)xb[2 + j] * d;
    }
}

const char *dtype_name(Dtype t)
{
    return t == DTYPE_BF16 ? "bf16" : t == DTYPE_INT8 ? "int8" : "f32";
}

int dtype_parse(const char *s, Dtype *t)
{
    if (!strcmp(s, "f32") || !strcmp(s, "float32")) *t = DTYPE_F32;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *t = DTYPE_BF16;
    else if (!strcmp(s, "int8")) *t = DTYPE_INT8;
    else return -1;
    return 0;
}

/* q from x with the scale s (> 0) */
static void q8_round(int8_t *restrict q, const float *restrict x, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = rintf(x[i] / s);   /* the default rounding mode: to nearest, ties to even */
        v = v > 127.0f ? 127.0f : v;
        v = v >= -127.0f ? v : -127.0f;   /* NaN lands here too: defined, never UB */
        q[i] = (int8_t)v;
    }
}

static float q8_amax(const float *x, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

float dtype_q8_quantize(int8_t *restrict q, const float *restrict x, size_t n)
{
    const float s = q8_amax(x, n) / 127.0f;
    if (!(s > 0.0f)) {   /* zeros, an underflow (or a NaN amax): all q = 0 */
        memset(q, 0, n);
        return 0.0f;
    }
    q8_round(q, x, s, n);
    return s;
}

float dtype_q8_weight_scale(float amax)
{
    const float s = dtype_f32_from_bf16(dtype_bf16_from_f32(amax / 127.0f));
    return s > 0.0f ? s : 0.0f;   /* zeros, an underflow, a NaN amax */
}

float dtype_q8_quantize_weights(int8_t *restrict q, const float *restrict x, size_t n)
{
    const float s = dtype_q8_weight_scale(q8_amax(x, n));
    if (s == 0.0f) {
        memset(q, 0, n);
        return 0.0f;
    }
    q8_round(q, x, s, n);
    return s;
}

void dtype_q8_dequantize(float *restrict y, const int8_t *restrict q, float s, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = (float)q[i] * s;
}

void dtype_q8_quantize_row(int8_t *restrict q, float *restrict s, const float *restrict x, size_t K)
{
    for (size_t g = 0, k = 0; k < K; g++, k += DTYPE_Q8_GROUP) {
        const size_t n = K - k < DTYPE_Q8_GROUP ? K - k : DTYPE_Q8_GROUP;
        s[g] = dtype_q8_quantize_weights(q + k, x + k, n);
    }
}

void dtype_q8_quantize_row_gptq(int8_t *restrict q, float *restrict s, const float *restrict x,
                                const float *restrict U, size_t K, float *restrict work)
{
    memcpy(work, x, K * sizeof(float));
    float sc = 0.0f;
    for (size_t k = 0; k < K; k++) {
        if (k % DTYPE_Q8_GROUP == 0) {   /* the group's scale, as dtype_q8_quantize_weights takes it */
            const size_t n = K - k < DTYPE_Q8_GROUP ? K - k : DTYPE_Q8_GROUP;
            sc = dtype_q8_weight_scale(q8_amax(work + k, n));
            s[k / DTYPE_Q8_GROUP] = sc;
        }
        float v = sc > 0.0f ? rintf(work[k] / sc) : 0.0f;
        v = v > 127.0f ? 127.0f : v;
        v = v >= -127.0f ? v : -127.0f;
        q[k] = (int8_t)v;
        const float *restrict u = U + k * K;
        const float e = (work[k] - v * sc) / u[k];
        for (size_t j = k + 1; j < K; j++) work[j] -= e * u[j];
    }
}

void dtype_q8_dequantize_row(float *restrict y, const int8_t *restrict q, const float *restrict s, size_t K)
{
    for (size_t g = 0, k = 0; k < K; g++, k += DTYPE_Q8_GROUP) {
        const size_t n = K - k < DTYPE_Q8_GROUP ? K - k : DTYPE_Q8_GROUP;
        dtype_q8_dequantize(y + k, q + k, s[g], n);
    }
}
