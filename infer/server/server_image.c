/* infer/server/server_image.c - image content parts of chat requests
 * (server_image.h): data URLs, base64, decoding into the vision tower's
 * pixels, and the placeholders in the prompt. */
#include "infer/server/server_image.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ----------------------------------------------------------------- base64 */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int api_base64_decode(const char *s, size_t n, uint8_t *out, size_t *out_n, char *why, size_t why_len)
{
    uint32_t acc = 0;
    int have = 0, pad = 0;   /* characters of the current group of 4; '=' seen */
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        int v = c == '=' ? 64 : b64_value(c);
        /* '=' only completes a group that has 2 or 3 characters; nothing after it */
        if (v < 0 || (v == 64 && (have < 2 || have + pad >= 4)) || (v < 64 && pad)) {
            snprintf(why, why_len, "the base64 data has an invalid character at offset %zu", i);
            return -1;
        }
        if (v == 64) {
            pad++;
            continue;
        }
        acc = acc << 6 | (uint32_t)v;
        if (++have == 4) {
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
            have = 0;
            acc = 0;
        }
    }
    /* a last group of 2 or 3 characters, padded or not: 1 or 2 bytes */
    if (have == 1 || (pad && have + pad != 4)) {
        snprintf(why, why_len, "the base64 data ends inside a group of 4 characters");
        return -1;
    }
    if (have == 2) out[o++] = (uint8_t)(acc >> 4);
    if (have == 3) {
        out[o++] = (uint8_t)(acc >> 10);
        out[o++] = (uint8_t)(acc >> 2);
    }
    *out_n = o;
    return 0;
}

/* --------------------------------------------------------------- data URLs */

int api_image_from_url(const char *url, const ImageLimits *lim, Image *out, char *why, size_t why_len)
{
    memset(out, 0, sizeof *out);
    ImageLimits l = image_limits(lim);
    if (strncasecmp(url, "data:", 5)) {
        const char *colon = strchr(url, ':');
        size_t sl = colon ? (size_t)(colon - url) : 0;
        if (sl && sl < 10)
            snprintf(why, why_len, "only data: URLs are accepted (data:image/png;base64,... or data:image/jpeg;base64,...): "
                     "the server does not fetch %.*s: URLs", (int)sl, url);
        else
            snprintf(why, why_len, "the image URL is not a data: URL (data:image/png;base64,... or "
                     "data:image/jpeg;base64,...)");
        return -1;
    }
    const char *comma = strchr(url, ',');
    if (!comma) {
        snprintf(why, why_len, "the data URL has no ',' before its data");
        return -1;
    }
    /* media type and parameters: data:image/png;base64, */
    const char *meta = url + 5;
    size_t ml = (size_t)(comma - meta);
    const char *semi = memchr(meta, ';', ml);
    size_t tl = semi ? (size_t)(semi - meta) : ml;
    bool b64 = false;   /* a parameter "base64" among ;a=b;base64 */
    for (const char *p = semi; p && p < comma;) {
        const char *next = memchr(p + 1, ';', (size_t)(comma - p - 1));
        const char *end = next ? next : comma;
        if (end - p - 1 == 6 && !strncasecmp(p + 1, "base64", 6)) b64 = true;
        p = next;
    }
    static const char *const TYPES[] = { "image/png", "image/jpeg", "image/jpg" };
    bool known = false;
    for (size_t k = 0; k < 3; k++) known |= tl == strlen(TYPES[k]) && !strncasecmp(meta, TYPES[k], tl);
    if (!known) {
        snprintf(why, why_len, "the data URL's media type is '%.*s': only image/png and image/jpeg are accepted",
                 (int)td_min(tl, 40), meta);
        return -1;
    }
    if (!b64) {
        snprintf(why, why_len, "the data URL is not base64 (want data:%.*s;base64,...)", (int)tl, meta);
        return -1;
    }
    const char *data = comma + 1;
    size_t dl = strlen(data);
    /* the encoded size bounds the decoded one: refuse before decoding */
    if (dl / 4 * 3 > l.max_bytes + 3) {
        snprintf(why, why_len, "image of about %zu bytes is over the limit of %zu bytes", dl / 4 * 3, l.max_bytes);
        return -1;
    }
    uint8_t *buf = td_malloc(dl / 4 * 3 + 4);
    size_t n = 0;
    int rc = api_base64_decode(data, dl, buf, &n, why, why_len);
    if (!rc) rc = image_decode(buf, n, &l, out, why, why_len);
    td_free(buf);
    return rc;
}

/* ---------------------------------------------------------------- messages */

static bool is_image_part(const cJSON *part)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsObject(part) && cJSON_IsString(t) && !strcmp(t->valuestring, "image_url");
}

/* The URL string of an image_url part ({"url": ...} or the string). */
static const char *part_url(const cJSON *part)
{
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    if (cJSON_IsString(iu)) return iu->valuestring;
    const cJSON *u = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : NULL;
    return cJSON_IsString(u) ? u->valuestring : NULL;
}

int api_images_collect(cJSON *messages, const ApiVision *v, size_t context, bool want_pixels, float **pixels,
                       size_t *n_img, char *why, size_t why_len)
{
    *pixels = NULL;
    *n_img = 0;
    if (!cJSON_IsArray(messages)) return 0;   /* the chat template's check names it */
    /* First pass: count and check the parts, before decoding anything. */
    size_t count = 0, mi = 0;
    int max_img = v->max_images > 0 ? v->max_images : API_DEFAULT_MAX_IMAGES;
    for (const cJSON *m = messages->child; m; m = m->next, mi++) {
        const cJSON *c = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
        size_t k = 0;
        for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next, k++) {
            if (!is_image_part(p)) continue;
            if (!v->tokens) {
                snprintf(why, why_len, "messages[%zu].content[%zu]: this model takes no images (it has no vision tower)",
                         mi, k);
                return -1;
            }
            if (!part_url(p)) {
                snprintf(why, why_len, "messages[%zu].content[%zu]: an image_url part needs \"image_url\": {\"url\": "
                         "\"data:image/png;base64,...\"}", mi, k);
                return -1;
            }
            count++;
        }
    }
    if (!count) return 0;
    if (count > (size_t)max_img) {
        snprintf(why, why_len, "messages: %zu images; the server takes at most %d per request", count, max_img);
        return -1;
    }
    if (count * v->tokens >= context) {
        snprintf(why, why_len, "messages: %zu images of %zu tokens each do not fit the model's context of %zu positions",
                 count, v->tokens, context);
        return -1;
    }
    const size_t per = 3 * v->size * v->size;
    float *px = want_pixels ? td_malloc(count * per * sizeof(float)) : NULL;
    size_t done = 0;
    mi = 0;
    for (cJSON *m = messages->child; m; m = m->next, mi++) {
        cJSON *c = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
        bool has = false;
        for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next) has |= is_image_part(p);
        if (!has) continue;
        TokText flat = { 0 };
        size_t k = 0;
        for (const cJSON *p = c->child; p; p = p->next, k++) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
            const char *piece;
            if (is_image_part(p)) {
                Image im;
                char e[400];
                if (api_image_from_url(part_url(p), &v->limits, &im, e, sizeof e)) {
                    snprintf(why, why_len, "messages[%zu].content[%zu]: %s", mi, k, e);
                    tok_text_free(&flat);
                    td_free(px);
                    return -1;
                }
                if (px) image_to_pixels(&im, v->size, v->mean, v->std, px + done * per);
                image_free(&im);
                done++;
                piece = API_IMAGE_PLACEHOLDER;
            } else if (cJSON_IsString(t) && !strcmp(t->valuestring, "text")) {
                const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsString(x)) {
                    snprintf(why, why_len, "messages[%zu].content[%zu] is a text part without a string 'text'", mi, k);
                    tok_text_free(&flat);
                    td_free(px);
                    return -1;
                }
                piece = x->valuestring;
            } else {
                snprintf(why, why_len, "messages[%zu].content[%zu]: a part of type %s%s%s beside images is not supported "
                         "(text and image_url are)", mi, k, cJSON_IsString(t) ? "'" : "",
                         cJSON_IsString(t) ? t->valuestring : "(none)", cJSON_IsString(t) ? "'" : "");
                tok_text_free(&flat);
                td_free(px);
                return -1;
            }
            if (k) tok_text_put(&flat, "\n", 1);
            tok_text_put(&flat, piece, strlen(piece));
        }
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(flat.s ? flat.s : ""));
        tok_text_free(&flat);
    }
    *pixels = px;
    *n_img = count;
    return 0;
}

int api_images_expand(TokIds *ids, const ApiVision *v, size_t n_img, char *why, size_t why_len)
{
    if (!v->tokens) return 0;
    size_t found = 0;
    for (size_t i = 0; i < ids->n; i++) found += ids->ids[i] == v->token_id;
    if (found != n_img) {
        if (!n_img)
            snprintf(why, why_len, "the prompt holds %zu image placeholder tokens (%s, id %d) but no image: the text may "
                     "not contain %s", found, API_IMAGE_PLACEHOLDER, v->token_id, API_IMAGE_PLACEHOLDER);
        else
            snprintf(why, why_len, "%zu images, but the rendered prompt holds %zu image placeholder tokens (id %d): the "
                     "text may not contain %s, and the tokenizer must map it to image_token_index", n_img, found,
                     v->token_id, API_IMAGE_PLACEHOLDER);
        return -1;
    }
    if (!n_img) return 0;
    size_t n = ids->n + n_img * (v->tokens - 1);
    int32_t *x = td_malloc(n * sizeof *x);
    size_t o = 0;
    for (size_t i = 0; i < ids->n; i++) {
        if (ids->ids[i] == v->token_id)
            for (size_t t = 0; t < v->tokens; t++) x[o++] = v->token_id;
        else
            x[o++] = ids->ids[i];
    }
    td_free(ids->ids);
    ids->ids = x;
    ids->n = ids->cap = n;
    return 0;
}
