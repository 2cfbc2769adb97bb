/* obs/chart.c - line charts and heatmaps on cairo surfaces (chart.h).
 *
 * One drawing function per kind takes a cairo context and the page size;
 * chart_*_write runs it once on an ARGB image surface (written as PNG) and
 * once on an SVG surface.  Axis ticks are 1, 2 or 5 x 10^k, about six per
 * axis, the axis range widened to whole ticks.
 */
#include "obs/chart.h"
#include "core/common.h"

#include <cairo.h>
#include <cairo-svg.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHART_FONT "DejaVu Sans"

/* matplotlib's "tab10": distinct, readable on white, known to the tests */
static const unsigned char g_palette[10][3] = {
    { 31, 119, 180 }, { 255, 127, 14 }, { 44, 160, 44 }, { 214, 39, 40 }, { 148, 103, 189 },
    { 140, 86, 75 }, { 227, 119, 194 }, { 127, 127, 127 }, { 188, 189, 34 }, { 23, 190, 207 },
};

void chart_color(int i, unsigned char rgb[3])
{
    memcpy(rgb, g_palette[(i % 10 + 10) % 10], 3);
}

/* viridis at nine evenly spaced stops, interpolated linearly */
void chart_colormap(double t, unsigned char rgb[3])
{
    static const unsigned char stops[9][3] = {
        { 68, 1, 84 }, { 71, 44, 122 }, { 59, 81, 139 }, { 44, 113, 142 }, { 33, 144, 141 },
        { 39, 173, 129 }, { 92, 200, 99 }, { 170, 220, 50 }, { 253, 231, 37 },
    };
    t = isfinite(t) ? fmin(fmax(t, 0), 1) : 0;
    double f = t * 8;
    int i = (int)f;
    if (i > 7) i = 7;
    f -= i;
    for (int c = 0; c < 3; c++) rgb[c] = (unsigned char)lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]));
}

static void set_rgb(cairo_t *cr, const unsigned char rgb[3])
{
    cairo_set_source_rgb(cr, rgb[0] / 255.0, rgb[1] / 255.0, rgb[2] / 255.0);
}

/* ---------------------------------------------------------------- axes */

typedef struct {
    double lo, hi, step;   /* axis range, widened to whole ticks, and the tick spacing */
} Axis;

/* Ticks are counted, never accumulated: lo + i * step, at most this many
 * (about 6 are planned; a range too narrow for its magnitude, such as
 * 1e16 .. 1e16 + 2, cannot loop). */
#define AXIS_MAX_TICKS 20

static Axis axis_of(double lo, double hi)
{
    if (!isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (hi - lo <= fabs(hi) * 1e-12) {   /* a constant series: a band around it */
        double pad = lo ? fabs(lo) * 0.1 : 1;
        lo -= pad;
        hi += pad;
    }
    double raw = (hi - lo) / 6, p = pow(10, floor(log10(raw))), f = raw / p;
    double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
    return (Axis){ floor(lo / step + 1e-9) * step, ceil(hi / step - 1e-9) * step, step };
}

/* Tick label of v on axis a: one format for the whole axis. */
static void tick_label(char *buf, size_t n, double v, const Axis *a, bool si)
{
    if (fabs(v) < a->step * 1e-6) v = 0;
    double big = fmax(fabs(a->lo), fabs(a->hi));
    if (si && big >= 1e3) {
        double unit = big >= 1e9 ? 1e9 : big >= 1e6 ? 1e6 : 1e3;
        const char *suf = unit == 1e9 ? "G" : unit == 1e6 ? "M" : "k";
        int dec = (int)fmax(0, -floor(log10(a->step / unit) + 1e-9));
        snprintf(buf, n, "%.*f%s", dec, v / unit, v ? suf : "");
    } else if (big < 1e-2 || big >= 1e6) {
        snprintf(buf, n, v ? "%.1e" : "0", v);
    } else {
        int dec = (int)fmax(0, -floor(log10(a->step) + 1e-9));
        snprintf(buf, n, "%.*f", dec, v);
    }
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double size, double ax, double ay, bool bold)
{
    cairo_select_font_face(cr, CHART_FONT, CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    /* (ax, ay): which point of the text box sits at (x, y), 0..1 from left/top */
    cairo_move_to(cr, x - te.x_bearing - ax * te.width, y - te.y_bearing - ay * te.height);
    cairo_show_text(cr, s);
}

static double text_width(cairo_t *cr, const char *s, double size)
{
    cairo_select_font_face(cr, CHART_FONT, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    return te.x_advance;
}

static void vertical_label(cairo_t *cr, double x, double y, const char *s, double size)
{
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, s, size, 0.5, 0.5, false);
    cairo_restore(cr);
}

/* Box of the plot area in page coordinates. */
typedef struct {
    double x0, y0, x1, y1;
} Box;

static double map(double v, double lo, double hi, double p0, double p1)
{
    return p0 + (v - lo) / (hi - lo) * (p1 - p0);
}

/* Ticks, grid lines and labels of the x axis (labels: false leaves the
 * numbers out, for the upper panels of a heatmap). */
static void draw_xaxis(cairo_t *cr, const Box *b, const Axis *ax, bool si, bool labels, bool grid)
{
    char buf[32];
    for (int i = 0; i <= AXIS_MAX_TICKS; i++) {
        double v = ax->lo + i * ax->step;
        if (!(v <= ax->hi + ax->step * 1e-6)) break;
        double px = round(map(v, ax->lo, ax->hi, b->x0, b->x1)) + 0.5;
        if (grid) {
            cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
            cairo_move_to(cr, px, b->y0);
            cairo_line_to(cr, px, b->y1);
            cairo_stroke(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, px, b->y1);
        cairo_line_to(cr, px, b->y1 + 5);
        cairo_stroke(cr);
        if (labels) {
            tick_label(buf, sizeof buf, v, ax, si);
            text_at(cr, px, b->y1 + 8, buf, 12, 0.5, 0, false);
        }
    }
}

static void draw_yaxis(cairo_t *cr, const Box *b, const Axis *ay, bool grid)
{
    char buf[32];
    for (int i = 0; i <= AXIS_MAX_TICKS; i++) {
        double v = ay->lo + i * ay->step;
        if (!(v <= ay->hi + ay->step * 1e-6)) break;
        double py = round(map(v, ay->lo, ay->hi, b->y1, b->y0)) + 0.5;
        if (grid) {
            cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
            cairo_move_to(cr, b->x0, py);
            cairo_line_to(cr, b->x1, py);
            cairo_stroke(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, b->x0 - 5, py);
        cairo_line_to(cr, b->x0, py);
        cairo_stroke(cr);
        tick_label(buf, sizeof buf, v, ay, false);
        text_at(cr, b->x0 - 8, py, buf, 12, 1, 0.5, false);
    }
}

static void frame(cairo_t *cr, const Box *b)
{
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, floor(b->x0) + 0.5, floor(b->y0) + 0.5, floor(b->x1) - floor(b->x0), floor(b->y1) - floor(b->y0));
    cairo_stroke(cr);
}

static void set_dash(cairo_t *cr, int dash)
{
    static const double dashed[2] = { 9, 5 }, dotted[2] = { 2, 4 };
    if (dash == 1) cairo_set_dash(cr, dashed, 2, 0);
    else if (dash == 2) cairo_set_dash(cr, dotted, 2, 0);
    else cairo_set_dash(cr, NULL, 0, 0);
}

/* ---------------------------------------------------------------- line chart */

enum { LC_W = 900, LC_H = 540 };

static void draw_lines(cairo_t *cr, const LineChart *c)
{
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (size_t i = 0; i < c->n_lines; i++) {
        const ChartLine *l = &c->lines[i];
        for (size_t j = 0; j < l->n; j++) {
            if (!isfinite(l->x[j]) || !isfinite(l->y[j])) continue;
            xlo = fmin(xlo, l->x[j]), xhi = fmax(xhi, l->x[j]);
            ylo = fmin(ylo, l->y[j]), yhi = fmax(yhi, l->y[j]);
        }
    }
    if (yhi > ylo) {   /* a little room above and below, so no line runs along the frame */
        double pad = 0.03 * (yhi - ylo);
        ylo = ylo >= 0 && ylo - pad < 0 ? 0 : ylo - pad;
        yhi += pad;
    }
    Axis ax = axis_of(xlo, xhi), ay = axis_of(ylo, yhi);
    Box b = { 90, 50, LC_W - 25, LC_H - 65 };
    cairo_set_line_width(cr, 1);
    draw_xaxis(cr, &b, &ax, c->x_si, true, true);
    draw_yaxis(cr, &b, &ay, true);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text_at(cr, LC_W / 2.0, 14, c->title, 17, 0.5, 0, true);
    text_at(cr, (b.x0 + b.x1) / 2, LC_H - 22, c->xlabel, 14, 0.5, 0.5, false);
    vertical_label(cr, 22, (b.y0 + b.y1) / 2, c->ylabel, 14);

    /* the lines, clipped to the plot area */
    cairo_save(cr);
    cairo_rectangle(cr, b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0);
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    for (size_t i = 0; i < c->n_lines; i++) {
        const ChartLine *l = &c->lines[i];
        unsigned char rgb[3];
        chart_color(l->color, rgb);
        set_rgb(cr, rgb);
        cairo_set_line_width(cr, 2);
        set_dash(cr, l->dash);
        bool open = false;
        for (size_t j = 0; j < l->n; j++) {
            if (!isfinite(l->x[j]) || !isfinite(l->y[j])) continue;
            double px = map(l->x[j], ax.lo, ax.hi, b.x0, b.x1), py = map(l->y[j], ay.lo, ay.hi, b.y1, b.y0);
            if (open) cairo_line_to(cr, px, py);
            else cairo_move_to(cr, px, py);
            open = true;
        }
        cairo_stroke(cr);
        if (l->markers) {
            for (size_t j = 0; j < l->n; j++) {
                if (!isfinite(l->x[j]) || !isfinite(l->y[j])) continue;
                cairo_new_sub_path(cr);
                cairo_arc(cr, map(l->x[j], ax.lo, ax.hi, b.x0, b.x1), map(l->y[j], ay.lo, ay.hi, b.y1, b.y0), 3.5, 0,
                          2 * M_PI);
            }
            cairo_fill(cr);
        }
    }
    set_dash(cr, 0);
    cairo_restore(cr);
    frame(cr, &b);

    /* legend: inside the plot area, on white */
    if (!c->n_lines) return;
    double tw = 0;
    for (size_t i = 0; i < c->n_lines; i++) tw = fmax(tw, text_width(cr, c->lines[i].label, 12));
    const double row = 18, lw = 30, pad = 8;
    double w = pad + lw + 6 + tw + pad, h = pad + row * (double)c->n_lines + pad - 4;
    /* where in the plot area the box covers the fewest points of the lines
     * (sampled every few pixels along each segment); ties go to the first
     * of top right, top left, bottom right, bottom left, middle right,
     * middle left */
    double best = INFINITY, x0 = 0, y0 = 0;
    for (int pos = 0; pos < 6; pos++) {
        double cx = pos & 1 ? b.x0 + 8 : b.x1 - w - 8;
        double cy = pos < 2 ? b.y0 + 8 : pos < 4 ? b.y1 - h - 8 : (b.y0 + b.y1 - h) / 2;
        double hits = 0;
        for (size_t i = 0; i < c->n_lines; i++) {
            const ChartLine *l = &c->lines[i];
            double px = NAN, py = NAN;
            for (size_t j = 0; j < l->n; j++) {
                if (!isfinite(l->x[j]) || !isfinite(l->y[j])) continue;
                double qx = map(l->x[j], ax.lo, ax.hi, b.x0, b.x1), qy = map(l->y[j], ay.lo, ay.hi, b.y1, b.y0);
                int steps = isfinite(px) ? (int)fmin(ceil(hypot(qx - px, qy - py) / 4), 200) : 0;
                for (int t = 0; t <= steps; t++) {
                    double f = steps ? (double)t / steps : 1, sx = px + f * (qx - px), sy = py + f * (qy - py);
                    if (!steps) sx = qx, sy = qy;
                    hits += sx >= cx - 4 && sx <= cx + w + 4 && sy >= cy - 4 && sy <= cy + h + 4;
                }
                px = qx, py = qy;
            }
        }
        if (hits < best) best = hits, x0 = floor(cx), y0 = floor(cy);
    }
    cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
    cairo_rectangle(cr, x0, y0, w, h);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    for (size_t i = 0; i < c->n_lines; i++) {
        const ChartLine *l = &c->lines[i];
        double y = y0 + pad + row * (double)i + 6;   /* whole pixels: the 2-px sample covers them fully */
        unsigned char rgb[3];
        chart_color(l->color, rgb);
        set_rgb(cr, rgb);
        cairo_set_line_width(cr, 2);
        set_dash(cr, l->dash);
        cairo_move_to(cr, x0 + pad, y);
        cairo_line_to(cr, x0 + pad + lw, y);
        cairo_stroke(cr);
        set_dash(cr, 0);
        if (l->markers) {
            cairo_arc(cr, x0 + pad + lw / 2, y, 3.5, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, x0 + pad + lw + 6, y, l->label, 12, 0, 0.5, false);
    }
}

/* ---------------------------------------------------------------- heatmap */

enum { HM_W = 900 };

static double hm_panel_h(const Heatmap *h)
{
    double ph = 12.0 * (double)h->n_rows;
    return fmin(fmax(ph, 70), 150);
}

static double hm_height(const Heatmap *h)
{
    return 60 + (double)h->n_panels * (hm_panel_h(h) + 26) + 55;
}

/* Left edge of column c (c = n_cols: the right edge of the last). */
static double hm_edge(const Heatmap *h, size_t c)
{
    const double *x = h->x;
    size_t n = h->n_cols;
    if (n == 1) return x[0] + (c ? 0.5 : -0.5);
    if (c == 0) return x[0] - (x[1] - x[0]) / 2;
    if (c == n) return x[n - 1] + (x[n - 1] - x[n - 2]) / 2;
    return (x[c - 1] + x[c]) / 2;
}

static void draw_heatmap(cairo_t *cr, const Heatmap *h)
{
    const double H = hm_height(h), ph = hm_panel_h(h);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text_at(cr, HM_W / 2.0, 14, h->title, 17, 0.5, 0, true);
    const double x0 = 90, x1 = HM_W - 120;
    const double e0 = hm_edge(h, 0), e1 = hm_edge(h, h->n_cols);
    Axis ax = axis_of(h->x[0], h->x[h->n_cols - 1]);
    Axis ax_in = ax;   /* ticks inside the drawn range only */
    ax_in.lo = ceil(e0 / ax.step - 1e-9) * ax.step;
    ax_in.hi = floor(e1 / ax.step + 1e-9) * ax.step;
    double vmax = h->vmax > 0 ? h->vmax : 1;
    char buf[64];
    for (size_t p = 0; p < h->n_panels; p++) {
        Box b = { x0, 50 + (double)p * (ph + 26) + 18, x1, 50 + (double)p * (ph + 26) + 18 + ph };
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, b.x0, b.y0 - 4, h->panel_label[p], 12, 0, 1, true);
        for (size_t r = 0; r < h->n_rows; r++) {
            double ya = map((double)r, 0, (double)h->n_rows, b.y1, b.y0), yb = map((double)r + 1, 0, (double)h->n_rows, b.y1, b.y0);
            for (size_t c = 0; c < h->n_cols; c++) {
                double v = h->v[(p * h->n_rows + r) * h->n_cols + c];
                double xa = map(hm_edge(h, c), e0, e1, b.x0, b.x1), xb = map(hm_edge(h, c + 1), e0, e1, b.x0, b.x1);
                unsigned char rgb[3] = { 200, 200, 200 };
                if (isfinite(v)) chart_colormap(v / vmax, rgb);
                set_rgb(cr, rgb);
                /* cells snapped to whole pixels so that neighbours leave no seams */
                cairo_rectangle(cr, round(xa), round(yb), round(xb) - round(xa), round(ya) - round(yb));
                cairo_fill(cr);
            }
            /* expert labels: every one when they fit, else a few */
            size_t every = h->n_rows <= 16 ? 1 : (h->n_rows + 7) / 8;
            if (r % every == 0) {
                snprintf(buf, sizeof buf, "%zu", r);
                cairo_set_source_rgb(cr, 0, 0, 0);
                text_at(cr, b.x0 - 6, (ya + yb) / 2, buf, 10, 1, 0.5, false);
            }
        }
        cairo_set_line_width(cr, 1);
        Box bx = b;
        Axis a2 = ax_in;
        /* tick positions on the cells' scale [e0, e1] */
        for (int i = 0; i <= AXIS_MAX_TICKS; i++) {
            double v = a2.lo + i * a2.step;
            if (!(v <= a2.hi + a2.step * 1e-6)) break;
            double px = round(map(v, e0, e1, bx.x0, bx.x1)) + 0.5;
            cairo_set_source_rgb(cr, 0, 0, 0);
            cairo_move_to(cr, px, bx.y1);
            cairo_line_to(cr, px, bx.y1 + 4);
            cairo_stroke(cr);
            if (p + 1 == h->n_panels) {
                tick_label(buf, sizeof buf, v, &ax, false);
                text_at(cr, px, bx.y1 + 7, buf, 12, 0.5, 0, false);
            }
        }
        frame(cr, &b);
    }
    const double top = 68, bottom = 50 + (double)h->n_panels * (ph + 26) - 8;
    cairo_set_source_rgb(cr, 0, 0, 0);
    text_at(cr, (x0 + x1) / 2, H - 20, h->xlabel, 14, 0.5, 0.5, false);
    vertical_label(cr, 22, (top + bottom) / 2, h->ylabel, 14);

    /* colour bar */
    const double cx0 = x1 + 30, cx1 = x1 + 48;
    cairo_pattern_t *grad = cairo_pattern_create_linear(0, bottom, 0, top);
    for (int i = 0; i <= 16; i++) {
        unsigned char rgb[3];
        chart_colormap(i / 16.0, rgb);
        cairo_pattern_add_color_stop_rgb(grad, i / 16.0, rgb[0] / 255.0, rgb[1] / 255.0, rgb[2] / 255.0);
    }
    cairo_set_source(cr, grad);
    cairo_rectangle(cr, cx0, top, cx1 - cx0, bottom - top);
    cairo_fill(cr);
    cairo_pattern_destroy(grad);
    Box cb = { cx0, top, cx1, bottom };
    frame(cr, &cb);
    Axis av = axis_of(0, vmax);
    for (int i = 0; i <= AXIS_MAX_TICKS; i++) {
        double v = i * av.step;
        if (!(v <= vmax * (1 + 1e-9))) break;
        double py = round(map(v, 0, vmax, bottom, top)) + 0.5;
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, cx1, py);
        cairo_line_to(cr, cx1 + 4, py);
        cairo_stroke(cr);
        tick_label(buf, sizeof buf, v, &av, false);
        text_at(cr, cx1 + 6, py, buf, 11, 0, 0.5, false);
    }
    vertical_label(cr, HM_W - 14, (top + bottom) / 2, h->scale_label, 12);
}

/* ---------------------------------------------------------------- files */

typedef void (*DrawFn)(cairo_t *cr, const void *what);
static void draw_lines_fn(cairo_t *cr, const void *w) { draw_lines(cr, w); }
static void draw_heatmap_fn(cairo_t *cr, const void *w) { draw_heatmap(cr, w); }

static int render(DrawFn fn, const void *what, double W, double H, const char *base, char *err, size_t n)
{
    char path[4096];
    if (td_snprintf(path, sizeof path, "%s.png", base)) return td_snprintf(err, n, "%s: path too long", base), -1;
    cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, (int)ceil(W), (int)ceil(H));
    cairo_t *cr = cairo_create(s);
    fn(cr, what);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png(s, path);
    cairo_surface_destroy(s);
    if (st != CAIRO_STATUS_SUCCESS) return td_snprintf(err, n, "%s: %s", path, cairo_status_to_string(st)), -1;

    td_snprintf(path, sizeof path, "%s.svg", base);
    s = cairo_svg_surface_create(path, W, H);
    cr = cairo_create(s);
    fn(cr, what);
    st = cairo_status(cr);
    cairo_destroy(cr);
    cairo_surface_finish(s);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    if (st != CAIRO_STATUS_SUCCESS) return td_snprintf(err, n, "%s: %s", path, cairo_status_to_string(st)), -1;
    return 0;
}

int chart_lines_write(const LineChart *c, const char *base, char *err, size_t n)
{
    return render(draw_lines_fn, c, LC_W, LC_H, base, err, n);
}

int chart_heatmap_write(const Heatmap *h, const char *base, char *err, size_t n)
{
    return render(draw_heatmap_fn, h, HM_W, hm_height(h), base, err, n);
}

void chart_release(void)
{
    cairo_debug_reset_static_data();
    FcFini();
}
