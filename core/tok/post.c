/* core/tok/post.c - post-processors as (prefix, suffix) id lists
 * (post.h). */
#include "core/tok/post.h"
#include "core/common.h"

#include <stdio.h>

void post_free(PostProc *p)
{
    tok_ids_free(&p->pre);
    tok_ids_free(&p->post);
}

/* ["token", id] of Roberta / Bert. */
static int pair_id(const cJSON *j, const char *key, const char *path, int32_t *id, char *err, size_t n)
{
    const cJSON *v = tj_get(j, key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsString(v->child) ||
        !cJSON_IsNumber(v->child->next) || v->child->next->valuedouble < 0) {
        tok_errf(err, n, "tokenizer.json: %s.%s must be [\"token\", id]", path, key);
        return -1;
    }
    *id = (int32_t)v->child->next->valuedouble;
    return 0;
}

/* The ids of special token `name` of a TemplateProcessing. */
static int template_ids(const cJSON *specials, const char *name, const char *path, TokIds *out, char *err,
                        size_t n)
{
    const cJSON *t = specials ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
    const cJSON *ids = t ? tj_get(t, "ids") : NULL;
    if (!cJSON_IsArray(ids)) {
        tok_errf(err, n, "tokenizer.json: %s.special_tokens has no ids for \"%s\"", path, name);
        return -1;
    }
    for (const cJSON *c = ids->child; c; c = c->next) {
        if (!cJSON_IsNumber(c) || c->valuedouble < 0) {
            tok_errf(err, n, "tokenizer.json: %s.special_tokens[\"%s\"].ids must be ids", path, name);
            return -1;
        }
        tokids_push(out, (int32_t)c->valuedouble);
    }
    return 0;
}

static int load_template(PostProc *p, const cJSON *j, const char *path, char *err, size_t n)
{
    static const char *const k[] = { "type", "single", "pair", "special_tokens", NULL };
    if (tj_known(j, path, k, err, n)) return -1;
    const cJSON *single = tj_get(j, "single"), *specials = tj_get(j, "special_tokens");
    if (!cJSON_IsArray(single)) {
        tok_errf(err, n, "tokenizer.json: %s.single must be an array", path);
        return -1;
    }
    int seen_a = 0, i = 0;
    for (const cJSON *it = single->child; it; it = it->next, i++) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *name = sp ? tj_get(sp, "id") : sq ? tj_get(sq, "id") : NULL;
        if (!cJSON_IsString(name)) {
            tok_errf(err, n, "tokenizer.json: %s.single[%d] must be a SpecialToken or a Sequence", path, i);
            return -1;
        }
        if (sq) {
            if (strcmp(name->valuestring, "A") || seen_a++) {
                tok_errf(err, n, "tokenizer.json: %s.single[%d]: sequence \"%s\" is not supported (one $A only)",
                         path, i, name->valuestring);
                return -1;
            }
            continue;
        }
        if (template_ids(specials, name->valuestring, path, seen_a ? &p->post : &p->pre, err, n)) return -1;
    }
    if (!seen_a) {
        tok_errf(err, n, "tokenizer.json: %s.single has no $A", path);
        return -1;
    }
    return 0;
}

int post_load(PostProc *p, const cJSON *j, const char *path, char *err, size_t n)
{
    memset(p, 0, sizeof *p);
    if (!j || cJSON_IsNull(j)) return 0;
    const char *type;
    if (tj_type(j, path, &type, err, n)) return -1;
    int rc = 0;
    if (!strcmp(type, "TemplateProcessing")) rc = load_template(p, j, path, err, n);
    else if (!strcmp(type, "ByteLevel")) {
        static const char *const k[] = { "type", "add_prefix_space", "trim_offsets", "use_regex", NULL };
        rc = tj_known(j, path, k, err, n);
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        static const char *const k[] = { "type", "sep", "cls", "trim_offsets", "add_prefix_space", NULL };
        int32_t cls, sep;
        rc = tj_known(j, path, k, err, n) || pair_id(j, "cls", path, &cls, err, n) ||
             pair_id(j, "sep", path, &sep, err, n);
        if (!rc) {
            tokids_push(&p->pre, cls);
            tokids_push(&p->post, sep);
        }
    } else if (!strcmp(type, "Sequence")) {
        static const char *const k[] = { "type", "processors", NULL };
        const cJSON *arr = tj_get(j, "processors");
        rc = tj_known(j, path, k, err, n);
        if (!rc && !cJSON_IsArray(arr)) {
            tok_errf(err, n, "tokenizer.json: %s.processors must be an array", path);
            rc = -1;
        }
        int i = 0;
        for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next, i++) {
            /* each processor wraps what the previous ones produced */
            char p2[256];
            snprintf(p2, sizeof p2, "%s.processors[%d]", path, i);
            PostProc q;
            rc = post_load(&q, c, p2, err, n);
            if (rc) break;
            TokIds pre = { 0 };
            for (size_t k2 = 0; k2 < q.pre.n; k2++) tokids_push(&pre, q.pre.ids[k2]);
            for (size_t k2 = 0; k2 < p->pre.n; k2++) tokids_push(&pre, p->pre.ids[k2]);
            for (size_t k2 = 0; k2 < q.post.n; k2++) tokids_push(&p->post, q.post.ids[k2]);
            tok_ids_free(&p->pre);
            p->pre = pre;
            post_free(&q);
        }
    } else {
        tok_errf(err, n, "tokenizer.json: %s.type \"%s\" is not supported", path, type);
        rc = -1;
    }
    if (rc) post_free(p);
    return rc;
}
