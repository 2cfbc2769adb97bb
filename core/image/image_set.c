/* core/image/image_set.c - image questions and answers from JSONL (image_set.h). */
#include "core/image/image_set.h"
#include "core/common.h"
#include "core/image/image.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *str_field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* A name inside the directory: relative, no ".." component. */
static int safe_name(const char *s)
{
    if (s[0] == '/') return 0;
    for (const char *p = s; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2])) return 0;
    return 1;
}

/* One line into s (its image decoded unless the line before named it). */
static int add_line(ImageSet *s, size_t *cap, const char *dir, const char *file, size_t lineno, const char *line,
                    const float *mean, const float *std, char *err, size_t n)
{
    cJSON *o = cJSON_Parse(line);
    const char *im = o ? str_field(o, "image") : NULL, *pr = o ? str_field(o, "prompt") : NULL;
    const char *an = o ? str_field(o, "answer") : NULL;
    int rc = -1;
    if (!cJSON_IsObject(o)) snprintf(err, n, "%s:%zu: not a JSON object", file, lineno);
    else if (!im || !pr || !an)
        snprintf(err, n, "%s:%zu: want the non-empty strings \"image\", \"prompt\" and \"answer\"", file, lineno);
    else if (!safe_name(im))
        snprintf(err, n, "%s:%zu: image \"%.80s\" must be a path inside %s (relative, no \"..\")", file, lineno, im,
                 dir);
    else rc = 0;
    if (rc) {
        cJSON_Delete(o);
        return -1;
    }
    if (s->n == *cap) {
        *cap = *cap ? 2 * *cap : 256;
        ImageExample *ne = td_malloc(*cap * sizeof *ne);
        if (s->n) memcpy(ne, s->ex, s->n * sizeof *ne);
        td_free(s->ex);
        s->ex = ne;
    }
    ImageExample *e = &s->ex[s->n];
    const ImageExample *prev = s->n ? &s->ex[s->n - 1] : NULL;
    e->image = td_strdup(im);
    e->prompt = td_strdup(pr);
    e->answer = td_strdup(an);
    s->n++;
    cJSON_Delete(o);
    if (prev && !strcmp(prev->image, e->image)) {
        e->pix = prev->pix;
        return 0;
    }
    const size_t px = 3 * s->S * s->S;
    if ((s->n_img + 1) * px * sizeof(float) > IMAGE_SET_MAX_BYTES) {
        snprintf(err, n, "%s:%zu: more than %zu images of %zu x %zu pixels (the cache holds at most %zu MiB)", file,
                 lineno, s->n_img, s->S, s->S, IMAGE_SET_MAX_BYTES >> 20);
        return -1;
    }
    if (s->n_img % 256 == 0) {
        float *np = td_malloc((s->n_img + 256) * px * sizeof(float));
        if (s->n_img) memcpy(np, s->pixels, s->n_img * px * sizeof(float));
        td_free(s->pixels);
        s->pixels = np;
    }
    char *path = td_sprintf("%s/%s", dir, e->image), why[512];
    Image img;
    rc = image_load(path, NULL, &img, why, sizeof why);
    td_free(path);
    if (rc) {
        snprintf(err, n, "%s:%zu: %s", file, lineno, why);
        return -1;
    }
    image_to_pixels(&img, s->S, mean, std, s->pixels + s->n_img * px);
    image_free(&img);
    e->pix = s->n_img++;
    return 0;
}

int image_set_load(ImageSet *s, const char *path, size_t S, const float mean[3], const float std[3], char *err,
                   size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->S = S;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, err_len, "images %s: %s", path, strerror(errno));
        return -1;
    }
    char *file, *dir;
    if (S_ISDIR(st.st_mode)) {
        file = td_sprintf("%s/shapes.jsonl", path);
        dir = td_strdup(path);
    } else {
        file = td_strdup(path);
        const char *slash = strrchr(path, '/');
        dir = slash ? td_sprintf("%.*s", (int)(slash - path), path) : td_strdup(".");
    }
    FILE *f = fopen(file, "r");
    int rc = 0;
    if (!f) {
        snprintf(err, err_len, "images %s: cannot open %s: %s", path, file, strerror(errno));
        rc = -1;
    }
    char *line = NULL;
    size_t lcap = 0, cap = 0, lineno = 0;
    ssize_t len;
    while (!rc && (len = getline(&line, &lcap, f)) > 0) {
        lineno++;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        rc = add_line(s, &cap, dir, file, lineno, line, mean, std, err, err_len);
    }
    if (!rc && f && ferror(f)) {
        snprintf(err, err_len, "images %s: error reading %s", path, file);
        rc = -1;
    }
    if (!rc && s->n == 0) {
        snprintf(err, err_len, "images %s: %s holds no examples", path, file);
        rc = -1;
    }
    free(line);
    if (f) fclose(f);
    td_free(file);
    td_free(dir);
    if (rc) image_set_free(s);
    return rc;
}

void image_set_free(ImageSet *s)
{
    for (size_t i = 0; i < s->n; i++) {
        td_free(s->ex[i].image);
        td_free(s->ex[i].prompt);
        td_free(s->ex[i].answer);
    }
    td_free(s->ex);
    td_free(s->pixels);
    memset(s, 0, sizeof *s);
}

const float *image_set_pixels(const ImageSet *s, size_t i) { return s->pixels + s->ex[i].pix * 3 * s->S * s->S; }
