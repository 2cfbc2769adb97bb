/* core/arena.c - the activation arena (arena.h). */
#include "core/arena.h"
#include "core/common.h"

#include <stdint.h>
#include <string.h>

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
