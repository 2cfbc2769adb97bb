/* core/tensor.h - a float32 tensor (shape + contiguous storage, owner or
 * view) and the activation arena.
 *
 * Tensors are deliberately thin: ops take raw pointers and sizes (STYLE
 * section 3); Tensor is for the places that pass shapes around (model
 * parameters, checkpoint I/O, tests).
 *
 * The arena is one slab allocated at init; activations are carved from it
 * with arena_alloc and released in LIFO order with arena_reset(mark).  Its
 * high-water mark (arena_peak) is what the trainer reports as activation
 * memory.
 */
#ifndef TANDEM_CORE_TENSOR_H
#define TANDEM_CORE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>

#define TENSOR_MAX_DIMS 4

typedef struct {
    float *data;
    size_t shape[TENSOR_MAX_DIMS];
    int ndim;
    bool owner;    /* true: data came from td_malloc and tensor_free frees it */
} Tensor;

/* Owned, zero-filled tensor of the given shape (ndim <= 4). */
Tensor tensor_new(int ndim, const size_t *shape);
/* Borrowed view of data with the given shape. */
Tensor tensor_view(float *data, int ndim, const size_t *shape);
/* Frees owned storage; a view or a zeroed struct is fine; safe twice. */
void tensor_free(Tensor *t);
size_t tensor_numel(const Tensor *t);

typedef struct {
    char *base;     /* owned */
    size_t size;    /* bytes */
    size_t used;    /* bytes in use */
    size_t peak;    /* high-water mark of used */
} Arena;

/* Allocates the slab (size bytes).  arena_free releases it; safe twice. */
void arena_init(Arena *a, size_t size);
void arena_free(Arena *a);
/* A dry arena allocates nothing: arena_floats returns NULL and only the
 * sizes add up, so a carving function run on it measures the slab it needs. */
void arena_init_dry(Arena *a);
/* n floats, 64-byte aligned, not initialised.  Aborts (a bug: sizes are
 * computed up front) if the arena is too small. */
float *arena_floats(Arena *a, size_t n);
/* Bytes, 64-byte aligned. */
void *arena_bytes(Arena *a, size_t n);
static inline size_t arena_mark(const Arena *a) { return a->used; }
static inline void arena_reset(Arena *a, size_t mark) { a->used = mark; }
/* Bytes one arena_floats(n) call consumes (for sizing functions). */
static inline size_t arena_cost(size_t n_floats) { return (n_floats * sizeof(float) + 63) / 64 * 64; }

#endif
