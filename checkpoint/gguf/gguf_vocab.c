/* checkpoint/gguf/gguf_vocab.c - tokenizer metadata of a GGUF export
 * (gguf_vocab.h).
 *
 * How llama.cpp reads these keys: src/llama-vocab.cpp (llama_vocab::impl::
 * load: model "gpt2" needs merges and takes tokenizer.ggml.pre from a
 * fixed list of names, each with its own regexes; model "llama" is the
 * SentencePiece tokenizer, merging the adjacent pair whose concatenation
 * is the vocabulary token of highest score; token strings must be unique).
 * How llama.cpp's own converter fills them: gguf-py/gguf/vocab.py
 * (SpecialVocab, LlamaHfVocab) and convert_hf_to_gguf.py (get_vocab_base:
 * CONTROL for special added tokens, USER_DEFINED for the other added
 * tokens, [PAD<id>] UNUSED for the ids no token has).  Where the converter
 * guesses (scores of a tokenizer.json-only Llama vocabulary are all -1000
 * there; add_bos from a template parse), tandem derives the value from the
 * tokenizer itself: scores from the merge ranks, add_bos / add_eos from
 * what tandem's encoder adds.
 */
#include "checkpoint/gguf/gguf_vocab.h"
#include "core/common.h"
#include "core/tok/tokenizer.h"

#include <cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* llama.cpp's token types (llama.h, enum llama_token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* Pre-tokenizers llama.cpp knows by name, identified by the Split regexes
 * of tokenizer.json (in order) and whether the closing ByteLevel step runs
 * GPT-2's own regex (use_regex).  The regexes are the HF originals, as
 * llama-vocab.cpp quotes them beside its adapted copies. */
typedef struct {
    const char *name;
    int n_split;
    const char *split[3];
    bool bytelevel_regex;
} PreSig;

static const PreSig PRE_TABLE[] = {
    { "qwen2", 1,
      { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
      false },
    { "llama-bpe", 1,
      { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
      false },
    { "deepseek-v3", 3,
      { "\\p{N}{1,3}",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" },
      false },
    { "gpt-2", 0, { NULL }, true },
};

/* Everything decided before a key is written (gguf_vocab_write adds
 * nothing on a refusal). */
typedef struct {
    bool spm;                  /* "llama" (else "gpt2") */
    const char *pre;
    bool add_space_prefix;
    int32_t V, n_defined;
    int8_t *type;              /* V */
    float *score;              /* V (spm) */
    int32_t bos, eos, pad, unk;
    bool add_bos, add_eos;
    const cJSON *merges;       /* model.merges (gpt2) */
    const char *chat_template; /* borrowed from the config tree */
} Plan;

static bool str_is(const cJSON *o, const char *s) { return cJSON_IsString(o) && !strcmp(o->valuestring, s); }

static const cJSON *get(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static bool flag(const cJSON *o, const char *key, bool dflt)
{
    const cJSON *v = get(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* The steps of a pre-tokenizer / normalizer: a Sequence's list, or the
 * component itself as a list of one. */
static int steps_of(const cJSON *c, const char *list_key, const cJSON **out, int max)
{
    if (!c || cJSON_IsNull(c)) return 0;
    if (str_is(get(c, "type"), "Sequence")) {
        int n = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, get(c, list_key)) {
            if (n == max) return -1;
            out[n++] = it;
        }
        return n;
    }
    out[0] = c;
    return 1;
}

/* tokenizer.ggml.pre of a byte-level BPE pre-tokenizer, or NULL with err. */
static const char *pre_name(const cJSON *pre, char *err, size_t err_len)
{
    const cJSON *st[8];
    int n = steps_of(pre, "pretokenizers", st, 8);
    const char *rx[8];
    int n_rx = 0;
    bool bl = false, bl_regex = false;
    for (int i = 0; i < n; i++) {
        const cJSON *type = get(st[i], "type");
        if (str_is(type, "Split") && !bl) {
            const cJSON *re = get(get(st[i], "pattern"), "Regex");
            if (!cJSON_IsString(re) || !str_is(get(st[i], "behavior"), "Isolated") || flag(st[i], "invert", false)) {
                snprintf(err, err_len, "tokenizer.json: pre_tokenizer step %d: only Split steps with a Regex "
                         "pattern, behavior Isolated and invert false map onto llama.cpp's pre-tokenizers", i);
                return NULL;
            }
            rx[n_rx++] = re->valuestring;
        } else if (str_is(type, "ByteLevel") && !bl) {
            if (flag(st[i], "add_prefix_space", true)) {
                snprintf(err, err_len, "tokenizer.json: pre_tokenizer ByteLevel add_prefix_space=true: llama.cpp's "
                         "byte-level BPE adds no prefix space");
                return NULL;
            }
            bl = true;
            bl_regex = flag(st[i], "use_regex", true);
        } else {
            snprintf(err, err_len, "tokenizer.json: pre_tokenizer step %d (%s) maps onto none of llama.cpp's "
                     "byte-level pre-tokenizers", i, cJSON_IsString(type) ? type->valuestring : "?");
            return NULL;
        }
    }
    for (size_t k = 0; k < sizeof PRE_TABLE / sizeof PRE_TABLE[0]; k++) {
        const PreSig *p = &PRE_TABLE[k];
        if (p->n_split != n_rx || p->bytelevel_regex != bl_regex) continue;
        bool same = true;
        for (int i = 0; i < n_rx && same; i++) same = !strcmp(p->split[i], rx[i]);
        if (same) return p->name;
    }
    snprintf(err, err_len, "tokenizer.json: the pre_tokenizer's regexes match none of the llama.cpp pre-tokenizers "
             "tandem maps (qwen2, llama-bpe, deepseek-v3, gpt-2)");
    return NULL;
}

/* SentencePiece-style space handling of a byte_fallback BPE: the legacy
 * normalizer (Prepend "▁", Replace " " -> "▁", no pre-tokenizer) or a
 * Metaspace pre-tokenizer.  0 (add_space_prefix set) or -1 with err. */
static int spm_spaces(const cJSON *root, bool *prefix, char *err, size_t err_len)
{
    static const char *const LOWER_BLOCK = "\xe2\x96\x81";   /* U+2581 */
    const cJSON *norm = get(root, "normalizer"), *pre = get(root, "pre_tokenizer");
    const cJSON *st[8];
    int n = steps_of(norm, "normalizers", st, 8);
    bool prepend = false, replace = false, other = n < 0;
    for (int i = 0; i < n; i++) {
        const cJSON *type = get(st[i], "type");
        if (str_is(type, "Prepend") && str_is(get(st[i], "prepend"), LOWER_BLOCK)) prepend = true;
        else if (str_is(type, "Replace") && str_is(get(get(st[i], "pattern"), "String"), " ") &&
                 str_is(get(st[i], "content"), LOWER_BLOCK)) replace = true;
        else other = true;
    }
    bool no_pre = !pre || cJSON_IsNull(pre);
    if (!other && replace && no_pre) {
        *prefix = prepend;
        return 0;
    }
    if (n == 0 && str_is(get(pre, "type"), "Metaspace") && str_is(get(pre, "replacement"), LOWER_BLOCK)) {
        const cJSON *scheme = get(pre, "prepend_scheme");
        *prefix = !str_is(scheme, "never");
        return 0;
    }
    snprintf(err, err_len, "tokenizer.json: a byte_fallback BPE needs SentencePiece space handling (normalizer "
             "Prepend/Replace U+2581, or a Metaspace pre_tokenizer) for llama.cpp's \"llama\" tokenizer");
    return -1;
}

/* Merge i of model.merges: "a b" or ["a", "b"] -> the two parts. */
static bool merge_parts(const cJSON *m, const char **a, size_t *na, const char **b, size_t *nb)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s + (s[0] ? 1 : 0), ' ');
        if (!sp) return false;
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return true;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *na = strlen(*a);
        *b = m->child->next->valuestring;
        *nb = strlen(*b);
        return true;
    }
    return false;
}

/* An id from generation_config.json: an integer or the first of a list. */
static int32_t gen_id(const cJSON *gen, const char *key)
{
    const cJSON *v = get(gen, key);
    if (cJSON_IsArray(v)) v = v->child;
    return cJSON_IsNumber(v) && v->valuedouble >= 0 ? (int32_t)v->valuedouble : -1;
}

static bool is_byte_token(const char *s, size_t n)
{
    static const char *const HEX = "0123456789ABCDEFabcdef";
    return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && s[3] && strchr(HEX, s[3]) && s[4] && strchr(HEX, s[4]);
}

/* What the encoder adds around a text with special tokens on: one leading
 * and one trailing id at most, which llama.cpp calls BOS and EOS. */
static int added_specials(const Tokenizer *t, Plan *p, char *err, size_t err_len)
{
    TokIds plain = { 0 }, full = { 0 };
    char why[256];
    int rc = -1;
    if (tok_encode(t, "a", 1, false, &plain, why, sizeof why) || tok_encode(t, "a", 1, true, &full, why, sizeof why)) {
        snprintf(err, err_len, "tokenizer: cannot encode a probe text: %s", why);
        goto out;
    }
    size_t lead = 0;
    while (lead < full.n && (plain.n == 0 || full.ids[lead] != plain.ids[0])) lead++;
    size_t trail = full.n >= lead + plain.n ? full.n - lead - plain.n : 0;
    bool body = full.n == lead + plain.n + trail && !memcmp(full.ids + lead, plain.ids, plain.n * sizeof(int32_t));
    if (!body || lead > 1 || trail > 1) {
        snprintf(err, err_len, "tokenizer: its post-processor adds %zu leading and %zu trailing tokens: llama.cpp "
                 "can add one BOS and one EOS only", lead, trail);
        goto out;
    }
    p->add_bos = lead == 1;
    p->add_eos = trail == 1;
    if (p->add_bos) {
        if (p->bos < 0) p->bos = full.ids[0];
        if (p->bos != full.ids[0]) {
            snprintf(err, err_len, "tokenizer: the post-processor adds id %d in front, not bos_token %d",
                     full.ids[0], p->bos);
            goto out;
        }
    }
    if (p->add_eos) {
        int32_t last = full.ids[full.n - 1];
        if (p->eos < 0) p->eos = last;
        if (p->eos != last) {
            snprintf(err, err_len, "tokenizer: the post-processor appends id %d, not eos_token %d", last, p->eos);
            goto out;
        }
    }
    rc = 0;
out:
    tok_ids_free(&plain);
    tok_ids_free(&full);
    return rc;
}

static bool wrapped(const char *s, size_t n, const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    return n >= na + nb && !memcmp(s, a, na) && !memcmp(s + n - nb, b, nb);
}

/* An added token the converter makes CONTROL even when tokenizer.json
 * does not mark it special (convert_hf_to_gguf.py does_token_look_special:
 * <|...|>, the full-width <｜...｜> of DeepSeek, <unused...>, and a few
 * names), so llama.cpp does not override its type at load. */
static bool looks_special(const char *s, size_t n)
{
    static const char *const NAMES[] = { "<pad>", "<mask>", "<2mass>", "[@BOS@]", NULL };
    for (int i = 0; NAMES[i]; i++)
        if (n == strlen(NAMES[i]) && !memcmp(s, NAMES[i], n)) return true;
    return wrapped(s, n, "<|", "|>") || wrapped(s, n, "<\xef\xbd\x9c", "\xef\xbd\x9c>") || wrapped(s, n, "<unused", ">");
}

/* Token types (and SPM scores) of every id below V. */
static int types_of(const Tokenizer *t, const cJSON *root, Plan *p, char *err, size_t err_len)
{
    p->type = td_malloc((size_t)p->V);
    p->score = p->spm ? td_malloc((size_t)p->V * sizeof(float)) : NULL;
    uint8_t *added = td_calloc((size_t)p->V);
    const cJSON *a;
    cJSON_ArrayForEach(a, get(root, "added_tokens")) {
        const cJSON *id = get(a, "id");
        if (cJSON_IsNumber(id) && id->valuedouble >= 0 && id->valuedouble < p->V) added[(int32_t)id->valuedouble] = 1;
    }
    p->n_defined = 0;
    for (int32_t id = 0; id < p->V; id++) {
        size_t n;
        const char *s = tok_id_to_str(t, id, &n);
        /* llama.cpp maps token strings back to ids (and asserts the map is
         * one to one): every string must name its own id only */
        char pad[32];
        int32_t back = s ? tok_str_to_id(t, s, n) : tok_str_to_id(t, pad, (size_t)snprintf(pad, sizeof pad, "[PAD%d]", id));
        if (s ? back != id : back >= 0) {
            snprintf(err, err_len, "tokenizer: token %d (\"%.*s\") has the string of token %d: llama.cpp needs "
                     "unique token strings", id, s ? (int)td_min(n, 40) : (int)strlen(pad), s ? s : pad, back);
            td_free(added);
            return -1;
        }
        int8_t ty;
        if (!s) ty = TT_UNUSED;
        else if (tok_is_special(t, id) || (added[id] && looks_special(s, n))) ty = TT_CONTROL;
        else if (added[id]) ty = TT_USER_DEFINED;
        else if (p->spm && is_byte_token(s, n)) ty = TT_BYTE;
        else ty = TT_NORMAL;
        if (p->spm && id == p->unk && s) ty = TT_UNKNOWN;
        p->type[id] = ty;
        p->n_defined += s != NULL;
        /* SPM score: tokens no merge makes rank below every merge */
        if (p->spm) p->score[id] = -1e9f;
    }
    td_free(added);
    if (!p->spm) return 0;
    /* score = -(rank of the first merge whose result is the token) */
    int rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, p->merges) {
        const char *x, *y;
        size_t nx, ny;
        merge_parts(m, &x, &nx, &y, &ny);   /* checked by plan_hf */
        char buf[512];
        if (nx + ny < sizeof buf) {
            memcpy(buf, x, nx);
            memcpy(buf + nx, y, ny);
            int32_t id = tok_str_to_id(t, buf, nx + ny);
            if (id >= 0 && id < p->V && p->score[id] == -1e9f) p->score[id] = -(float)rank;
        }
        rank++;
    }
    return 0;
}

static int plan_hf(Plan *p, const Tokenizer *t, const cJSON *root, const cJSON *cfg, const cJSON *gen, char *err,
                   size_t err_len)
{
    const cJSON *model = get(root, "model");
    if (!str_is(get(model, "type"), "BPE")) {
        snprintf(err, err_len, "tokenizer.json: model.type %s: llama.cpp's \"gpt2\" and \"llama\" tokenizers are BPE",
                 cJSON_IsString(get(model, "type")) ? get(model, "type")->valuestring : "(missing)");
        return -1;
    }
    p->merges = get(model, "merges");
    p->spm = flag(model, "byte_fallback", false);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, p->merges) {
        const char *x, *y;
        size_t nx, ny;
        if (!merge_parts(m, &x, &nx, &y, &ny) || nx + ny > 500) {
            snprintf(err, err_len, "tokenizer.json: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"] "
                     "(of at most 500 bytes)", i);
            return -1;
        }
        i++;
    }
    if (p->spm) {
        if (spm_spaces(root, &p->add_space_prefix, err, err_len)) return -1;
    } else {
        /* none, or NFC (Qwen), which llama.cpp does not apply: text that is
         * already NFC (most text) tokenizes the same (docs/gguf.md) */
        const cJSON *st[8];
        int n = steps_of(get(root, "normalizer"), "normalizers", st, 8);
        for (int k = 0; k < n; k++)
            if (!str_is(get(st[k], "type"), "NFC")) n = -1;
        if (n < 0) {
            snprintf(err, err_len, "tokenizer.json: the normalizer does more than NFC: llama.cpp's byte-level BPE "
                     "applies none");
            return -1;
        }
        p->pre = pre_name(get(root, "pre_tokenizer"), err, err_len);
        if (!p->pre) return -1;
        if (!cJSON_IsArray(p->merges) || !cJSON_GetArraySize(p->merges)) {
            snprintf(err, err_len, "tokenizer.json: model.merges is missing or empty (llama.cpp's \"gpt2\" needs them)");
            return -1;
        }
    }
    p->bos = tok_bos_id(t);
    p->eos = tok_eos_id(t);
    p->pad = tok_pad_id(t);
    if (p->bos < 0) p->bos = gen_id(gen, "bos_token_id");
    if (p->eos < 0) p->eos = gen_id(gen, "eos_token_id");
    if (p->pad < 0) p->pad = gen_id(gen, "pad_token_id");
    const cJSON *unk = get(model, "unk_token");
    p->unk = cJSON_IsString(unk) ? tok_str_to_id(t, unk->valuestring, strlen(unk->valuestring)) : -1;
    if (added_specials(t, p, err, err_len)) return -1;
    const cJSON *ct = get(cfg, "chat_template");
    if (cJSON_IsString(ct)) p->chat_template = ct->valuestring;
    return types_of(t, root, p, err, err_len);
}

static void write_hf(GgufWriter *w, const Plan *p, const Tokenizer *t)
{
    gguf_kv_str(w, "tokenizer.ggml.model", p->spm ? "llama" : "gpt2", p->spm ? 5 : 4);
    if (!p->spm) gguf_kv_str(w, "tokenizer.ggml.pre", p->pre, strlen(p->pre));
    gguf_kv_array(w, "tokenizer.ggml.tokens", GGUF_STRING, (uint64_t)p->V);
    for (int32_t id = 0; id < p->V; id++) {
        size_t n;
        const char *s = tok_id_to_str(t, id, &n);
        char pad[32];
        if (!s) {
            n = (size_t)snprintf(pad, sizeof pad, "[PAD%d]", id);
            s = pad;
        }
        gguf_arr_str(w, s, n);
    }
    if (p->spm) {
        gguf_kv_array(w, "tokenizer.ggml.scores", GGUF_F32, (uint64_t)p->V);
        for (int32_t id = 0; id < p->V; id++) gguf_arr_f32(w, p->score[id]);
    }
    gguf_kv_array(w, "tokenizer.ggml.token_type", GGUF_I32, (uint64_t)p->V);
    for (int32_t id = 0; id < p->V; id++) gguf_arr_i32(w, p->type[id]);
    if (!p->spm) {
        gguf_kv_array(w, "tokenizer.ggml.merges", GGUF_STRING, (uint64_t)cJSON_GetArraySize(p->merges));
        const cJSON *m;
        char buf[1024];   /* a part of <= 500 bytes doubles at most */
        cJSON_ArrayForEach(m, p->merges) {
            const char *a, *b;
            size_t na, nb;
            merge_parts(m, &a, &na, &b, &nb);   /* checked in plan: every merge is well formed */
            /* "a b"; a space inside a part is written as U+0120 (gguf-py's
             * convention for the list form, so the first space splits) */
            size_t k = 0;
            for (int part = 0; part < 2; part++) {
                const char *s = part ? b : a;
                size_t ns = part ? nb : na;
                if (part) buf[k++] = ' ';
                for (size_t i = 0; i < ns; i++) {
                    if (s[i] == ' ') {
                        buf[k++] = (char)0xc4;
                        buf[k++] = (char)0xa0;
                    } else {
                        buf[k++] = s[i];
                    }
                }
            }
            gguf_arr_str(w, buf, k);
        }
    }
    if (p->bos >= 0) gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)p->bos);
    if (p->eos >= 0) gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)p->eos);
    if (p->unk >= 0) gguf_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)p->unk);
    if (p->pad >= 0) gguf_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)p->pad);
    gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", p->add_bos);
    gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", p->add_eos);
    if (p->spm) gguf_kv_bool(w, "tokenizer.ggml.add_space_prefix", p->add_space_prefix);
    if (p->chat_template) gguf_kv_str(w, "tokenizer.chat_template", p->chat_template, strlen(p->chat_template));
}

/* tandem's byte-level models: 256 BYTE tokens; llama.cpp's SPM tokenizer
 * has no "no BOS/EOS", so both alias byte 0 and are never added. */
static void write_bytes(GgufWriter *w)
{
    gguf_kv_str(w, "tokenizer.ggml.model", "llama", 5);
    gguf_kv_array(w, "tokenizer.ggml.tokens", GGUF_STRING, 256);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        gguf_arr_str(w, s, 6);
    }
    gguf_kv_array(w, "tokenizer.ggml.scores", GGUF_F32, 256);
    for (int b = 0; b < 256; b++) gguf_arr_f32(w, 0.0f);
    gguf_kv_array(w, "tokenizer.ggml.token_type", GGUF_I32, 256);
    for (int b = 0; b < 256; b++) gguf_arr_i32(w, TT_BYTE);
    gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", 0);
    gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", 0);
    gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", false);
    gguf_kv_bool(w, "tokenizer.ggml.add_space_prefix", false);
}

int gguf_vocab_write(GgufWriter *w, const GgufTokFiles *f, int32_t V, GgufVocabInfo *info, char *err,
                     size_t err_len)
{
    GgufVocabInfo dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (!f || !f->json) {
        if (V != 256) {
            snprintf(err, err_len, "vocab_size %d needs a tokenizer (--tokenizer DIR): without one only tandem's "
                     "byte-level vocabulary (256) is written", V);
            return -1;
        }
        write_bytes(w);
        snprintf(info->model, sizeof info->model, "llama");
        info->n_tokens = info->n_defined = 256;
        info->bos = info->eos = 0;
        return 0;
    }
    Tokenizer *t = NULL;
    char why[512];
    if (tok_load_mem(&t, f->json, f->json_len, f->config, f->config ? f->config_len : 0, why, sizeof why)) {
        snprintf(err, err_len, "tokenizer: %s", why);
        return -1;
    }
    int rc = -1;
    cJSON *root = cJSON_ParseWithLength(f->json, f->json_len);
    cJSON *cfg = f->config ? cJSON_ParseWithLength(f->config, f->config_len) : NULL;
    cJSON *gen = f->gen ? cJSON_ParseWithLength(f->gen, f->gen_len) : NULL;
    Plan p;
    memset(&p, 0, sizeof p);
    p.V = V;
    if (f->gen && !gen) {
        snprintf(err, err_len, "generation_config.json: not JSON");
        goto out;
    }
    if (tok_vocab_size(t) > V) {
        snprintf(err, err_len, "tokenizer: %d ids, more than the model's vocab_size %d (llama.cpp takes the "
                 "vocabulary size from the token list, which must match the embedding)", tok_vocab_size(t), V);
        goto out;
    }
    if (plan_hf(&p, t, root, cfg, gen, err, err_len)) goto out;
    write_hf(w, &p, t);
    snprintf(info->model, sizeof info->model, "%s", p.spm ? "llama" : "gpt2");
    snprintf(info->pre, sizeof info->pre, "%s", p.pre ? p.pre : "");
    info->n_tokens = V;
    info->n_defined = p.n_defined;
    info->n_merges = p.spm ? 0 : cJSON_GetArraySize(p.merges);
    info->bos = p.bos;
    info->eos = p.eos;
    info->add_bos = p.add_bos;
    info->add_eos = p.add_eos;
    rc = 0;
out:
    td_free(p.type);
    td_free(p.score);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    tok_free(t);
    return rc;
}
