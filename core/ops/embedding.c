/* core/ops/embedding.c - embedding lookup forward and backward (embedding.h). */
#include "core/ops/embedding.h"
#include "core/pool.h"

#include <string.h>

void embedding_forward(float *y, const int32_t *restrict ids, const float *restrict table,
                       size_t N, size_t d)
{
    for (size_t t = 0; t < N; t++)
        memcpy(y + t * d, table + (size_t)ids[t] * d, d * sizeof(float));
}

void embedding_forward_packed(float *y, const int32_t *restrict ids, const GemmW *W, size_t N)
{
    for (size_t t = 0; t < N; t++) gemm_unpack_row(y + t * W->K, W, (size_t)ids[t]);
}

struct emb_bw { float *dtable; const float *dy; const int32_t *ids; size_t N, d; };

static void emb_bw_cols(void *vc, size_t c0, size_t c1, int tid)
{
    (void)tid;
    struct emb_bw *c = vc;
    for (size_t t = 0; t < c->N; t++) {
        float *dst = c->dtable + (size_t)c->ids[t] * c->d;
        const float *src = c->dy + t * c->d;
        for (size_t j = c0; j < c1; j++) dst[j] += src[j];
    }
}

void embedding_backward(float *dtable, const float *restrict dy, const int32_t *restrict ids,
                        size_t N, size_t d)
{
    struct emb_bw c = { dtable, dy, ids, N, d };
    pool_for(d, 16, emb_bw_cols, &c);
}
