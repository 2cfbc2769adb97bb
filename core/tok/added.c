/* core/tok/added.c - added tokens: loading, tries, HF's find_matches
 * (added.h). */
#include "core/tok/added.h"
#include "core/common.h"
#include "core/tok/unicode.h"

#include <stdio.h>

static int32_t trie_new_node(AddedTrie *t, uint8_t byte)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        struct TrieNode *v = td_malloc(cap * sizeof *v);
        if (t->n) memcpy(v, t->node, t->n * sizeof *v);
        td_free(t->node);
        t->node = v;
        t->cap = cap;
    }
    t->node[t->n] = (struct TrieNode){ -1, -1, -1, byte };
    return (int32_t)t->n++;
}

static void trie_init(AddedTrie *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 256; i++) t->root_child[i] = -1;
    t->first = -1;
}

static void trie_insert(AddedTrie *t, const char *s, size_t n, int32_t tok)
{
    if (!n) return;
    int32_t cur = t->root_child[(uint8_t)s[0]];
    if (cur < 0) cur = t->root_child[(uint8_t)s[0]] = trie_new_node(t, (uint8_t)s[0]);
    for (size_t i = 1; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->node[cur].child;
        while (c >= 0 && t->node[c].byte != b) c = t->node[c].next;
        if (c < 0) {
            c = trie_new_node(t, b);
            t->node[c].next = t->node[cur].child;
            t->node[cur].child = c;
        }
        cur = c;
    }
    if (t->node[cur].tok < 0) t->node[cur].tok = tok;   /* first token with this content wins */
    t->first = !t->any || t->first == (uint8_t)s[0] ? (uint8_t)s[0] : -1;
    t->any = true;
}

/* Longest token matching at s[0..n): its length and index, or 0. */
static size_t trie_longest(const AddedTrie *t, const char *s, size_t n, int32_t *tok)
{
    int32_t cur = t->root_child[(uint8_t)s[0]];
    size_t best = 0;
    for (size_t i = 1; cur >= 0; i++) {
        if (t->node[cur].tok >= 0) {
            best = i;
            *tok = t->node[cur].tok;
        }
        if (i >= n) break;
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->node[cur].child;
        while (c >= 0 && t->node[c].byte != b) c = t->node[c].next;
        cur = c;
    }
    return best;
}

static void trie_free(AddedTrie *t)
{
    td_free(t->node);
    memset(t, 0, sizeof *t);
}

void added_free(Added *a)
{
    for (int i = 0; i < a->n; i++) td_free(a->tok[i].content);
    td_free(a->tok);
    strmap_free(&a->by_content);
    trie_free(&a->raw);
    trie_free(&a->norm);
    memset(a, 0, sizeof *a);
}

int added_load(Added *a, const cJSON *j, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    trie_init(&a->raw);
    trie_init(&a->norm);
    strmap_init(&a->by_content, 16);
    if (!j) return 0;
    if (!cJSON_IsArray(j)) {
        tok_errf(err, n, "tokenizer.json: added_tokens must be an array");
        return -1;
    }
    int m = cJSON_GetArraySize(j), i = 0;
    a->tok = td_calloc((size_t)(m ? m : 1) * sizeof(AddedTok));
    static const char *const known[] = { "id", "content", "single_word", "lstrip", "rstrip", "normalized",
                                         "special", NULL };
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        if (!cJSON_IsObject(c)) {
            tok_errf(err, n, "tokenizer.json: %s must be an object", path);
            return -1;
        }
        AddedTok t = { 0 };
        const char *content;
        long id;
        if (tj_known(c, path, known, err, n) || tj_str(c, "content", path, true, &content, err, n) ||
            tj_int(c, "id", path, -1, 0, TOK_MAX_IDS - 1, &id, err, n) ||
            tj_bool(c, "single_word", path, false, &t.single_word, err, n) ||
            tj_bool(c, "lstrip", path, false, &t.lstrip, err, n) || tj_bool(c, "rstrip", path, false, &t.rstrip, err, n) ||
            tj_bool(c, "normalized", path, true, &t.normalized, err, n) ||
            tj_bool(c, "special", path, false, &t.special, err, n))
            return -1;
        if (id < 0) {
            tok_errf(err, n, "tokenizer.json: %s.id is missing", path);
            return -1;
        }
        if (!*content) continue;   /* HF ignores empty added tokens */
        t.len = strlen(content);
        t.content = td_strdup(content);
        t.id = (int32_t)id;
        strmap_put(&a->by_content, t.content, t.len, a->n);
        a->tok[a->n++] = t;
    }
    return 0;
}

int added_build(Added *a, const Normalizer *nz, NormScratch *ns, char *err, size_t n)
{
    /* HF builds the tries from the special tokens, then the others. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < a->n; i++) {
            const AddedTok *t = &a->tok[i];
            if (t->special != (pass == 0)) continue;
            if (!t->normalized) {
                trie_insert(&a->raw, t->content, t->len, i);
                continue;
            }
            TokBuf nb = { 0 };
            if (norm_apply(nz, ns, &nb, t->content, t->len, err, n)) {
                tokbuf_free(&nb);
                return -1;
            }
            trie_insert(&a->norm, nb.p, nb.n, i);
            tokbuf_free(&nb);
        }
    return 0;
}

/* The char ending at s[n) (n > 0). */
static uint32_t last_char(const char *s, size_t n)
{
    size_t b = n - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xc0) == 0x80) b--;
    uint32_t cp = 0;
    utf8_next(s + b, n - b, &cp);
    return cp;
}

void added_split(const Added *a, const AddedTrie *tr, const char *s, size_t n, uint32_t base, bool first,
                 Pieces *out)
{
    size_t start_offset = 0, pos = 0;
    while (tr->any && pos < n) {
        /* leftmost start with a match, longest match there */
        size_t ms = pos, len = 0;
        int32_t ti = -1;
        for (; ms < n; ms++) {
            if (tr->first >= 0) {   /* e.g. every token starts with '<' */
                const char *q = memchr(s + ms, tr->first, n - ms);
                if (!q) {
                    ms = n;
                    break;
                }
                ms = (size_t)(q - s);
            }
            if (tr->root_child[(uint8_t)s[ms]] < 0) continue;
            len = trie_longest(tr, s + ms, n - ms, &ti);
            if (len) break;
        }
        if (!len) break;
        size_t start = ms, stop = ms + len;
        pos = stop;   /* the matcher resumes after the raw match, kept or not */
        const AddedTok *t = &a->tok[ti];
        if (t->single_word) {
            uint32_t cp;
            bool start_space = start == 0 || !uni_is_word(last_char(s, start));
            bool stop_space = stop == n || (utf8_next(s + stop, n - stop, &cp) > 0 && !uni_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (t->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                uint32_t cp = last_char(s, ns);
                if (!uni_is_whitespace(cp)) break;
                char tmp[4];
                ns -= (size_t)utf8_put(cp, tmp);
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (t->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int l = utf8_next(s + stop, n - stop, &cp);
                if (l <= 0 || !uni_is_whitespace(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start)
            pieces_push(out, base + (uint32_t)start_offset, (uint32_t)(start - start_offset), -1,
                        first && start_offset == 0 ? PIECE_FIRST : 0);
        pieces_push(out, base + (uint32_t)start, (uint32_t)(stop - start), t->id, 0);
        start_offset = stop;
    }
    if (start_offset < n)
        pieces_push(out, base + (uint32_t)start_offset, (uint32_t)(n - start_offset), -1,
                    first && start_offset == 0 ? PIECE_FIRST : 0);
}
