/* core/tok/tok_util.h - what the tokenizer pieces share: growable byte
 * buffers, UTF-8 (decoding, Rust's from_utf8_lossy), GPT-2's byte <-> char
 * table, hash maps (string -> id, id pair -> merge), pieces of text and the
 * JSON field helpers that name the field at fault. */
#ifndef TANDEM_CORE_TOK_UTIL_H
#define TANDEM_CORE_TOK_UTIL_H

#include "core/tok/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- buffers */

typedef struct {
    char *p;
    size_t n, cap;
} TokBuf;

/* Makes room for `extra` more bytes (amortised doubling). */
void tokbuf_reserve(TokBuf *b, size_t extra);
void tokbuf_free(TokBuf *b);
static inline void tokbuf_put(TokBuf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) tokbuf_reserve(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static inline void tokbuf_putc(TokBuf *b, char c)
{
    if (b->n + 1 > b->cap) tokbuf_reserve(b, 1);
    b->p[b->n++] = c;
}

void tokids_reserve(TokIds *v, size_t extra);
static inline void tokids_push(TokIds *v, int32_t id)
{
    if (v->n == v->cap) tokids_reserve(v, 1);
    v->ids[v->n++] = id;
}
void toktext_put(TokText *t, const char *s, size_t n);

/* ---------------------------------------------------------------- UTF-8 */

/* Length (1..4) of the valid UTF-8 sequence at s[0..n) with its code point
 * in *cp; 0 when s starts no valid sequence (or n == 0). */
int utf8_next(const char *s, size_t n, uint32_t *cp);
/* Writes cp as UTF-8 (1..4 bytes) to out; returns the length. */
int utf8_put(uint32_t cp, char *out);
/* s[0..n) is all ASCII (8 bytes at a time). */
bool tok_ascii(const char *s, size_t n);
/* -1 when s[0..n) is valid UTF-8, else the offset of the first bad byte. */
long utf8_check(const char *s, size_t n);
/* Rust's String::from_utf8_lossy over s[0..n): each maximal invalid
 * subpart becomes one U+FFFD.  With final=false an incomplete sequence at
 * the end is left alone; returns the bytes consumed (n when final). */
size_t utf8_lossy(TokBuf *out, const char *s, size_t n, bool final);

/* GPT-2's reversible byte -> char table (ByteLevel): the char each byte
 * stands for (< 0x144), and the byte of a char (-1 when none). */
uint32_t bytelevel_char(uint8_t b);
int bytelevel_byte(uint32_t cp);

/* ---------------------------------------------------------------- hashing */

uint64_t tok_hash(const void *p, size_t n);

/* String -> int32 map with its own copy of the keys. */
typedef struct {
    struct StrSlot { uint64_t h; uint32_t off, len; int32_t val; } *slot;
    size_t mask, count;
    TokBuf keys;
} StrMap;

void strmap_init(StrMap *m, size_t expect);
void strmap_free(StrMap *m);
/* Sets key -> val (overwriting); returns the key's offset in m->keys. */
uint32_t strmap_put(StrMap *m, const char *k, size_t n, int32_t val);
/* Value of key, or -1. */
int32_t strmap_get(const StrMap *m, const char *k, size_t n);

/* (id a, id b) -> (rank, merged id) map of the BPE merges. */
typedef struct {
    struct PairSlot { uint64_t key; int32_t rank, id; } *slot;
    size_t mask, count;
} PairMap;

/* splitmix64's finalizer: every key bit reaches every slot bit. */
static inline uint64_t pair_hash(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void pairmap_init(PairMap *m, size_t expect);
void pairmap_free(PairMap *m);
void pairmap_put(PairMap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* Starts loading the slot of (a, b) (the map is larger than the caches). */
static inline void pairmap_prefetch(const PairMap *m, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    __builtin_prefetch(&m->slot[(size_t)pair_hash(key) & m->mask]);
}

/* true and *rank, *id when (a, b) merges. */
static inline bool pairmap_get(const PairMap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = (size_t)pair_hash(key) & m->mask;
    for (;;) {
        const struct PairSlot *s = &m->slot[i];
        if (s->rank < 0) return false;
        if (s->key == key) {
            *rank = s->rank;
            *id = s->id;
            return true;
        }
        i = (i + 1) & m->mask;
    }
}

/* ---------------------------------------------------------------- pieces */

/* A piece of text during encoding: bytes [off, off + len) of an arena. */
enum {
    PIECE_FIRST = 1,   /* starts at offset 0 of the original text */
    PIECE_BYTES = 2,   /* raw bytes standing for their ByteLevel chars */
};
typedef struct {
    uint32_t off, len;
    int32_t id;        /* >= 0: an added token, already tokenized */
    uint32_t flags;
} Piece;
typedef struct {
    Piece *v;
    size_t n, cap;
} Pieces;

/* (start, end) byte ranges: v[2i], v[2i+1]. */
typedef struct {
    size_t *v;
    size_t n, cap;   /* n ranges */
} TokSpans;

void spans_grow(TokSpans *s);   /* room for one more */
static inline void spans_push(TokSpans *s, size_t a, size_t b)
{
    if (s->n == s->cap) spans_grow(s);
    s->v[2 * s->n] = a;
    s->v[2 * s->n + 1] = b;
    s->n++;
}
void spans_free(TokSpans *s);

void pieces_grow(Pieces *p);   /* room for one more */
static inline void pieces_push(Pieces *p, uint32_t off, uint32_t len, int32_t id, uint32_t flags)
{
    if (p->n == p->cap) pieces_grow(p);
    p->v[p->n++] = (Piece){ off, len, id, flags };
}
void pieces_free(Pieces *p);

/* ---------------------------------------------------------------- JSON */

/* Errors name the file and the field: "tokenizer.json: model.vocab ...". */
void tok_errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Member of an object, NULL when absent or JSON null. */
const cJSON *tj_get(const cJSON *o, const char *key);
/* A string member: 0 and *out (NULL when absent and !required), -1 with
 * err when of the wrong type or required and absent. */
int tj_str(const cJSON *o, const char *key, const char *path, bool required, const char **out,
           char *err, size_t n);
/* A boolean member, dflt when absent. */
int tj_bool(const cJSON *o, const char *key, const char *path, bool dflt, bool *out, char *err,
            size_t n);
/* An integer member in [lo, hi], dflt when absent. */
int tj_int(const cJSON *o, const char *key, const char *path, long dflt, long lo, long hi, long *out,
           char *err, size_t n);
/* -1 with err naming the first member of o not in the NULL-terminated
 * list `known` (an option we do not know is refused, not ignored). */
int tj_known(const cJSON *o, const char *path, const char *const *known, char *err, size_t n);
/* The "type" of component o at path: 0 and *type, or -1 with err. */
int tj_type(const cJSON *o, const char *path, const char **type, char *err, size_t n);
/* A `pattern` member {"String": s} or {"Regex": r}: *is_regex and *s. */
int tj_pattern(const cJSON *o, const char *path, bool *is_regex, const char **s, char *err, size_t n);

#endif
