/* core/tok/tokenizer.c - loading a tokenizer, the encode pipeline, decode,
 * streams and the special ids (tokenizer.h). */
#include "core/tok/tokenizer.h"
#include "core/common.h"
#include "core/tok/added.h"
#include "core/tok/bpe.h"
#include "core/tok/decode.h"
#include "core/tok/normalize.h"
#include "core/tok/post.h"
#include "core/tok/pretok.h"
#include "core/tok/regex.h"
#include "core/tok/tok_util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define TOK_SLOTS 4   /* encodes that may run at once without waiting */

typedef struct {
    pthread_mutex_t mu;
    TokBuf arena, nbuf;
    Pieces a, b, tmp;
    TokSpans sp;
    TokRegexScratch *rx;
    NormScratch ns;            /* ns.rx = rx */
    BpeScratch *bpe;
} Slot;

struct Tokenizer {
    bool bytes;                /* the built-in byte-level tokenizer */
    char *json, *config;
    size_t json_len, config_len;
    Normalizer *norm;
    PreTok *pre;
    Bpe bpe;
    Added added;
    PostProc post;
    Decoder *dec;
    int32_t V;
    int32_t *added_of;         /* id -> index into added.tok, or -1 (V) */
    uint8_t *special;          /* id -> special added token (V) */
    int32_t bos, eos, pad;
    int32_t *stops;
    size_t n_stops;
    char byte_str[256];        /* byte-level: the string of id b is byte_str + b */
    Slot slot[TOK_SLOTS];
};

/* End-of-turn / end-of-text tokens that stop a generation when the
 * vocabulary has them as special tokens (ChatML, Llama 2/3, DeepSeek,
 * Gemma, Phi). */
static const char *const STOP_TOKENS[] = {
    "<|im_end|>", "<|endoftext|>", "</s>", "\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c",
    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<|return|>", NULL,
};

/* transformers classes whose fast tokenizer rebuilds the post-processor
 * from add_bos_token / add_eos_token (update_post_processor), with the
 * class defaults of those two. */
static const struct {
    const char *cls;
    bool bos, eos;
} BOS_EOS_CLASSES[] = {
    { "LlamaTokenizer", true, false },     { "LlamaTokenizerFast", true, false },
    { "CodeLlamaTokenizer", true, false }, { "CodeLlamaTokenizerFast", true, false },
    { "GemmaTokenizer", true, false },     { "GemmaTokenizerFast", true, false },
    { "CohereTokenizer", true, false },    { "CohereTokenizerFast", true, false },
    { "GPTNeoXTokenizer", false, false },  { "GPTNeoXTokenizerFast", false, false },
    { NULL, false, false },
};

/* ---------------------------------------------------------------- slots */

static void slot_init(Slot *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

static void slot_free(Slot *s)
{
    tokbuf_free(&s->arena);
    tokbuf_free(&s->nbuf);
    pieces_free(&s->a);
    pieces_free(&s->b);
    pieces_free(&s->tmp);
    spans_free(&s->sp);
    norm_scratch_free(&s->ns);
    tokregex_scratch_free(s->rx);
    bpe_scratch_free(s->bpe);
    pthread_mutex_destroy(&s->mu);
}

static Slot *slot_take(const Tokenizer *t)
{
    Tokenizer *m = (Tokenizer *)t;   /* the slots are the one mutable part */
    for (int i = 0; i < TOK_SLOTS; i++)
        if (pthread_mutex_trylock(&m->slot[i].mu) == 0) return &m->slot[i];
    Slot *s = &m->slot[(size_t)pthread_self() % TOK_SLOTS];
    pthread_mutex_lock(&s->mu);
    return s;
}

static void slot_give(Slot *s) { pthread_mutex_unlock(&s->mu); }

/* ---------------------------------------------------------------- lifecycle */

void tok_free(Tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < TOK_SLOTS; i++) slot_free(&t->slot[i]);
    norm_free(t->norm);
    pretok_free(t->pre);
    bpe_free(&t->bpe);
    added_free(&t->added);
    post_free(&t->post);
    dec_free(t->dec);
    td_free(t->added_of);
    td_free(t->special);
    td_free(t->stops);
    td_free(t->json);
    td_free(t->config);
    td_free(t);
}

static Tokenizer *tok_new(void)
{
    Tokenizer *t = td_calloc(sizeof *t);
    for (int i = 0; i < TOK_SLOTS; i++) slot_init(&t->slot[i]);
    t->bos = t->eos = t->pad = -1;
    return t;
}

Tokenizer *tok_byte_level(void)
{
    Tokenizer *t = tok_new();
    t->bytes = true;
    t->V = 256;
    for (int b = 0; b < 256; b++) t->byte_str[b] = (char)b;
    char err[64];
    TD_CHECK(dec_load(&t->dec, NULL, "decoder", true, false, err, sizeof err) == 0, "byte decoder: %s", err);
    return t;
}

bool tok_is_byte_level(const Tokenizer *t) { return t->bytes; }
int32_t tok_vocab_size(const Tokenizer *t) { return t->V; }

/* The content of a special-token entry of tokenizer_config.json: a string
 * or an AddedToken object; NULL when absent or null. */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = cfg ? tj_get(cfg, key) : NULL;
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = tj_get(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void add_stop(Tokenizer *t, int32_t id)
{
    if (id < 0) return;
    for (size_t i = 0; i < t->n_stops; i++)
        if (t->stops[i] == id) return;
    t->stops[t->n_stops++] = id;
}

/* transformers' update_post_processor for the classes that have it. */
static int class_post_processor(Tokenizer *t, const cJSON *cfg, char *err, size_t n)
{
    const char *cls = cfg ? (cJSON_IsString(tj_get(cfg, "tokenizer_class")) ? tj_get(cfg, "tokenizer_class")->valuestring : NULL) : NULL;
    if (!cls) return 0;
    int k = 0;
    while (BOS_EOS_CLASSES[k].cls && strcmp(BOS_EOS_CLASSES[k].cls, cls)) k++;
    if (!BOS_EOS_CLASSES[k].cls) return 0;
    bool add_bos = BOS_EOS_CLASSES[k].bos, add_eos = BOS_EOS_CLASSES[k].eos;
    const cJSON *b = tj_get(cfg, "add_bos_token"), *e = tj_get(cfg, "add_eos_token");
    if (b) add_bos = cJSON_IsTrue(b);
    if (e) add_eos = cJSON_IsTrue(e);
    post_free(&t->post);
    memset(&t->post, 0, sizeof t->post);
    if (add_bos) {
        if (t->bos < 0) {
            tok_errf(err, n, "tokenizer_config.json: add_bos_token is true but bos_token is %s",
                     config_token(cfg, "bos_token") ? "not in the vocabulary" : "missing");
            return -1;
        }
        tokids_push(&t->post.pre, t->bos);
    }
    if (add_eos) {
        if (t->eos < 0) {
            tok_errf(err, n, "tokenizer_config.json: add_eos_token is true but eos_token is %s",
                     config_token(cfg, "eos_token") ? "not in the vocabulary" : "missing");
            return -1;
        }
        tokids_push(&t->post.post, t->eos);
    }
    return 0;
}

/* Builds t from parsed JSON. */
static int build(Tokenizer *t, const cJSON *j, const cJSON *cfg, char *err, size_t n)
{
    static const char *const top[] = { "version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "model", "post_processor", "decoder", NULL };
    if (!cJSON_IsObject(j)) {
        tok_errf(err, n, "tokenizer.json: the top level must be an object");
        return -1;
    }
    if (tj_known(j, "(top level)", top, err, n)) return -1;
    const cJSON *model = tj_get(j, "model");
    if (!cJSON_IsObject(model)) {
        tok_errf(err, n, "tokenizer.json: model is missing");
        return -1;
    }
    const char *mtype;
    if (tj_str(model, "type", "model", false, &mtype, err, n)) return -1;
    if (mtype ? strcmp(mtype, "BPE") : !tj_get(model, "merges")) {
        tok_errf(err, n, "tokenizer.json: model.type \"%s\" is not supported (BPE only)", mtype ? mtype : "(none)");
        return -1;
    }
    const cJSON *aps = cfg ? tj_get(cfg, "add_prefix_space") : NULL;
    if (norm_load(&t->norm, tj_get(j, "normalizer"), "normalizer", err, n) ||
        pretok_load(&t->pre, tj_get(j, "pre_tokenizer"), "pre_tokenizer", aps && cJSON_IsTrue(aps), err, n))
        return -1;
    if (bpe_load(&t->bpe, model, pretok_ends_bytelevel(t->pre), err, n)) return -1;
    pretok_set_bytes_out(t->pre, t->bpe.byte_ok);
    if (added_load(&t->added, tj_get(j, "added_tokens"), err, n)) return -1;
    /* an added token that is in the model vocabulary has the model's id (HF) */
    for (int i = 0; i < t->added.n; i++) {
        AddedTok *a = &t->added.tok[i];
        int32_t v = strmap_get(&t->bpe.vocab, a->content, a->len);
        if (v >= 0) a->id = v;
    }
    NormScratch ns = { .rx = tokregex_scratch_new() };
    int rc = added_build(&t->added, t->norm, &ns, err, n);
    norm_scratch_free(&ns);
    tokregex_scratch_free(ns.rx);
    if (rc) return -1;

    t->V = t->bpe.n_ids;
    for (int i = 0; i < t->added.n; i++)
        if (t->added.tok[i].id + 1 > t->V) t->V = t->added.tok[i].id + 1;
    t->added_of = td_malloc((size_t)t->V * sizeof(int32_t));
    t->special = td_calloc((size_t)t->V);
    for (int32_t i = 0; i < t->V; i++) t->added_of[i] = -1;
    for (int i = 0; i < t->added.n; i++) {
        t->added_of[t->added.tok[i].id] = i;
        if (t->added.tok[i].special) t->special[t->added.tok[i].id] = 1;
    }

    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token"),
               *pad = config_token(cfg, "pad_token");
    t->bos = bos ? tok_str_to_id(t, bos, strlen(bos)) : -1;
    t->eos = eos ? tok_str_to_id(t, eos, strlen(eos)) : -1;
    t->pad = pad ? tok_str_to_id(t, pad, strlen(pad)) : -1;
    t->stops = td_malloc((sizeof STOP_TOKENS / sizeof STOP_TOKENS[0] + 1) * sizeof(int32_t));
    add_stop(t, t->eos);
    for (int i = 0; STOP_TOKENS[i]; i++) {
        int32_t id = tok_str_to_id(t, STOP_TOKENS[i], strlen(STOP_TOKENS[i]));
        if (id >= 0 && t->special[id]) add_stop(t, id);
    }
    qsort(t->stops, t->n_stops, sizeof(int32_t), cmp_i32);

    if (post_load(&t->post, tj_get(j, "post_processor"), "post_processor", err, n)) return -1;
    for (size_t i = 0; i < t->post.pre.n + t->post.post.n; i++) {
        int32_t id = i < t->post.pre.n ? t->post.pre.ids[i] : t->post.post.ids[i - t->post.pre.n];
        if (id >= t->V) {
            tok_errf(err, n, "tokenizer.json: post_processor adds id %d, outside the vocabulary (V = %d)", id, t->V);
            return -1;
        }
    }
    if (class_post_processor(t, cfg, err, n)) return -1;
    const cJSON *clean = cfg ? tj_get(cfg, "clean_up_tokenization_spaces") : NULL;
    return dec_load(&t->dec, tj_get(j, "decoder"), "decoder", false, clean && cJSON_IsTrue(clean), err, n);
}

/* Parses text as JSON; -1 with err naming file and byte offset. */
static cJSON *parse_json(const char *text, size_t len, const char *file, char *err, size_t n)
{
    /* JSON is UTF-8 (RFC 8259; HF's serde_json refuses anything else), and
     * every string the tokenizer takes from it (vocabulary, added tokens,
     * normalizer contents) must be, or its output would not be */
    long bad = utf8_check(text, len);
    if (bad >= 0) {
        tok_errf(err, n, "%s: not valid UTF-8 (byte %ld)", file, bad);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!j) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        tok_errf(err, n, "%s: not valid JSON (near byte %zu)", file, at);
    }
    return j;
}

int tok_load_mem(Tokenizer **out, const char *json, size_t json_len, const char *config, size_t config_len,
                 char *err, size_t err_len)
{
    *out = NULL;
    cJSON *j = parse_json(json, json_len, "tokenizer.json", err, err_len);
    if (!j) return -1;
    cJSON *cfg = NULL;
    if (config) {
        cfg = parse_json(config, config_len, "tokenizer_config.json", err, err_len);
        if (!cfg) {
            cJSON_Delete(j);
            return -1;
        }
        if (!cJSON_IsObject(cfg)) {
            tok_errf(err, err_len, "tokenizer_config.json: the top level must be an object");
            cJSON_Delete(j);
            cJSON_Delete(cfg);
            return -1;
        }
    }
    Tokenizer *t = tok_new();
    int rc = build(t, j, cfg, err, err_len);
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    if (rc) {
        tok_free(t);
        return -1;
    }
    t->json = td_malloc(json_len + 1);
    memcpy(t->json, json, json_len);
    t->json[json_len] = 0;
    t->json_len = json_len;
    if (config) {
        t->config = td_malloc(config_len + 1);
        memcpy(t->config, config, config_len);
        t->config[config_len] = 0;
        t->config_len = config_len;
    }
    *out = t;
    return 0;
}

int tok_load_dir(Tokenizer **out, const char *dir, char *err, size_t err_len)
{
    *out = NULL;
    char path[4096];
    char *json = NULL, *cfg = NULL;
    size_t jl = 0, cl = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int r = td_read_file(path, 0, &json, &jl, err, err_len);
    if (r) {
        if (r > 0) tok_errf(err, err_len, "%s: no tokenizer.json there", dir);
        return -1;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    r = td_read_file(path, 0, &cfg, &cl, err, err_len);
    if (r < 0) {
        td_free(json);
        return -1;
    }
    int rc = tok_load_mem(out, json, jl, r == 0 ? cfg : NULL, cl, err, err_len);
    td_free(json);
    td_free(cfg);
    if (rc && strncmp(err, dir, strlen(dir))) {   /* say which directory */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s/%s", dir, err);
        tok_errf(err, err_len, "%s", msg);
    }
    return rc;
}

void tok_text_put(TokText *t, const char *s, size_t n) { toktext_put(t, s, n); }
bool tok_utf8_valid(const char *s, size_t n) { return utf8_check(s, n) < 0; }

/* ---------------------------------------------------------------- lookups */

const char *tok_id_to_str(const Tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->V) return NULL;
    if (t->bytes) {
        *len = 1;
        return t->byte_str + id;
    }
    if (t->added_of[id] >= 0) {
        const AddedTok *a = &t->added.tok[t->added_of[id]];
        *len = a->len;
        return a->content;
    }
    return bpe_id_str(&t->bpe, id, len);
}

int32_t tok_str_to_id(const Tokenizer *t, const char *s, size_t len)
{
    if (t->bytes) return len == 1 ? (int32_t)(unsigned char)s[0] : -1;
    int32_t i = strmap_get(&t->added.by_content, s, len);
    if (i >= 0) return t->added.tok[i].id;
    return strmap_get(&t->bpe.vocab, s, len);
}

bool tok_is_special(const Tokenizer *t, int32_t id) { return !t->bytes && id >= 0 && id < t->V && t->special[id]; }
int32_t tok_bos_id(const Tokenizer *t) { return t->bos; }
int32_t tok_eos_id(const Tokenizer *t) { return t->eos; }
int32_t tok_pad_id(const Tokenizer *t) { return t->pad; }

const int32_t *tok_stop_ids(const Tokenizer *t, size_t *n)
{
    *n = t->n_stops;
    return t->stops;
}

const char *tok_json_text(const Tokenizer *t, size_t *len)
{
    if (len) *len = t->json_len;
    return t->json;
}

const char *tok_config_text(const Tokenizer *t, size_t *len)
{
    if (len) *len = t->config_len;
    return t->config;
}

/* ---------------------------------------------------------------- encode */

static int encode_slot(const Tokenizer *t, Slot *s, const char *text, size_t len, TokIds *out, char *err, size_t en)
{
    if (!s->rx) s->rx = s->ns.rx = tokregex_scratch_new();
    if (!s->bpe) s->bpe = bpe_scratch_new();
    s->arena.n = 0;
    tokbuf_put(&s->arena, text, len);
    /* 1. added tokens of the raw text */
    s->a.n = 0;
    added_split(&t->added, &t->added.raw, s->arena.p, len, 0, true, &s->a);
    /* 2. normalize the rest, then find the normalized added tokens */
    s->b.n = 0;
    for (size_t i = 0; i < s->a.n; i++) {
        Piece pc = s->a.v[i];
        if (pc.id >= 0) {
            pieces_push(&s->b, pc.off, pc.len, pc.id, 0);
            continue;
        }
        uint32_t off = pc.off, n = pc.len;
        if (!norm_keeps(t->norm, s->arena.p + pc.off, pc.len)) {
            s->nbuf.n = 0;
            if (norm_apply(t->norm, &s->ns, &s->nbuf, s->arena.p + pc.off, pc.len, err, en)) return -1;
            off = (uint32_t)s->arena.n;
            n = (uint32_t)s->nbuf.n;
            tokbuf_put(&s->arena, s->nbuf.p, s->nbuf.n);
        }
        added_split(&t->added, &t->added.norm, s->arena.p + off, n, off, (pc.flags & PIECE_FIRST) != 0, &s->b);
    }
    /* 3. pre-tokenize, 4. the model */
    if (pretok_apply(t->pre, &s->arena, &s->b, &s->tmp, &s->sp, s->rx, err, en)) return -1;
    for (size_t i = 0; i < s->b.n; i++) {
        const Piece *pc = &s->b.v[i];
        if (pc->id >= 0) tokids_push(out, pc->id);
        else bpe_tokenize(&t->bpe, s->bpe, s->arena.p + pc->off, pc->len, (pc->flags & PIECE_BYTES) != 0, out);
    }
    return 0;
}

int tok_encode(const Tokenizer *t, const char *text, size_t len, bool add_special, TokIds *out, char *err,
               size_t err_len)
{
    if (t->bytes) {
        tokids_reserve(out, len);
        for (size_t i = 0; i < len; i++) out->ids[out->n++] = (unsigned char)text[i];
        return 0;
    }
    long bad = utf8_check(text, len);
    if (bad >= 0) {
        tok_errf(err, err_len, "the text is not valid UTF-8 (byte %ld)", bad);
        return -1;
    }
    if (len > UINT32_MAX / 4) {
        tok_errf(err, err_len, "the text is too long to encode at once (%zu bytes)", len);
        return -1;
    }
    size_t n0 = out->n;
    if (add_special)
        for (size_t i = 0; i < t->post.pre.n; i++) tokids_push(out, t->post.pre.ids[i]);
    Slot *s = slot_take(t);
    int rc = encode_slot(t, s, text, len, out, err, err_len);
    slot_give(s);
    if (rc) {
        out->n = n0;   /* nothing appended on failure */
        return -1;
    }
    if (add_special)
        for (size_t i = 0; i < t->post.post.n; i++) tokids_push(out, t->post.post.ids[i]);
    return 0;
}

/* ---------------------------------------------------------------- decode */

struct TokStream {
    const Tokenizer *t;
    bool skip;
    DecState *st;
};

TokStream *tok_stream_new(const Tokenizer *t, bool skip_special)
{
    TokStream *s = td_calloc(sizeof *s);
    s->t = t;
    s->skip = skip_special;
    s->st = dec_state_new(t->dec);
    return s;
}

void tok_stream_free(TokStream *s)
{
    if (!s) return;
    dec_state_free(s->st);
    td_free(s);
}

int tok_stream_push(TokStream *s, int32_t id, TokText *out, char *err, size_t err_len)
{
    const Tokenizer *t = s->t;
    if (id < 0 || id >= t->V) {
        tok_errf(err, err_len, "token id %d is out of range (the vocabulary has %d)", id, t->V);
        return -1;
    }
    if (s->skip && tok_is_special(t, id)) return 0;
    size_t len;
    const char *str = tok_id_to_str(t, id, &len);
    if (!str) return 0;   /* an id no token has: HF skips it */
    dec_push(t->dec, s->st, str, len, out);
    return 0;
}

int tok_token_bytes(const Tokenizer *t, int32_t id, TokText *out, char *err, size_t err_len)
{
    if (id < 0 || id >= t->V) {
        tok_errf(err, err_len, "token id %d is out of range (the vocabulary has %d)", id, t->V);
        return -1;
    }
    size_t len;
    const char *str = tok_id_to_str(t, id, &len);
    if (!str) return 0;
    if (t->bytes) {
        toktext_put(out, str, len);
        return 0;
    }
    TokBuf b = { 0 };
    dec_token_bytes(t->dec, str, len, &b);
    toktext_put(out, b.p ? b.p : "", b.n);
    tokbuf_free(&b);
    return 0;
}

void tok_stream_finish(TokStream *s, TokText *out)
{
    dec_finish(s->t->dec, s->st, out);
    if (!out->s) toktext_put(out, "", 0);   /* always NUL-terminated */
}

int tok_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special, TokText *out, char *err,
               size_t err_len)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->V) {
            tok_errf(err, err_len, "token id %d is out of range (the vocabulary has %d)", ids[i], t->V);
            return -1;
        }
    TokStream *s = tok_stream_new(t, skip_special);
    for (size_t i = 0; i < n; i++) tok_stream_push(s, ids[i], out, err, err_len);
    tok_stream_finish(s, out);
    tok_stream_free(s);
    return 0;
}
