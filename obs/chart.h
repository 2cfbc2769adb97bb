/* obs/chart.h - line charts and heatmaps drawn with cairo, each written as
 * BASE.png and BASE.svg (the same drawing on both surfaces).
 *
 * The drawing is tandem's (axes with 1-2-5 ticks, labels, legend, colour
 * bar); the rasterising, anti-aliasing, fonts and file formats are cairo's.
 * Only chart.c includes <cairo.h> (and fontconfig, for chart_release).
 */
#ifndef TANDEM_OBS_CHART_H
#define TANDEM_OBS_CHART_H

#include <stdbool.h>
#include <stddef.h>

/* One line: points (x[i], y[i]) for i < n joined in order; a point with a
 * non-finite coordinate is left out (the line joins its neighbours).
 * markers: also draw a dot at each point (sparse series such as val_loss). */
typedef struct {
    const char *label;           /* legend entry (borrowed) */
    const double *x, *y;         /* borrowed (n) */
    size_t n;
    int color;                   /* index into the palette (chart_color) */
    int dash;                    /* 0 solid, 1 dashed, 2 dotted */
    bool markers;
} ChartLine;

typedef struct {
    const char *title, *xlabel, *ylabel;   /* borrowed */
    const ChartLine *lines;                /* borrowed (n_lines) */
    size_t n_lines;
    bool x_si;                             /* x tick labels with k/M/G (token counts) */
} LineChart;

/* A heatmap per panel (one per MoE layer): cell (row r, column c) of panel p
 * has value v[(p * n_rows + r) * n_cols + c] in [0, vmax], drawn over
 * x in [x[c] .. next column) (x: the steps), rows 0.. upward (the experts).
 * NAN cells are left grey. */
typedef struct {
    const char *title, *xlabel, *ylabel, *scale_label;   /* borrowed */
    size_t n_panels, n_rows, n_cols;
    const char *const *panel_label;        /* borrowed (n_panels) */
    const double *x;                       /* borrowed (n_cols), increasing */
    const double *v;                       /* borrowed (n_panels, n_rows, n_cols) */
    double vmax;
} Heatmap;

/* Palette colour i (any i >= 0; wraps) as 0-255 RGB. */
void chart_color(int i, unsigned char rgb[3]);
/* The colour map of heatmaps at t in [0, 1] as 0-255 RGB (viridis). */
void chart_colormap(double t, unsigned char rgb[3]);

/* Write base.png and base.svg.  Return 0, or -1 with one line in err naming
 * the file cairo could not write. */
int chart_lines_write(const LineChart *c, const char *base, char *err, size_t n);
int chart_heatmap_write(const Heatmap *h, const char *base, char *err, size_t n);
/* Releases the caches cairo and fontconfig keep for the fonts (so that a
 * leak checker sees none); call once, after the last chart. */
void chart_release(void);

#endif
