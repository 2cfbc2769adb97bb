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
 *
 * All functions are pure and thread-safe.  The array forms take any n
 * (0 included) and need their pointers aligned for the element type.
 */
#ifndef TANDEM_CORE_DTYPE_H
#define TANDEM_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

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

#endif
