/* core/args.c - command-line options (args.h).
 *
 * One pass over argv records every value with the option it belongs to
 * (or -1: positional); the values of each "+" option are then laid out
 * contiguously, in the order given, in one block sized from argc. */
#include "core/args.h"
#include "core/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int find(const Args *a, const char *name, size_t len)
{
    for (int i = 0; i < a->n_opt; i++) {
        size_t nl = strcspn(a->name[i], "=+");
        if (nl == len && !strncmp(a->name[i], name, len)) return i;
    }
    return -1;
}

void args_free(Args *a)
{
    td_free(a->mem);
    memset(a, 0, sizeof *a);
}

static int fail(Args *a, char *err, size_t n, const char *fmt, int len, const char *nm)
{
    snprintf(err, n, fmt, len, nm);
    args_free(a);
    return -1;
}

int args_parse(Args *a, int argc, char **argv, int first, const char *const *spec, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    int n_opt = 0;
    while (spec[n_opt]) n_opt++;
    size_t na = argc > first ? (size_t)(argc - first) : 0;
    /* name, value, multi (n_opt pointers each), then the values of "+"
     * options and the positionals (at most na together), the owner of
     * each recorded value, and n_multi */
    size_t ptrs = 3 * (size_t)n_opt + 2 * na + 1;
    char *mem = td_calloc(ptrs * sizeof(void *) + (na + (size_t)n_opt + 1) * sizeof(int));
    a->mem = mem;
    a->name = (const char **)mem;
    a->value = a->name + n_opt;
    a->multi = (const char ***)(a->value + n_opt);
    const char **vals = (const char **)(a->multi + n_opt);   /* na: recorded values, then grouped */
    a->pos = vals + na;
    int *owner = (int *)(a->pos + na + 1);
    a->n_multi = owner + na;
    a->n_opt = n_opt;
    for (int i = 0; i < n_opt; i++) a->name[i] = spec[i];

    size_t nv = 0;   /* "+" values recorded, in argv order */
    for (int i = first; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            a->help = true;
            continue;
        }
        if (strncmp(s, "--", 2) || !s[2]) {
            a->pos[a->n_pos++] = s;
            continue;
        }
        const char *nm = s + 2, *eq = strchr(nm, '=');
        size_t len = eq ? (size_t)(eq - nm) : strlen(nm);
        int o = find(a, nm, len);
        if (o < 0) return fail(a, err, n, "unknown option --%.*s", (int)len, nm);
        char kind = a->name[o][strcspn(a->name[o], "=+")];
        if (kind == 0) {
            if (eq) return fail(a, err, n, "option --%.*s takes no value", (int)len, nm);
            a->value[o] = "";
        } else if (kind == '=') {
            if (eq) a->value[o] = eq + 1;
            else if (i + 1 < argc) a->value[o] = argv[++i];
            else return fail(a, err, n, "option --%.*s needs a value", (int)len, nm);
        } else {  /* '+': one or more values */
            int got = 0;
            if (eq) {
                owner[nv] = o;
                vals[nv++] = eq + 1;
                got++;
            }
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
                owner[nv] = o;
                vals[nv++] = argv[++i];
                got++;
            }
            if (!got) return fail(a, err, n, "option --%.*s needs at least one value", (int)len, nm);
            a->n_multi[o] += got;
        }
    }
    /* group the "+" values by option, keeping their order: a counting
     * sort through the free tail of pos (positionals never fill it all:
     * positionals + values <= na) */
    const char **tmp = a->pos + a->n_pos;
    size_t at = 0;
    for (int o = 0; o < n_opt; o++) {
        size_t start = at;
        for (size_t k = 0; k < nv; k++)
            if (owner[k] == o) tmp[at++] = vals[k];
        a->multi[o] = vals + start;
    }
    memcpy(vals, tmp, nv * sizeof *vals);
    for (int o = 0; o < n_opt; o++)
        if (a->n_multi[o]) a->value[o] = a->multi[o][0];   /* args_get: the first value */
    return 0;
}

const char *args_get(const Args *a, const char *name)
{
    int o = find(a, name, strlen(name));
    return o < 0 ? NULL : a->value[o];
}

const char *args_str(const Args *a, const char *name, const char *dflt)
{
    const char *v = args_get(a, name);
    return v ? v : dflt;
}

bool args_flag(const Args *a, const char *name) { return args_get(a, name) != NULL; }

int args_num(const Args *a, const char *name, double dflt, double lo, double hi, double *out,
             char *err, size_t n)
{
    const char *v = args_get(a, name);
    *out = dflt;
    if (!v) return 1;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || x < lo || x > hi) {
        snprintf(err, n, "--%s must be a number in [%g, %g] (got \"%s\")", name, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int args_multi(const Args *a, const char *name, const char *const **vals)
{
    int o = find(a, name, strlen(name));
    if (o < 0 || !a->n_multi[o]) return 0;
    *vals = a->multi[o];
    return a->n_multi[o];
}
