/* obs/plot_out.c - index.json and the printed paths of `tandem plot`
 * (plot_out.h). */
#include "obs/plot_out.h"
#include "core/common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void plot_out_skipped(PlotOut *o, const char *name, const char *why)
{
    td_info("plot: no %s figure: %s", name, why);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "name", name);
    cJSON_AddStringToObject(s, "why", why);
    cJSON_AddItemToArray(o->skipped, s);
}

void plot_out_written(PlotOut *o, const char *name, const char *base, const char *const *legend,
                      const size_t *points, size_t n)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", name);
    char *png = td_sprintf("%s.png", base), *svg = td_sprintf("%s.svg", base);
    cJSON_AddStringToObject(f, "png", png);
    cJSON_AddStringToObject(f, "svg", svg);
    printf("%s\n%s\n", png, svg);
    td_free(png);
    td_free(svg);
    cJSON *lg = cJSON_AddArrayToObject(f, "legend"), *pt = cJSON_AddArrayToObject(f, "points");
    for (size_t i = 0; i < n; i++) {
        if (legend) cJSON_AddItemToArray(lg, cJSON_CreateString(legend[i]));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)points[i]));
    }
    cJSON_AddItemToArray(o->figures, f);
}

int plot_out_index(const PlotOut *o, const cJSON *root)
{
    char *path = td_sprintf("%s/index.json", o->out);
    char *s = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    int rc = !f || fputs(s, f) < 0 || fputc('\n', f) < 0;
    if (f && fclose(f)) rc = 1;
    if (rc) td_error("plot: %s: %s", path, strerror(errno));
    else printf("%s\n", path);
    cJSON_free(s);
    td_free(path);
    return rc ? -1 : 0;
}

size_t plot_n_finite(const double *v, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += isfinite(v[i]) != 0;
    return c;
}
