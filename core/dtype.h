/* core/dtype.h - element types other than float32 and their conversions
 * to and from float32, written once for the whole tree: the HDF5
 * checkpoints (16-bit exports), the safetensors reader and, later, the
 * low-precision GEMM all call these.
 *
 *   bfloat16   the upper 16 bits of a float32; float32 -> bf16 rounds to
 *              nearest even (SPEC section 4), bf16 -> float32 is exact
 *   float16    IEEE binary16; both directions as numpy's astype (round to
 *              nearest even, subnormals, infinity, NaN payloads kept)
 *   float8     e4m3fn (OCP FP8 E4M3, torch.float8_e4m3fn, safetensors
 *              "F8_E4M3"): 1 sign, 4 exponent (bias 7), 3 mantissa bits,
 *              no infinities, S.1111.111 is NaN, max 448; decode only
 *              (exact), as DeepSeek-V3 stores its weights
 *   Q8_0       ggml's 8-bit blocks (GGUF exports): every 32 consecutive
 *              values are one block of 34 bytes, a float16 scale
 *              d = fp16(max|x| / 127) then 32 int8 q = roundf(x / d')
 *              with d' the float32 scale before rounding (1/d' taken
 *              once), exactly ggml's quantize_row_q8_0_ref; decode is
 *              q * float32(fp16 d)
 *   int8 g32   symmetric groupwise int8 (the serving dtype of SPEC section
 *              11): a run of n values (a group of up to DTYPE_Q8_GROUP
 *              weights along a matrix's input dimension, or one head of a
 *              cached key / value) gets one scale
 *                  s = amax / 127          amax = max |x_i| over the group
 *                  q_i = rne(x_i / s)      clamped to [-127, 127]
 *              (the division and the rounding to nearest, ties to even, are
 *              IEEE float32 operations: the same bits on every machine),
 *              and stands for the float32 values (float)q_i * s, rounded
 *              once.  A weight group's s is then rounded to bfloat16
 *              (nearest even) before q is taken, so the packed matrix
 *              holds it in 2 bytes (a KV head's stays float32).  A group
 *              of zeros (or so small that s underflows to 0) has s = 0
 *              and q = 0.  -128 is never produced.
 *
 * All functions are pure and thread-safe.  The array forms take any n
 * (0 included) and need their pointers aligned for the element type.
 */
#ifndef TANDEM_CORE_DTYPE_H
#define TANDEM_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* The storage types a tensor can be served in (weights: SPEC section 11;
 * the KV cache). */
typedef enum { DTYPE_F32 = 0, DTYPE_BF16, DTYPE_INT8 } Dtype;
#define DTYPE_Q8_GROUP 32

/* "f32", "bf16", "int8". */
const char *dtype_name(Dtype t);
/* "f32" / "float32", "bf16" / "bfloat16", "int8" -> *t; -1 otherwise. */
int dtype_parse(const char *s, Dtype *t);
/* Bytes per element (int8: without its scales). */
static inline size_t dtype_size(Dtype t) { return t == DTYPE_F32 ? 4 : t == DTYPE_BF16 ? 2 : 1; }

/* float32 -> bfloat16: the upper 16 bits rounded to nearest even; NaN stays
 * a (quiet) NaN, overflow rounds to infinity. */
uint16_t dtype_bf16_from_f32(float x);
float dtype_f32_from_bf16(uint16_t h);
/* float32 -> IEEE binary16, round to nearest even (subnormals, infinity,
 * NaN as numpy's astype(float16)). */
uint16_t dtype_f16_from_f32(float x);
float dtype_f32_from_f16(uint16_t h);
/* float8 e4m3fn -> float32, exact (every e4m3 value is a float32). */
float dtype_f32_from_f8e4m3(uint8_t b);

/* y[i] = float32 of x[i], i < n (exact). */
void dtype_bf16_to_f32(float *restrict y, const uint16_t *restrict x, size_t n);
void dtype_f16_to_f32(float *restrict y, const uint16_t *restrict x, size_t n);
void dtype_f8e4m3_to_f32(float *restrict y, const uint8_t *restrict x, size_t n);

#define DTYPE_Q8_0_BLOCK 32   /* values per block */
#define DTYPE_Q8_0_BYTES 34   /* bytes per block: f16 scale, 32 int8 */
/* x[0..n) -> n / 32 Q8_0 blocks at y (n / 32 * 34 bytes, any alignment);
 * n must be a multiple of 32. */
void dtype_q8_0_from_f32(uint8_t *restrict y, const float *restrict x, size_t n);
/* n / 32 Q8_0 blocks -> y[0..n); n a multiple of 32. */
void dtype_q8_0_to_f32(float *restrict y, const uint8_t *restrict x, size_t n);
/* int8 g32 of x[0..n) (any n >= 1; a weight group has n <= 32): q[i]
 * overwritten, returns the scale.  x must be finite (a non-finite input
 * gives some clamped q, never undefined behaviour). */
float dtype_q8_quantize(int8_t *restrict q, const float *restrict x, size_t n);
/* A weight group's scale from its amax: bf16(amax / 127), 0 when that
 * is not > 0 (zeros, an underflow, NaN). */
float dtype_q8_weight_scale(float amax);
/* dtype_q8_quantize with dtype_q8_weight_scale's scale: a weight group. */
float dtype_q8_quantize_weights(int8_t *restrict q, const float *restrict x, size_t n);
/* y[i] = (float)q[i] * s, i < n. */
void dtype_q8_dequantize(float *restrict y, const int8_t *restrict q, float s, size_t n);
/* A row of K weights quantized in groups of DTYPE_Q8_GROUP (weight
 * scales): q (K), s
 * (dtype_q8_groups(K)); the last group holds K mod 32 weights when K is not
 * a multiple of 32. */
static inline size_t dtype_q8_groups(size_t K) { return (K + DTYPE_Q8_GROUP - 1) / DTYPE_Q8_GROUP; }
void dtype_q8_quantize_row(int8_t *restrict q, float *restrict s, const float *restrict x, size_t K);
void dtype_q8_dequantize_row(float *restrict y, const int8_t *restrict q, const float *restrict s, size_t K);
/* The same row, groups and scale rule, rounded by GPTQ (Frantar et al.,
 * 2022, "GPTQ: Accurate Post-Training Quantization"): the weights are
 * rounded in order k = 0..K-1, each group's scale is
 * dtype_q8_weight_scale of the row as updated so far, taken at the
 * group's first weight, and each weight's rounding error e_k, divided by
 * U[k][k], is taken off the later weights along row k of U.  U (row-major K x K, upper triangular) is the Cholesky
 * factor, U^T U = H^-1, of the inverse of the input's second moment H = sum
 * x x^T (damped): so the row greedily lowers the output error
 * (w - w_q)^T H (w - w_q) instead of each weight's own error.  With U
 * diagonal it gives dtype_q8_quantize_row's bits.  work: K floats. */
void dtype_q8_quantize_row_gptq(int8_t *restrict q, float *restrict s, const float *restrict x,
                                const float *restrict U, size_t K, float *restrict work);

#endif
