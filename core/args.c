/* core/args.c - command-line options (args.h). */
#include "core/args.h"

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

int args_parse(Args *a, int argc, char **argv, int first, const char *const *spec, char *err, size_t n)
{
    memset(a, 0, sizeof *a);
    for (int i = 0; spec[i] && i < ARGS_MAX; i++) a->name[a->n_opt++] = spec[i];
    for (int i = first; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            a->help = true;
            continue;
        }
        if (strncmp(s, "--", 2) || !s[2]) {
            if (a->n_pos == ARGS_MAX) {
                snprintf(err, n, "too many arguments");
                return -1;
            }
            a->pos[a->n_pos++] = s;
            continue;
        }
        const char *nm = s + 2, *eq = strchr(nm, '=');
        size_t len = eq ? (size_t)(eq - nm) : strlen(nm);
        int o = find(a, nm, len);
        if (o < 0) {
            snprintf(err, n, "unknown option --%.*s", (int)len, nm);
            return -1;
        }
        char kind = a->name[o][strcspn(a->name[o], "=+")];
        if (kind == 0) {
            if (eq) {
                snprintf(err, n, "option --%.*s takes no value", (int)len, nm);
                return -1;
            }
            a->value[o] = "";
        } else if (kind == '=') {
            if (eq) a->value[o] = eq + 1;
            else if (i + 1 < argc) a->value[o] = argv[++i];
            else {
                snprintf(err, n, "option --%.*s needs a value", (int)len, nm);
                return -1;
            }
        } else {  /* '+': one or more values */
            if (eq) a->multi[o][a->n_multi[o]++] = eq + 1;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) && a->n_multi[o] < ARGS_MAX)
                a->multi[o][a->n_multi[o]++] = argv[++i];
            if (!a->n_multi[o]) {
                snprintf(err, n, "option --%.*s needs at least one value", (int)len, nm);
                return -1;
            }
            a->value[o] = a->multi[o][0];
        }
    }
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
    if (o < 0) return 0;
    *vals = a->multi[o];
    return a->n_multi[o];
}
