/* core/tensor.c - tensors and the activation arena (see tensor.h). */
#include "core/tensor.h"
#include "core/common.h"

#include <stdint.h>
#include <string.h>

Tensor tensor_new(int ndim, const size_t *shape)
{
    Tensor t = tensor_view(NULL, ndim, shape);
    t.data = td_calloc(tensor_numel(&t) * sizeof(float));
    t.owner = true;
    return t;
}

Tensor tensor_view(float *data, int ndim, const size_t *shape)
{
    TD_CHECK(ndim >= 0 && ndim <= TENSOR_MAX_DIMS, "tensor rank %d", ndim);
    Tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    return t;
}

void tensor_free(Tensor *t)
{
    if (t->owner) td_free(t->data);
    memset(t, 0, sizeof *t);
}

size_t tensor_numel(const Tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void arena_init(Arena *a, size_t size)
{
    a->size = td_round_up(size, 64);
    a->base = td_malloc(a->size ? a->size : 64);
    a->used = a->peak = 0;
}

void arena_free(Arena *a)
{
    td_free(a->base);
    memset(a, 0, sizeof *a);
}

void arena_init_dry(Arena *a)
{
    memset(a, 0, sizeof *a);
    a->size = SIZE_MAX;
}

void *arena_bytes(Arena *a, size_t n)
{
    size_t need = td_round_up(n, 64);
    if (!a->base) {  /* dry run: only measure */
        a->used += need;
        if (a->used > a->peak) a->peak = a->used;
        return NULL;
    }
    TD_CHECK(a->used + need <= a->size, "activation arena too small: %zu + %zu > %zu bytes",
             a->used, need, a->size);
    void *p = a->base + a->used;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

float *arena_floats(Arena *a, size_t n) { return arena_bytes(a, n * sizeof(float)); }
