/* core/tok/bpe.c - BPE model: loading, word merging, the word cache
 * (bpe.h).  The merge loop follows HF's Word::merge_all (models/bpe/word.rs)
 * step for step, including its check that a popped merge still applies. */
#include "core/tok/bpe.h"
#include "core/common.h"

#include <stdio.h>

#define SEP "\xe2\x96\x81"  /* '▁' (U+2581), SentencePiece's space */

/* The word cache (per scratch, allocated on first use): a word of n <= 24
 * bytes is keyed by n and up to three 64-bit loads that together cover
 * its bytes (word_key), so equal keys mean equal words, exactly.  Short
 * words with few ids go in 32-byte entries, two to a 64-byte set (one
 * cache line per lookup), the rest in 64-byte entries; way 0 is the more
 * recent, a new word evicts way 1. */
#define SMALL_SETS 32768     /* 2 MiB */
#define SMALL_KEY 16
#define SMALL_IDS 3
#define BIG_SETS 4096        /* 512 KiB */
#define BIG_KEY 24
#define BIG_IDS 9

typedef struct {
    uint64_t w[2];
    uint8_t n;               /* word length | 0x80 in byte mode; 0: empty */
    uint8_t nids;
    uint16_t unused;
    int32_t ids[SMALL_IDS];
} SmallEntry;

typedef struct {
    uint64_t w[3];
    uint8_t n, nids;
    uint16_t unused;
    int32_t ids[BIG_IDS];
} BigEntry;

typedef struct {
    int32_t c, prev, next;
    uint32_t len;            /* bytes of the word it covers; 0 once merged away */
} Sym;

typedef struct {
    int32_t rank, pos, id;
    int32_t left, right;     /* the pair when pushed */
} Merge;

struct BpeScratch {
    Sym *sym;
    size_t n_sym, cap_sym;
    Merge *heap;
    size_t n_heap, cap_heap;
    SmallEntry *small;       /* 2 * SMALL_SETS (the word cache) */
    BigEntry *big;           /* 2 * BIG_SETS */
};

/* ---------------------------------------------------------------- load */

void bpe_free(Bpe *m)
{
    strmap_free(&m->vocab);
    strmap_free(&m->byte_vocab);
    pairmap_free(&m->merges);
    td_free(m->id_off);
    td_free(m->id_len);
    td_free(m->prefix);
    td_free(m->suffix);
    td_free(m->sep_keep);
    memset(m, 0, sizeof *m);
}

const char *bpe_id_str(const Bpe *m, int32_t id, size_t *len)
{
    if (id < 0 || id >= m->n_ids || m->id_len[id] == UINT32_MAX) return NULL;
    *len = m->id_len[id];
    return m->vocab.keys.p + m->id_off[id];
}

/* The two sides of merges[i]: "a b" or ["a", "b"]. */
static int merge_sides(const cJSON *e, int i, const char **a, size_t *na, const char **b, size_t *nb, char *err,
                       size_t n)
{
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            tok_errf(err, n, "tokenizer.json: model.merges[%d] \"%s\" is not two tokens separated by one space", i, s);
            return -1;
        }
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
        cJSON_IsString(e->child->next)) {
        *a = e->child->valuestring;
        *na = strlen(*a);
        *b = e->child->next->valuestring;
        *nb = strlen(*b);
        return 0;
    }
    tok_errf(err, n, "tokenizer.json: model.merges[%d] must be \"a b\" or [\"a\", \"b\"]", i);
    return -1;
}

/* Records the last char of a, the left side of a merge whose right side
 * starts with '▁' (bpe.h: splitting before '▁'). */
static void note_sep_keep(Bpe *m, const char *a, size_t na)
{
    size_t b = na - 1;
    while (b > 0 && ((unsigned char)a[b] & 0xc0) == 0x80) b--;
    uint32_t cp = 0;
    if (utf8_next(a + b, na - b, &cp) <= 0) cp = UINT32_MAX;   /* not UTF-8: matches no char */
    for (size_t k = 0; k < m->n_sep_keep; k++)
        if (m->sep_keep[k] == cp) return;
    uint32_t *v = td_malloc((m->n_sep_keep + 1) * sizeof(uint32_t));
    if (m->n_sep_keep) memcpy(v, m->sep_keep, m->n_sep_keep * sizeof(uint32_t));
    td_free(m->sep_keep);
    m->sep_keep = v;
    m->sep_keep[m->n_sep_keep++] = cp;
}

static bool sep_kept(const Bpe *m, uint32_t cp)
{
    for (size_t k = 0; k < m->n_sep_keep; k++)
        if (m->sep_keep[k] == cp) return true;
    return false;
}

static int load_merges(Bpe *m, const cJSON *arr, char *err, size_t n)
{
    if (!cJSON_IsArray(arr)) {
        tok_errf(err, n, "tokenizer.json: model.merges must be an array");
        return -1;
    }
    int count = cJSON_GetArraySize(arr), i = 0;
    pairmap_init(&m->merges, (size_t)count + 1);
    size_t plen = m->prefix ? strlen(m->prefix) : 0;
    TokBuf cat = { 0 };
    int rc = 0;
    for (const cJSON *e = arr->child; e && !rc; e = e->next, i++) {
        const char *a, *b;
        size_t na, nb;
        if ((rc = merge_sides(e, i, &a, &na, &b, &nb, err, n))) break;
        int32_t ia = strmap_get(&m->vocab, a, na), ib = strmap_get(&m->vocab, b, nb);
        if (ia < 0 || ib < 0) {
            tok_errf(err, n, "tokenizer.json: model.merges[%d]: \"%.*s\" is not in the vocab", i,
                     (int)(ia < 0 ? na : nb), ia < 0 ? a : b);
            rc = -1;
            break;
        }
        /* merged token: a + b without b's continuing_subword_prefix */
        size_t skip = nb >= plen ? plen : nb;   /* HF slices &b[prefix_len..] */
        cat.n = 0;
        tokbuf_put(&cat, a, na);
        tokbuf_put(&cat, b + skip, nb - skip);
        int32_t id = strmap_get(&m->vocab, cat.p, cat.n);
        if (id < 0) {
            tok_errf(err, n, "tokenizer.json: model.merges[%d]: the merged token \"%.*s\" is not in the vocab", i,
                     (int)cat.n, cat.p);
            rc = -1;
            break;
        }
        pairmap_put(&m->merges, ia, ib, i, id);
        if (nb >= 3 && !memcmp(b, SEP, 3) && na) note_sep_keep(m, a, na);
    }
    tokbuf_free(&cat);
    return rc;
}

/* The raw bytes a ByteLevel-char token stands for; false when some char
 * is not a ByteLevel char. */
static bool unmap_bytes(const char *s, size_t n, TokBuf *out)
{
    out->n = 0;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_next(s + i, n - i, &cp);
        int b = l > 0 ? bytelevel_byte(cp) : -1;
        if (b < 0) return false;
        tokbuf_putc(out, (char)b);
        i += (size_t)l;
    }
    return true;
}

int bpe_load(Bpe *m, const cJSON *model, bool with_bytes, char *err, size_t n)
{
    memset(m, 0, sizeof *m);
    m->unk = -1;
    static const char *const known[] = { "type", "dropout", "unk_token", "continuing_subword_prefix",
                                         "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                         "vocab", "merges", NULL };
    const cJSON *dropout = tj_get(model, "dropout");
    const char *unk, *prefix, *suffix;
    if (tj_known(model, "model", known, err, n) || tj_str(model, "unk_token", "model", false, &unk, err, n) ||
        tj_str(model, "continuing_subword_prefix", "model", false, &prefix, err, n) ||
        tj_str(model, "end_of_word_suffix", "model", false, &suffix, err, n) ||
        tj_bool(model, "fuse_unk", "model", false, &m->fuse_unk, err, n) ||
        tj_bool(model, "byte_fallback", "model", false, &m->byte_fallback, err, n) ||
        tj_bool(model, "ignore_merges", "model", false, &m->ignore_merges, err, n))
        return -1;
    if (dropout && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0)) {
        tok_errf(err, n, "tokenizer.json: model.dropout is not supported (BPE dropout samples at random)");
        return -1;
    }
    if (prefix && *prefix) m->prefix = td_strdup(prefix);
    if (suffix && *suffix) m->suffix = td_strdup(suffix);
    const cJSON *vocab = tj_get(model, "vocab");
    if (!cJSON_IsObject(vocab)) {
        tok_errf(err, n, "tokenizer.json: model.vocab must be an object (token -> id)");
        bpe_free(m);
        return -1;
    }
    int count = cJSON_GetArraySize(vocab);
    strmap_init(&m->vocab, (size_t)count + 1);
    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v < TOK_MAX_IDS) || v != (double)(int32_t)v) {
            tok_errf(err, n, "tokenizer.json: model.vocab[\"%s\"] must be an id (an integer in [0, %d))", e->string,
                     TOK_MAX_IDS);
            bpe_free(m);
            return -1;
        }
        strmap_put(&m->vocab, e->string, strlen(e->string), (int32_t)v);
        if ((int32_t)v > max_id) max_id = (int32_t)v;
    }
    m->n_ids = max_id + 1;
    m->id_off = td_malloc((size_t)(m->n_ids + 1) * sizeof(uint32_t));
    m->id_len = td_malloc((size_t)(m->n_ids + 1) * sizeof(uint32_t));
    for (int32_t i = 0; i < m->n_ids; i++) m->id_len[i] = UINT32_MAX;
    for (size_t i = 0; i <= m->vocab.mask; i++) {
        const struct StrSlot *s = &m->vocab.slot[i];
        if (s->val < 0) continue;
        m->id_off[s->val] = s->off;
        m->id_len[s->val] = s->len;
    }
    if (unk) {
        m->unk = strmap_get(&m->vocab, unk, strlen(unk));
        if (m->unk < 0) {
            tok_errf(err, n, "tokenizer.json: model.unk_token \"%s\" is not in the vocab", unk);
            bpe_free(m);
            return -1;
        }
    }
    if (load_merges(m, tj_get(model, "merges"), err, n)) {
        bpe_free(m);
        return -1;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->fallback[b] = strmap_get(&m->vocab, name, 6);
    }
    /* splitting before '▁' (bpe.h) */
    m->sep_split = !m->prefix && !m->suffix && strmap_get(&m->vocab, SEP, 3) >= 0;
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        m->sep_after[c] = m->sep_split && strmap_get(&m->vocab, &ch, 1) >= 0 && !sep_kept(m, (uint32_t)c);
    }
    m->byte_ok = with_bytes && !m->prefix && !m->suffix;
    if (m->byte_ok) {
        for (int b = 0; b < 256; b++) {
            char c[4];
            m->byte_id[b] = strmap_get(&m->vocab, c, (size_t)utf8_put(bytelevel_char((uint8_t)b), c));
        }
        strmap_init(&m->byte_vocab, (size_t)count + 1);
        TokBuf raw = { 0 };
        for (size_t i = 0; i <= m->vocab.mask; i++) {
            const struct StrSlot *s = &m->vocab.slot[i];
            if (s->val >= 0 && unmap_bytes(m->vocab.keys.p + s->off, s->len, &raw))
                strmap_put(&m->byte_vocab, raw.p, raw.n, s->val);
        }
        tokbuf_free(&raw);
    }
    return 0;
}

/* ---------------------------------------------------------------- scratch */

BpeScratch *bpe_scratch_new(void)
{
    BpeScratch *sc = td_calloc(sizeof(BpeScratch));
    /* zeroed pages: the memory is only touched as words come */
    sc->small = td_calloc(2 * SMALL_SETS * sizeof(SmallEntry));
    sc->big = td_calloc(2 * BIG_SETS * sizeof(BigEntry));
    return sc;
}

void bpe_scratch_free(BpeScratch *sc)
{
    if (!sc) return;
    td_free(sc->sym);
    td_free(sc->heap);
    td_free(sc->small);
    td_free(sc->big);
    td_free(sc);
}

static void sym_add(BpeScratch *sc, int32_t c, uint32_t len)
{
    if (sc->n_sym == sc->cap_sym) {
        size_t cap = sc->cap_sym ? 2 * sc->cap_sym : 256;
        Sym *v = td_malloc(cap * sizeof(Sym));
        if (sc->n_sym) memcpy(v, sc->sym, sc->n_sym * sizeof(Sym));
        td_free(sc->sym);
        sc->sym = v;
        sc->cap_sym = cap;
    }
    int32_t i = (int32_t)sc->n_sym++;
    sc->sym[i] = (Sym){ c, i - 1, -1, len };
    if (i > 0) sc->sym[i - 1].next = i;
}

/* ---------------------------------------------------------------- heap */

static inline bool merge_before(const Merge *a, const Merge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(BpeScratch *sc, Merge m)
{
    if (sc->n_heap == sc->cap_heap) {
        size_t cap = sc->cap_heap ? 2 * sc->cap_heap : 256;
        Merge *v = td_malloc(cap * sizeof(Merge));
        if (sc->n_heap) memcpy(v, sc->heap, sc->n_heap * sizeof(Merge));
        td_free(sc->heap);
        sc->heap = v;
        sc->cap_heap = cap;
    }
    size_t i = sc->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_before(&m, &sc->heap[p])) break;
        sc->heap[i] = sc->heap[p];
        i = p;
    }
    sc->heap[i] = m;
}

static Merge heap_pop(BpeScratch *sc)
{
    Merge top = sc->heap[0], last = sc->heap[--sc->n_heap];
    size_t i = 0, n = sc->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const Merge *best = &last;
        if (l < n && merge_before(&sc->heap[l], best)) {
            m = l;
            best = &sc->heap[l];
        }
        if (r < n && merge_before(&sc->heap[r], best)) m = r;
        if (m == i) break;
        sc->heap[i] = sc->heap[m];
        i = m;
    }
    if (n) sc->heap[i] = last;
    return top;
}

/* ---------------------------------------------------------------- merging */

/* HF's Word::merge_all over sc->sym. */
static void merge_all(const Bpe *m, BpeScratch *sc)
{
    Sym *s = sc->sym;
    sc->n_heap = 0;
    /* the first lookups are independent: let their cache misses overlap */
    for (size_t i = 0; i + 1 < sc->n_sym; i++) pairmap_prefetch(&m->merges, s[i].c, s[i + 1].c);
    for (size_t i = 0; i + 1 < sc->n_sym; i++) {
        int32_t rank, id;
        if (pairmap_get(&m->merges, s[i].c, s[i + 1].c, &rank, &id))
            heap_push(sc, (Merge){ rank, (int32_t)i, id, s[i].c, s[i + 1].c });
    }
    while (sc->n_heap) {
        Merge top = heap_pop(sc);
        s = sc->sym;
        Sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;   /* merged away, or last */
        int32_t next_pos = cur->next;
        Sym right = s[next_pos];
        int32_t rank, id;
        /* HF's staleness test: the pair now there must merge into the same
         * id.  Unchanged ids pass without a lookup. */
        if ((cur->c != top.left || right.c != top.right) &&
            (!pairmap_get(&m->merges, cur->c, right.c, &rank, &id) || id != top.id))
            continue;
        cur->c = top.id;
        cur->len += right.len;
        cur->next = right.next;
        s[next_pos].len = 0;
        if (right.next >= 0) s[right.next].prev = top.pos;
        if (cur->prev >= 0 && pairmap_get(&m->merges, s[cur->prev].c, cur->c, &rank, &id))
            heap_push(sc, (Merge){ rank, cur->prev, id, s[cur->prev].c, cur->c });
        if (cur->next >= 0 && pairmap_get(&m->merges, cur->c, s[cur->next].c, &rank, &id))
            heap_push(sc, (Merge){ rank, top.pos, id, cur->c, s[cur->next].c });
    }
}

/* Id of one char of the word (with prefix/suffix), or -1. */
static int32_t char_id(const Bpe *m, const char *c, size_t l, bool first, bool last, TokBuf *tmp)
{
    if ((first || !m->prefix) && (!last || !m->suffix)) return strmap_get(&m->vocab, c, l);
    tmp->n = 0;
    if (!first && m->prefix) tokbuf_put(tmp, m->prefix, strlen(m->prefix));
    tokbuf_put(tmp, c, l);
    if (last && m->suffix) tokbuf_put(tmp, m->suffix, strlen(m->suffix));
    return strmap_get(&m->vocab, tmp->p, tmp->n);
}

/* HF's merge_word: the initial symbols of s[0..n), then merge_all. */
__attribute__((noinline)) static void merge_word(const Bpe *m, BpeScratch *sc, const char *s, size_t n, bool bytes)
{
    sc->n_sym = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    TokBuf tmp = { 0 };
    size_t i = 0;
    while (i < n) {
        size_t l = 1;
        int32_t id;
        char mapped[4];
        const char *cs = s + i;   /* the char as the vocab spells it */
        size_t cl = 1;
        if (bytes) {
            id = m->byte_id[(uint8_t)s[i]];
            cl = (size_t)utf8_put(bytelevel_char((uint8_t)s[i]), mapped);
            cs = mapped;
        } else {
            uint32_t cp;
            int k = utf8_next(s + i, n - i, &cp);
            l = cl = k > 0 ? (size_t)k : 1;
            id = char_id(m, s + i, l, i == 0, i + l == n, &tmp);
        }
        if (id >= 0) {
            if (unk_id >= 0) {
                sym_add(sc, unk_id, unk_len);
                unk_id = -1;
            }
            sym_add(sc, id, (uint32_t)l);
        } else {
            bool done = false;
            if (m->byte_fallback) {
                /* the bytes of the looked-up string (prefix/suffix included) */
                const char *bs = cs;
                size_t bn = cl;
                if (!bytes && ((i > 0 && m->prefix) || (i + l == n && m->suffix))) {
                    bs = tmp.p;
                    bn = tmp.n;
                }
                bool all = true;
                for (size_t k = 0; k < bn && all; k++) all = m->fallback[(uint8_t)bs[k]] >= 0;
                if (all) {   /* as HF: added without flushing a pending unk */
                    for (size_t k = 0; k < bn; k++) sym_add(sc, m->fallback[(uint8_t)bs[k]], 1);
                    done = true;
                }
            }
            if (!done && m->unk >= 0) {
                if (unk_id >= 0 && m->fuse_unk) unk_len += (uint32_t)l;
                else {
                    if (unk_id >= 0) sym_add(sc, unk_id, unk_len);
                    unk_id = m->unk;
                    unk_len = (uint32_t)l;
                }
            }
            /* no fallback and no unk: HF drops the char */
        }
        i += l;
    }
    if (unk_id >= 0) sym_add(sc, unk_id, unk_len);
    tokbuf_free(&tmp);
    merge_all(m, sc);
}

static inline uint64_t load8(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t load4(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The cache key of s[0..n), 1 <= n <= BIG_KEY: w[0..2] (unused ones 0)
 * read s with overlapping loads, so that with n they determine s. */
static inline void word_key(const char *s, size_t n, uint64_t w[3])
{
    w[1] = w[2] = 0;
    if (n >= 8) {
        w[0] = load8(s);
        if (n > 16) {
            w[1] = load8(s + 8);
            w[2] = load8(s + n - 8);
        } else if (n > 8)
            w[1] = load8(s + n - 8);
    } else if (n >= 4)
        w[0] = load4(s) | load4(s + n - 4) << 32;
    else
        w[0] = (uint64_t)(uint8_t)s[0] | (uint64_t)(uint8_t)s[n >> 1] << 8 | (uint64_t)(uint8_t)s[n - 1] << 16;
}

static inline uint64_t key_hash(const uint64_t w[3], unsigned nk)
{
    uint64_t h = (w[0] ^ nk) * 0x9e3779b97f4a7c15ull;
    h ^= w[1] * 0xbf58476d1ce4e5b9ull;
    h ^= w[2] * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

static inline void put_ids(TokIds *out, const int32_t *ids, size_t n, size_t max)
{
    if (out->n + max > out->cap) tokids_reserve(out, max);
    memcpy(out->ids + out->n, ids, max * sizeof(int32_t));   /* a fixed-size copy; n <= max count */
    out->n += n;
}

/* word_ids past the small table: the big table, else merging (and
 * caching the result).  w, nk, h: the word's key and hash (0s when the
 * word is too long to cache). */
__attribute__((noinline)) static void word_ids_slow(const Bpe *m, BpeScratch *sc, const char *s, size_t n,
                                                    bool bytes, TokIds *out, const uint64_t w[3], unsigned nk,
                                                    uint64_t h)
{
    BigEntry *bs = NULL;
    if (n <= BIG_KEY) {
        bs = &sc->big[2 * ((h >> 32) & (BIG_SETS - 1))];
        for (int k = 0; k < 2; k++) {
            BigEntry *e = &bs[k];
            if (e->n != nk || e->w[0] != w[0] || e->w[1] != w[1] || e->w[2] != w[2]) continue;
            put_ids(out, e->ids, e->nids, BIG_IDS);
            if (k) {   /* most recent first */
                BigEntry t = bs[0];
                bs[0] = bs[1];
                bs[1] = t;
            }
            return;
        }
    }
    merge_word(m, sc, s, n, bytes);
    size_t first = out->n;
    for (size_t i = 0; i < sc->n_sym; i++)
        if (sc->sym[i].len) tokids_push(out, sc->sym[i].c);
    size_t got = out->n - first;
    if (n <= SMALL_KEY && got <= SMALL_IDS) {
        SmallEntry *ss = &sc->small[2 * (h & (SMALL_SETS - 1))];
        ss[1] = ss[0];
        SmallEntry *e = &ss[0];
        *e = (SmallEntry){ .w = { w[0], w[1] }, .n = (uint8_t)nk, .nids = (uint8_t)got };
        if (got) memcpy(e->ids, out->ids + first, got * sizeof(int32_t));   /* (out->ids is NULL while empty) */
    } else if (bs && got <= BIG_IDS) {
        bs[1] = bs[0];
        BigEntry *e = &bs[0];
        *e = (BigEntry){ .w = { w[0], w[1], w[2] }, .n = (uint8_t)nk, .nids = (uint8_t)got };
        if (got) memcpy(e->ids, out->ids + first, got * sizeof(int32_t));   /* (out->ids is NULL while empty) */
    }
}

/* The ids of word s[0..n) by merging, through the cache: the small table
 * here, the rest in word_ids_slow. */
__attribute__((always_inline)) static inline void word_ids(const Bpe *m, BpeScratch *sc, const char *s, size_t n, bool bytes, TokIds *out)
{
    uint64_t w[3] = { 0, 0, 0 }, h = 0;
    unsigned nk = (unsigned)n | (bytes ? 0x80u : 0);
    if (n <= BIG_KEY) {
        word_key(s, n, w);
        h = key_hash(w, nk);
        if (n <= SMALL_KEY) {
            SmallEntry *ss = &sc->small[2 * (h & (SMALL_SETS - 1))];
            for (int k = 0; k < 2; k++) {
                SmallEntry *e = &ss[k];
                if (e->n != nk || e->w[0] != w[0] || e->w[1] != w[1]) continue;
                put_ids(out, e->ids, e->nids, SMALL_IDS);
                if (k) {
                    SmallEntry t = ss[0];
                    ss[0] = ss[1];
                    ss[1] = t;
                }
                return;
            }
        }
    }
    word_ids_slow(m, sc, s, n, bytes, out, w, nk, h);
}

/* May the word be cut between the char ending at s[i) and the '▁' at s[i]
 * (bpe.h)?  i > 0. */
static bool sep_cut(const Bpe *m, const char *s, size_t i)
{
    unsigned char c = (unsigned char)s[i - 1];
    if (c < 0x80) return m->sep_after[c];
    size_t b = i - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
    uint32_t cp;
    if (utf8_next(s + b, i - b, &cp) <= 0) return false;
    return !sep_kept(m, cp) && strmap_get(&m->vocab, s + b, i - b) >= 0;
}

void bpe_tokenize(const Bpe *m, BpeScratch *sc, const char *s, size_t n, bool bytes, TokIds *out)
{
    if (!n) return;
    if (m->ignore_merges) {   /* HF looks the whole word up first */
        int32_t id = bytes ? strmap_get(&m->byte_vocab, s, n) : strmap_get(&m->vocab, s, n);
        if (id >= 0) {
            tokids_push(out, id);
            return;
        }
    }
    if (bytes || !m->sep_split) {
        word_ids(m, sc, s, n, bytes, out);
        return;
    }
    size_t start = 0, i = 1;
    while (i + 3 <= n) {
        const char *p = memchr(s + i, SEP[0], n - i - 2);
        if (!p) break;
        i = (size_t)(p - s);
        if (!memcmp(p, SEP, 3) && sep_cut(m, s, i)) {
            word_ids(m, sc, s + start, i - start, false, out);
            start = i;
        }
        i++;
    }
    word_ids(m, sc, s + start, n - start, false, out);
}
