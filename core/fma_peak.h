/* core/fma_peak.h - the machine's measured floating-point peak: what MFU
 * (model FLOPs utilisation, SPEC section 7) divides by.
 *
 * A register-only loop of independent fused multiply-adds at the vector
 * width of the build (16 floats with AVX-512, 8 with AVX2 + FMA, scalar
 * fmaf otherwise), on every thread of the pool: no memory traffic, no
 * dependency stalls, so it runs at the rate the FMA units can issue, which
 * no real kernel exceeds.  On a shared host a slice of it can be stolen:
 * the best of several short runs is kept, and it is a measurement, not the
 * data-sheet figure (turbo and AVX-512 clocks included). */
#ifndef TANDEM_CORE_FMA_PEAK_H
#define TANDEM_CORE_FMA_PEAK_H

/* GFLOP/s (an FMA counts 2) of all pool_threads() threads together, the
 * best of at least 5 runs (a few ms each at full speed) and 0.3 s in
 * total.  Call from the main thread, outside a pool region.  A run that
 * other load slowed reads low (an MFU against it flatters): callers that
 * also measured a GEMM take the larger of the two, as no GEMM outruns the
 * FMA units (train/trainer.c). */
double fma_peak_gflops(void);

/* Floats per FMA instruction of this build (16, 8 or 1). */
int fma_peak_lanes(void);

#endif
