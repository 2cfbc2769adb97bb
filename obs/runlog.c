/* obs/runlog.c - metrics.jsonl read back into columns (runlog.h).
 *
 * Two passes over the file held in memory: the lines are counted first, so
 * every column is allocated once at its final size (n_lines values, NAN
 * until a row sets it).
 */
#include "obs/runlog.h"
#include "core/common.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void runlog_free(RunLog *r)
{
    for (size_t i = 0; i < r->n_series; i++) {
        td_free(r->series[i].key);
        td_free(r->series[i].v);
    }
    td_free(r->series);
    td_free(r->load);
    td_free(r->dir);
    td_free(r->path);
    memset(r, 0, sizeof *r);
}

const double *runlog_get(const RunLog *r, const char *key)
{
    for (size_t i = 0; i < r->n_series; i++)
        if (!strcmp(r->series[i].key, key)) return r->series[i].v;
    return NULL;
}

static double *nan_array(size_t n)
{
    double *v = td_malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) v[i] = NAN;
    return v;
}

/* The column of key, created (all NAN) on first sight; cap rows each. */
static double *column(RunLog *r, const char *key, size_t cap)
{
    for (size_t i = 0; i < r->n_series; i++)
        if (!strcmp(r->series[i].key, key)) return r->series[i].v;
    RunSeries *s = td_malloc((r->n_series + 1) * sizeof(RunSeries));
    if (r->n_series) memcpy(s, r->series, r->n_series * sizeof(RunSeries));
    td_free(r->series);
    r->series = s;
    s[r->n_series] = (RunSeries){ td_strdup(key), nan_array(cap) };
    return s[r->n_series++].v;
}

/* Row `row` of expert_load from a: its first sight fixes (L, E).  Returns 0,
 * or -1 with err when the shape is not that of an array of null or
 * equal-length arrays of numbers, or differs from the earlier rows'. */
static int read_load(RunLog *r, const cJSON *a, size_t row, size_t cap, char *err, size_t n)
{
    if (!cJSON_IsArray(a)) return td_snprintf(err, n, "expert_load is not an array"), -1;
    size_t L = (size_t)cJSON_GetArraySize(a), E = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, a) {
        if (cJSON_IsNull(l)) continue;
        if (!cJSON_IsArray(l) || (E && (size_t)cJSON_GetArraySize(l) != E) || !cJSON_GetArraySize(l))
            return td_snprintf(err, n, "expert_load: every layer must be null or an array of the same length"), -1;
        E = (size_t)cJSON_GetArraySize(l);
    }
    if (!E) return 0;   /* a dense model: nothing to draw */
    if (!r->load) {
        r->n_layers = L;
        r->n_expert = E;
        r->load = nan_array(cap * L * E);
    } else if (L != r->n_layers || E != r->n_expert) {
        return td_snprintf(err, n, "expert_load is %zu x %zu here, %zu x %zu in earlier rows", L, E, r->n_layers,
                           r->n_expert), -1;
    }
    size_t li = 0;
    cJSON_ArrayForEach(l, a) {
        double *dst = r->load + (row * L + li++) * E;
        if (cJSON_IsNull(l)) continue;
        size_t e = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, l) {
            if (!cJSON_IsNumber(c)) return td_snprintf(err, n, "expert_load holds a value that is not a number"), -1;
            dst[e++] = c->valuedouble;
        }
    }
    return 0;
}

/* An array of numbers (nulls skipped) into columns "key[i]", an object
 * of such into "key.sub[i]" (mem_rank_mb, fwd_s, act_rms ...: per rank,
 * stage or layer).  Arrays of arrays (expert_load) are read_load's. */
static void add_flat(RunLog *r, const char *key, const cJSON *it, size_t row, size_t cap)
{
    char name[300];
    if (cJSON_IsNumber(it)) {
        column(r, key, cap)[row] = it->valuedouble;
    } else if (cJSON_IsArray(it)) {
        size_t i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, it) {
            if (cJSON_IsNumber(c) && !td_snprintf(name, sizeof name, "%s[%zu]", key, i))
                column(r, name, cap)[row] = c->valuedouble;
            i++;
        }
    } else if (cJSON_IsObject(it)) {
        const cJSON *c;
        cJSON_ArrayForEach(c, it)
            if (!cJSON_IsObject(c) && !td_snprintf(name, sizeof name, "%s.%s", key, c->string))
                add_flat(r, name, c, row, cap);
    }
}

/* Adds one parsed row.  Returns 0 or -1 with err (without the location). */
static int add_row(RunLog *r, const cJSON *o, size_t cap, char *err, size_t n)
{
    if (!cJSON_IsObject(o)) return td_snprintf(err, n, "not a JSON object"), -1;
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")))
        return td_snprintf(err, n, "no numeric \"step\""), -1;
    const size_t row = r->n_rows;
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        if (!strcmp(it->string, "expert_load")) {
            if (read_load(r, it, row, cap, err, n)) return -1;
        } else {
            add_flat(r, it->string, it, row, cap);
        }
    }
    r->n_rows++;
    return 0;
}

int runlog_read(RunLog *r, const char *dir, char *err, size_t n)
{
    memset(r, 0, sizeof *r);
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        td_snprintf(err, n, "%s: %s", dir, stat(dir, &st) ? strerror(errno) : "not a directory");
        return -1;
    }
    r->dir = td_strdup(dir);
    r->path = td_sprintf("%s/metrics.jsonl", dir);
    size_t len = 0;
    char *buf = NULL;
    int got = td_read_file(r->path, 0, &buf, &len, err, n);
    if (got) {
        if (got > 0) td_snprintf(err, n, "%s: %s", r->path, strerror(ENOENT));
        runlog_free(r);
        return -1;
    }
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += buf[i] == '\n';
    char why[256];
    int rc = 0;
    long line = 0;
    for (char *p = buf; p < buf + len && !rc;) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        bool cut = !nl;   /* no newline: the writer may be in the middle of this line */
        if (nl) *nl = 0;
        line++;
        const char *s = p;
        p = nl ? nl + 1 : buf + len;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (!*s) continue;
        const char *end = NULL;
        cJSON *o = cJSON_ParseWithOpts(s, &end, 1);
        if (!o && cut) {
            r->cut_line = line;
            break;
        }
        if (!o) {
            td_snprintf(err, n, "%s:%ld: not JSON (near byte %ld of the line)", r->path, line,
                        (long)((end ? end : s) - s) + 1);
            rc = -1;
        } else if (add_row(r, o, cap, why, sizeof why)) {
            td_snprintf(err, n, "%s:%ld: %s", r->path, line, why);
            rc = -1;
        }
        cJSON_Delete(o);
    }
    td_free(buf);
    if (!rc && !r->n_rows) {
        td_snprintf(err, n, "%s: no metrics rows", r->path);
        rc = -1;
    }
    if (rc) runlog_free(r);
    return rc;
}
