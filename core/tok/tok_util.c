/* core/tok/tok_util.c - buffers, UTF-8, byte table, hash maps, JSON field
 * helpers (tok_util.h). */
#include "core/tok/tok_util.h"
#include "core/common.h"

#include <stdarg.h>
#include <stdio.h>

/* ---------------------------------------------------------------- buffers */

static size_t grow_cap(size_t cap, size_t need, size_t min)
{
    size_t c = cap ? cap : min;
    while (c < need) c *= 2;
    return c;
}

void tokbuf_reserve(TokBuf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return;
    size_t cap = grow_cap(b->cap, b->n + extra, 256);
    char *p = td_malloc(cap);
    if (b->n) memcpy(p, b->p, b->n);
    td_free(b->p);
    b->p = p;
    b->cap = cap;
}

void tokbuf_free(TokBuf *b)
{
    td_free(b->p);
    memset(b, 0, sizeof *b);
}

void tokids_reserve(TokIds *v, size_t extra)
{
    if (v->n + extra <= v->cap) return;
    size_t cap = grow_cap(v->cap, v->n + extra, 64);
    int32_t *p = td_malloc(cap * sizeof(int32_t));
    if (v->n) memcpy(p, v->ids, v->n * sizeof(int32_t));
    td_free(v->ids);
    v->ids = p;
    v->cap = cap;
}

void tok_ids_free(TokIds *v)
{
    td_free(v->ids);
    memset(v, 0, sizeof *v);
}

void tok_ids_push(TokIds *v, int32_t id) { tokids_push(v, id); }

void toktext_put(TokText *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = grow_cap(t->cap, t->len + n + 1, 64);
        char *p = td_malloc(cap);
        if (t->len) memcpy(p, t->s, t->len);
        td_free(t->s);
        t->s = p;
        t->cap = cap;
    }
    if (n) memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

void tok_text_free(TokText *t)
{
    td_free(t->s);
    memset(t, 0, sizeof *t);
}

void spans_grow(TokSpans *s)
{
    size_t cap = grow_cap(s->cap, s->n + 1, 64);
    size_t *v = td_malloc(2 * cap * sizeof(size_t));
    if (s->n) memcpy(v, s->v, 2 * s->n * sizeof(size_t));
    td_free(s->v);
    s->v = v;
    s->cap = cap;
}

void spans_free(TokSpans *s)
{
    td_free(s->v);
    memset(s, 0, sizeof *s);
}

void pieces_grow(Pieces *p)
{
    size_t cap = grow_cap(p->cap, p->n + 1, 64);
    Piece *v = td_malloc(cap * sizeof(Piece));
    if (p->n) memcpy(v, p->v, p->n * sizeof(Piece));
    td_free(p->v);
    p->v = v;
    p->cap = cap;
}

void pieces_free(Pieces *p)
{
    td_free(p->v);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- UTF-8 */

bool tok_ascii(const char *s, size_t n)
{
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= (uint8_t)s[i];
    return !(acc & 0x8080808080808080ull);
}


/* Second-byte range of a lead byte (Unicode Table 3-7); lo > hi: invalid
 * lead. */
static void utf8_lead(uint8_t c, int *len, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80) *len = 1;
    else if (c >= 0xc2 && c <= 0xdf) *len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        *len = 3;
        if (c == 0xe0) *lo = 0xa0;
        if (c == 0xed) *hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        *len = 4;
        if (c == 0xf0) *lo = 0x90;
        if (c == 0xf4) *hi = 0x8f;
    } else *len = 0;
}

/* Bytes of the maximal valid prefix of a sequence at s (>= 1 when s[0] is
 * a valid lead); *complete when it is a whole character. */
static int utf8_prefix(const uint8_t *s, size_t n, bool *complete)
{
    int len;
    uint8_t lo, hi;
    utf8_lead(s[0], &len, &lo, &hi);
    *complete = false;
    if (len == 0) return 0;
    int i = 1;
    for (; i < len; i++) {
        if ((size_t)i >= n) return i;
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) return i;
    }
    *complete = true;
    return len;
}

int utf8_next(const char *s, size_t n, uint32_t *cp)
{
    if (!n) return 0;
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    bool complete;
    int l = utf8_prefix(u, n, &complete);
    if (!complete) return 0;
    uint32_t c = u[0] & (0x7f >> l);
    for (int i = 1; i < l; i++) c = c << 6 | (u[i] & 0x3f);
    *cp = c;
    return l;
}

int utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

long utf8_check(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {   /* ASCII eight bytes at a time */
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool complete;
        int l = utf8_prefix(u + i, n - i, &complete);
        if (!complete) return (long)i;
        i += (size_t)l;
    }
    return -1;
}

size_t utf8_lossy(TokBuf *out, const char *s, size_t n, bool final)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;   /* run: start of valid bytes not yet copied */
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool complete;
        int l = utf8_prefix(u + i, n - i, &complete);
        if (complete) {
            i += (size_t)l;
            continue;
        }
        if (!final && l > 0 && i + (size_t)l == n) break;   /* may still complete */
        tokbuf_put(out, s + run, i - run);
        tokbuf_put(out, "\xef\xbf\xbd", 3);
        i += l > 0 ? (size_t)l : 1;
        run = i;
    }
    tokbuf_put(out, s + run, i - run);
    return i;
}

/* ---------------------------------------------------------------- byte table */

static uint16_t g_b2c[256];
static int16_t g_c2b[0x144];
static bool g_bl_ready;

static void bytelevel_init(void)
{
    /* Printable Latin-1 bytes stand for themselves; the 68 others are
     * shifted to U+0100 and up in byte order (GPT-2's bytes_to_unicode). */
    int k = 0;
    for (int c = 0; c < 0x144; c++) g_c2b[c] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        g_b2c[b] = (uint16_t)(keep ? b : 256 + k++);
        g_c2b[g_b2c[b]] = (int16_t)b;
    }
    __atomic_store_n(&g_bl_ready, true, __ATOMIC_RELEASE);
}

uint32_t bytelevel_char(uint8_t b)
{
    if (!__atomic_load_n(&g_bl_ready, __ATOMIC_ACQUIRE)) bytelevel_init();
    return g_b2c[b];
}

int bytelevel_byte(uint32_t cp)
{
    if (!__atomic_load_n(&g_bl_ready, __ATOMIC_ACQUIRE)) bytelevel_init();
    return cp < 0x144 ? g_c2b[cp] : -1;
}

/* ---------------------------------------------------------------- hashing */

static inline uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }

uint64_t tok_hash(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = rotl64(h ^ (k * 0xbf58476d1ce4e5b9ull), 29) * 0x94d049bb133111ebull;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h ^= k * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    return h;
}

static size_t pow2_for(size_t expect)
{
    size_t c = 64;
    while (c < expect * 2) c *= 2;
    return c;
}

void strmap_init(StrMap *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    size_t cap = pow2_for(expect);
    m->slot = td_malloc(cap * sizeof *m->slot);
    for (size_t i = 0; i < cap; i++) m->slot[i].val = -1;
    m->mask = cap - 1;
}

void strmap_free(StrMap *m)
{
    td_free(m->slot);
    tokbuf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

static void strmap_grow(StrMap *m)
{
    size_t cap = (m->mask + 1) * 2;
    struct StrSlot *old = m->slot;
    size_t old_cap = m->mask + 1;
    m->slot = td_malloc(cap * sizeof *m->slot);
    for (size_t i = 0; i < cap; i++) m->slot[i].val = -1;
    m->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].val < 0) continue;
        size_t j = (size_t)old[i].h & m->mask;
        while (m->slot[j].val >= 0) j = (j + 1) & m->mask;
        m->slot[j] = old[i];
    }
    td_free(old);
}

uint32_t strmap_put(StrMap *m, const char *k, size_t n, int32_t val)
{
    TD_CHECK(val >= 0, "strmap values are ids (>= 0)");
    if ((m->count + 1) * 2 > m->mask + 1) strmap_grow(m);
    uint64_t h = tok_hash(k, n);
    size_t i = (size_t)h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        struct StrSlot *s = &m->slot[i];
        if (s->val < 0) break;
        if (s->h == h && s->len == n && !memcmp(m->keys.p + s->off, k, n)) {
            s->val = val;
            return s->off;
        }
    }
    uint32_t off = (uint32_t)m->keys.n;
    tokbuf_put(&m->keys, k, n);
    m->slot[i] = (struct StrSlot){ h, off, (uint32_t)n, val };
    m->count++;
    return off;
}

int32_t strmap_get(const StrMap *m, const char *k, size_t n)
{
    if (!m->slot) return -1;
    uint64_t h = tok_hash(k, n);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        const struct StrSlot *s = &m->slot[i];
        if (s->val < 0) return -1;
        if (s->h == h && s->len == n && !memcmp(m->keys.p + s->off, k, n)) return s->val;
    }
}

void pairmap_init(PairMap *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    size_t cap = pow2_for(expect);
    m->slot = td_malloc(cap * sizeof *m->slot);
    for (size_t i = 0; i < cap; i++) m->slot[i].rank = -1;
    m->mask = cap - 1;
}

void pairmap_free(PairMap *m)
{
    td_free(m->slot);
    memset(m, 0, sizeof *m);
}

void pairmap_put(PairMap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    TD_CHECK((m->count + 1) * 2 <= m->mask + 1, "pairmap sized too small");
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = (size_t)pair_hash(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        struct PairSlot *s = &m->slot[i];
        if (s->rank < 0) {
            *s = (struct PairSlot){ key, rank, id };
            m->count++;
            return;
        }
        if (s->key == key) {   /* a later duplicate wins, as in HF's HashMap collect */
            s->rank = rank;
            s->id = id;
            return;
        }
    }
}

/* ---------------------------------------------------------------- JSON */

void tok_errf(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

const cJSON *tj_get(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int tj_str(const cJSON *o, const char *key, const char *path, bool required, const char **out,
           char *err, size_t n)
{
    const cJSON *v = tj_get(o, key);
    *out = NULL;
    if (!v) {
        if (!required) return 0;
        tok_errf(err, n, "tokenizer.json: %s.%s is missing", path, key);
        return -1;
    }
    if (!cJSON_IsString(v)) {
        tok_errf(err, n, "tokenizer.json: %s.%s must be a string", path, key);
        return -1;
    }
    *out = v->valuestring;
    return 0;
}

int tj_bool(const cJSON *o, const char *key, const char *path, bool dflt, bool *out, char *err,
            size_t n)
{
    const cJSON *v = tj_get(o, key);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsBool(v)) {
        tok_errf(err, n, "tokenizer.json: %s.%s must be true or false", path, key);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

int tj_int(const cJSON *o, const char *key, const char *path, long dflt, long lo, long hi, long *out,
           char *err, size_t n)
{
    const cJSON *v = tj_get(o, key);
    *out = dflt;
    if (!v) return 0;
    /* the range first: (long) of a double outside long's range is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != (double)(long)v->valuedouble) {
        tok_errf(err, n, "tokenizer.json: %s.%s must be an integer in [%ld, %ld]", path, key, lo, hi);
        return -1;
    }
    *out = (long)v->valuedouble;
    return 0;
}

int tj_known(const cJSON *o, const char *path, const char *const *known, char *err, size_t n)
{
    for (const cJSON *c = o->child; c; c = c->next) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(c->string, known[i]);
        if (!ok) {
            tok_errf(err, n, "tokenizer.json: %s.%s is not supported (unknown option)", path, c->string);
            return -1;
        }
    }
    return 0;
}

int tj_type(const cJSON *o, const char *path, const char **type, char *err, size_t n)
{
    if (!cJSON_IsObject(o)) {
        tok_errf(err, n, "tokenizer.json: %s must be an object", path);
        return -1;
    }
    return tj_str(o, "type", path, true, type, err, n);
}

int tj_pattern(const cJSON *o, const char *path, bool *is_regex, const char **s, char *err, size_t n)
{
    const cJSON *p = tj_get(o, "pattern");
    if (!p || !cJSON_IsObject(p) || !p->child || p->child->next || !cJSON_IsString(p->child) ||
        (strcmp(p->child->string, "String") && strcmp(p->child->string, "Regex"))) {
        tok_errf(err, n, "tokenizer.json: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", path);
        return -1;
    }
    *is_regex = !strcmp(p->child->string, "Regex");
    *s = p->child->valuestring;
    return 0;
}
