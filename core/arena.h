/* core/arena.h - the activation arena.
 *
 * The arena is one slab allocated at init; activations are carved from it
 * once, with arena_floats / arena_bytes, by functions that a dry arena
 * first runs to measure the slab.  Its high-water mark (peak) is what the
 * trainer reports as activation memory.  Ops take raw pointers and sizes
 * (STYLE section 3): there is no tensor type.
 */
#ifndef TANDEM_CORE_ARENA_H
#define TANDEM_CORE_ARENA_H

#include <stddef.h>

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

#endif
