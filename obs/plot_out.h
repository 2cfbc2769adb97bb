/* obs/plot_out.h - where `tandem plot` (obs/plot_cmd.c) and `tandem plot
 * --serve` (obs/serve_plot.c) record what they drew: OUT/index.json's
 * "figures" (files, legend entries, points per line) and "skipped" (name
 * and why), and the paths printed one a line.
 */
#ifndef TANDEM_OBS_PLOT_OUT_H
#define TANDEM_OBS_PLOT_OUT_H

#include <cJSON.h>
#include <stddef.h>

typedef struct {
    const char *out;           /* the output directory */
    cJSON *figures, *skipped;  /* arrays of index.json's root */
} PlotOut;

/* A figure not drawn: one note line and an entry {name, why}. */
void plot_out_skipped(PlotOut *o, const char *name, const char *why);
/* A figure written as BASE.png and BASE.svg: its entry (legend may be
 * NULL: no names) and its two paths printed. */
void plot_out_written(PlotOut *o, const char *name, const char *base, const char *const *legend,
                      const size_t *points, size_t n);
/* Writes ROOT as OUT/index.json and prints its path; -1 with one error
 * line. */
int plot_out_index(const PlotOut *o, const cJSON *root);
/* How many of v[0..n) are finite. */
size_t plot_n_finite(const double *v, size_t n);

#endif
