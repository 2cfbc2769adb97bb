/* obs/serve_plot.c - `tandem plot --serve` (serve_plot.h): a scrape log of
 * /metrics read into scrapes of (series, value) samples, the interval
 * figures computed from consecutive scrapes, drawn with obs/chart.c.
 *
 * Figures (x: seconds since the first scrape, one point per interval,
 * at its end; an interval without observations leaves a gap):
 *   serve_ttft, serve_itl, serve_queue_wait   p50 and p99 (ms) of the
 *       interval's observations of tandem_time_to_first_token_seconds,
 *       tandem_inter_token_latency_seconds, tandem_queue_wait_seconds
 *   serve_tokens_per_s     generated and prompt tokens per second
 *   serve_requests_per_s   finished choices and completed HTTP requests per second
 *   serve_cache            tandem_kv_occupancy_ratio at each scrape, and the
 *                          interval's prefix-cache hit rate (hit / query tokens)
 *   serve_expert_load      heatmap: per MoE layer, each expert's share of
 *                          the tokens routed in the interval
 * A figure whose metrics the log lacks is skipped with one note line.
 *
 * A quantile is Prometheus's histogram_quantile: the bucket holding the
 * rank, linear inside it (from 0 for the first); in the +Inf bucket, the
 * largest finite bound.
 */
#include "obs/serve_plot.h"
#include "core/args.h"
#include "core/common.h"
#include "obs/chart.h"
#include "obs/plot_out.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_BUCKETS 64

typedef struct {
    const char *series;   /* name{labels} (points into the log's text) */
    double v;
} Sample;

typedef struct {
    double t;             /* unix time of the scrape */
    long line;            /* of its "# scrape" line */
    Sample *s;
    size_t n, cap;
} Scrape;

typedef struct {
    const char *path;
    char *text;           /* owned: the file, cut into NUL-terminated pieces */
    Scrape *sc;
    size_t n, cap;
} ScrapeLog;

static void log_free(ScrapeLog *g)
{
    for (size_t i = 0; i < g->n; i++) td_free(g->sc[i].s);
    td_free(g->sc);
    td_free(g->text);
    memset(g, 0, sizeof *g);
}

static bool parse_double(const char *s, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return end != s && !*end && errno != ERANGE;
}

/* Reads and checks the log.  0, or 2 with one line in err. */
static int log_read(ScrapeLog *g, const char *path, char *err, size_t n_err)
{
    memset(g, 0, sizeof *g);
    g->path = path;
    size_t len = 0;
    if (td_read_file(path, (size_t)1 << 34, &g->text, &len, err, n_err)) return 2;
    if (!len) {
        snprintf(err, n_err, "%s: no scrapes (an empty file)", path);
        return 2;
    }
    const bool cut_tail = g->text[len - 1] != '\n';
    char *p = g->text;
    long line = 0;
    while (*p) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        char *l = p;
        p = nl ? nl + 1 : p + strlen(p);
        size_t ll = strlen(l);
        if (ll && l[ll - 1] == '\r') l[--ll] = 0;
        if (!strncmp(l, "# scrape", 8) && (l[8] == ' ' || !l[8])) {
            double t;
            if (!parse_double(l[8] ? l + 9 : l + 8, &t) || t <= 0) {
                snprintf(err, n_err, "%s:%ld: '# scrape' without a unix time", path, line);
                return 2;
            }
            if (g->n == g->cap) {
                g->cap = 2 * g->cap + 16;
                Scrape *s = td_calloc(g->cap * sizeof(Scrape));
                if (g->n) memcpy(s, g->sc, g->n * sizeof(Scrape));
                td_free(g->sc);
                g->sc = s;
            }
            g->sc[g->n++] = (Scrape){ t, line, NULL, 0, 0 };
            continue;
        }
        if (!ll) continue;
        if (!g->n) {
            snprintf(err, n_err, "%s:%ld: not a scrape log (its first line must be '# scrape <unix time>')", path,
                     line);
            return 2;
        }
        if (l[0] == '#') continue;   /* HELP and TYPE */
        /* name{labels} value [timestamp]: the labels may hold spaces */
        char *sp = strchr(l, '{');
        sp = sp ? strchr(sp, '}') : l;
        sp = sp ? strchr(sp, ' ') : NULL;
        if (!sp) {
            snprintf(err, n_err, "%s:%ld: not a Prometheus sample (name{labels} value)", path, line);
            return 2;
        }
        *sp = 0;
        char *val = sp + 1, *ts = strchr(val, ' ');
        if (ts) *ts = 0;
        double v;
        if (!parse_double(val, &v) && strcmp(val, "+Inf") && strcmp(val, "-Inf") && strcmp(val, "NaN")) {
            snprintf(err, n_err, "%s:%ld: not a Prometheus sample (value '%s')", path, line, val);
            return 2;
        }
        if (!strcmp(val, "+Inf")) v = INFINITY;
        else if (!strcmp(val, "-Inf")) v = -INFINITY;
        else if (!strcmp(val, "NaN")) v = NAN;
        Scrape *s = &g->sc[g->n - 1];
        if (s->n == s->cap) {
            s->cap = 2 * s->cap + 64;
            Sample *x = td_malloc(s->cap * sizeof(Sample));
            if (s->n) memcpy(x, s->s, s->n * sizeof(Sample));
            td_free(s->s);
            s->s = x;
        }
        s->s[s->n++] = (Sample){ l, v };
    }
    if (!g->n) {
        snprintf(err, n_err, "%s: no scrapes (no '# scrape <unix time>' line)", path);
        return 2;
    }
    const Scrape *last = &g->sc[g->n - 1];
    const size_t before = g->n > 1 ? g->sc[g->n - 2].n : 0;
    if (cut_tail || !last->n || last->n < before) {
        if (cut_tail)
            snprintf(err, n_err, "%s:%ld: the last scrape is cut short (no newline at the end of the file)", path,
                     last->line);
        else
            snprintf(err, n_err, "%s:%ld: the last scrape is cut short (%zu samples, the one before has %zu)", path,
                     last->line, last->n, before);
        return 2;
    }
    if (g->n < 2) {
        snprintf(err, n_err, "%s: one scrape: the figures need two or more (their intervals)", path);
        return 2;
    }
    for (size_t i = 1; i < g->n; i++)
        if (!(g->sc[i].t > g->sc[i - 1].t)) {
            snprintf(err, n_err, "%s:%ld: scrape time %.3f is not after the one before (%.3f)", path, g->sc[i].line,
                     g->sc[i].t, g->sc[i - 1].t);
            return 2;
        }
    return 0;
}

/* The value of series in s (NAN when absent).  *hint: where it was found
 * last (the server renders in one order, so usually at the same index). */
static double get(const Scrape *s, const char *series, size_t *hint)
{
    if (*hint < s->n && !strcmp(s->s[*hint].series, series)) return s->s[*hint].v;
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->s[i].series, series)) {
            *hint = i;
            return s->s[i].v;
        }
    return NAN;
}

/* Sum of every series of s named name (any labels, or none); NAN if none. */
static double get_sum(const Scrape *s, const char *name)
{
    size_t k = strlen(name);
    double sum = 0;
    bool any = false;
    for (size_t i = 0; i < s->n; i++) {
        const char *x = s->s[i].series;
        if (!strncmp(x, name, k) && (!x[k] || x[k] == '{')) sum += s->s[i].v, any = true;
    }
    return any ? sum : NAN;
}

/* The buckets of histogram name in s: upper bounds and cumulative counts
 * in the order rendered (ascending).  Returns how many. */
static size_t buckets(const Scrape *s, const char *name, double *le, double *cum)
{
    char pre[160];
    int k = snprintf(pre, sizeof pre, "%s_bucket{le=\"", name);
    size_t n = 0;
    for (size_t i = 0; i < s->n && n < MAX_BUCKETS; i++) {
        const char *x = s->s[i].series;
        if (strncmp(x, pre, (size_t)k)) continue;
        le[n] = !strncmp(x + k, "+Inf", 4) ? INFINITY : strtod(x + k, NULL);
        cum[n++] = s->s[i].v;
    }
    return n;
}

/* Quantile q of the observations between scrapes a and b (NAN: none, or
 * the buckets changed, or a counter went back: a restarted server). */
static double quantile(const Scrape *a, const Scrape *b, const char *name, double q)
{
    double la[MAX_BUCKETS], ca[MAX_BUCKETS], lb[MAX_BUCKETS], cb[MAX_BUCKETS], d[MAX_BUCKETS];
    size_t na = buckets(a, name, la, ca), nb = buckets(b, name, lb, cb);
    if (!nb || na != nb) return NAN;
    for (size_t i = 0; i < nb; i++) {
        if (la[i] != lb[i]) return NAN;
        d[i] = cb[i] - ca[i];
        if (d[i] < 0) return NAN;
    }
    const double total = d[nb - 1];
    if (!(total > 0)) return NAN;
    const double rank = q * total;
    size_t i = 0;
    while (i < nb - 1 && d[i] < rank) i++;
    if (isinf(lb[i])) return i ? lb[i - 1] : NAN;
    const double lo = i ? lb[i - 1] : 0, below = i ? d[i - 1] : 0, in = d[i] - below;
    return in > 0 ? lo + (lb[i] - lo) * (rank - below) / in : lb[i];
}

/* Writes figure name from nl lines over x (n points each); records it. */
static int write_lines(PlotOut *o, const char *name, const char *title, const char *ylabel, const double *x,
                       size_t n, const char *const *labels, double *const *ys, size_t nl)
{
    ChartLine lines[8];
    size_t points[8];
    for (size_t i = 0; i < nl; i++) {
        points[i] = plot_n_finite(ys[i], n);
        lines[i] = (ChartLine){ labels[i], x, ys[i], n, (int)i, 0, points[i] * 2 < n || points[i] == 1 };
    }
    LineChart c = { title, "seconds since the first scrape", ylabel, lines, nl, false };
    char *base = td_sprintf("%s/%s", o->out, name);
    char err[4200];
    int rc = chart_lines_write(&c, base, err, sizeof err);
    if (rc) td_error("plot: %s", err);
    else plot_out_written(o, name, base, labels, points, nl);
    td_free(base);
    return rc;
}

static bool any_finite(double *const *ys, size_t nl, size_t n)
{
    for (size_t i = 0; i < nl; i++)
        if (plot_n_finite(ys[i], n)) return true;
    return false;
}

/* p50 and p99 of histogram hist (seconds) in milliseconds, per interval. */
static int latency_figure(PlotOut *o, const ScrapeLog *g, const double *x, const char *name, const char *hist,
                          const char *title)
{
    const size_t n = g->n - 1;
    double *y[2] = { td_malloc(n * sizeof(double)), td_malloc(n * sizeof(double)) };
    for (size_t j = 0; j < n; j++) {
        y[0][j] = 1000 * quantile(&g->sc[j], &g->sc[j + 1], hist, 0.5);
        y[1][j] = 1000 * quantile(&g->sc[j], &g->sc[j + 1], hist, 0.99);
    }
    int rc = 0;
    if (!any_finite(y, 2, n)) {
        char why[300];
        snprintf(why, sizeof why, "no observations of %s between scrapes", hist);
        plot_out_skipped(o, name, why);
    } else {
        static const char *const lab[2] = { "p50", "p99" };
        rc = write_lines(o, name, title, "milliseconds", x, n, lab, y, 2);
    }
    td_free(y[0]);
    td_free(y[1]);
    return rc;
}

/* Per interval: the increase of the sum of counters names[i] per second. */
static int rate_figure(PlotOut *o, const ScrapeLog *g, const double *x, const char *name, const char *title,
                       const char *ylabel, const char *const *names, const char *const *labels, size_t nl)
{
    const size_t n = g->n - 1;
    double *y[8];
    for (size_t i = 0; i < nl; i++) {
        y[i] = td_malloc(n * sizeof(double));
        for (size_t j = 0; j < n; j++) {
            double a = get_sum(&g->sc[j], names[i]), b = get_sum(&g->sc[j + 1], names[i]);
            y[i][j] = b >= a ? (b - a) / (g->sc[j + 1].t - g->sc[j].t) : NAN;
        }
    }
    int rc = 0;
    if (!any_finite(y, nl, n)) plot_out_skipped(o, name, "none of its counters in the scrapes");
    else rc = write_lines(o, name, title, ylabel, x, n, labels, y, nl);
    for (size_t i = 0; i < nl; i++) td_free(y[i]);
    return rc;
}

static int cache_figure(PlotOut *o, const ScrapeLog *g, const double *x)
{
    const size_t n = g->n - 1;
    double *y[2] = { td_malloc(n * sizeof(double)), td_malloc(n * sizeof(double)) };
    size_t h[5] = { 0 };
    for (size_t j = 0; j < n; j++) {
        const Scrape *a = &g->sc[j], *b = &g->sc[j + 1];
        y[0][j] = get(b, "tandem_kv_occupancy_ratio", &h[0]);
        double dq = get(b, "tandem_prefix_cache_query_tokens_total", &h[1]) -
                    get(a, "tandem_prefix_cache_query_tokens_total", &h[2]);
        double dh = get(b, "tandem_prefix_cache_hit_tokens_total", &h[3]) -
                    get(a, "tandem_prefix_cache_hit_tokens_total", &h[4]);
        y[1][j] = dq > 0 && dh >= 0 ? dh / dq : NAN;
    }
    int rc = 0;
    if (!any_finite(y, 2, n)) {
        plot_out_skipped(o, "serve_cache", "no tandem_kv_occupancy_ratio or prefix-cache counters");
    } else {
        static const char *const lab[2] = { "KV occupancy (blocks held by requests / all)",
                                            "prefix-cache hit rate (hit / looked-up tokens)" };
        rc = write_lines(o, "serve_cache", "KV cache and prefix cache", "fraction", x, n, lab, y, 2);
    }
    td_free(y[0]);
    td_free(y[1]);
    return rc;
}

/* The (layer, expert) of a tandem_expert_tokens_total series; false if it is not one. */
static bool expert_series(const char *s, int *layer, int *expert)
{
    static const char pre[] = "tandem_expert_tokens_total{";
    if (strncmp(s, pre, sizeof pre - 1)) return false;
    const char *l = strstr(s, "layer=\""), *e = strstr(s, "expert=\"");
    if (!l || !e) return false;
    *layer = atoi(l + 7);
    *expert = atoi(e + 8);
    return *layer >= 0 && *expert >= 0;
}

static int expert_figure(PlotOut *o, const ScrapeLog *g, const double *x)
{
    /* the shape: the last scrape's layers (in order) and experts */
    const Scrape *last = &g->sc[g->n - 1];
    int *layers = td_malloc((last->n + 1) * sizeof(int));
    size_t n_l = 0, E = 0;
    for (size_t i = 0; i < last->n; i++) {
        int l, e;
        if (!expert_series(last->s[i].series, &l, &e)) continue;
        size_t p = 0;
        while (p < n_l && layers[p] != l) p++;
        if (p == n_l) layers[n_l++] = l;
        if ((size_t)e + 1 > E) E = (size_t)e + 1;
    }
    if (!n_l) {
        plot_out_skipped(o, "serve_expert_load", "no tandem_expert_tokens_total (a dense model?)");
        td_free(layers);
        return 0;
    }
    const size_t C = g->n - 1;
    double *cnt = td_malloc(g->n * n_l * E * sizeof(double));   /* (scrape, layer, expert) */
    for (size_t i = 0; i < g->n * n_l * E; i++) cnt[i] = NAN;
    for (size_t j = 0; j < g->n; j++)
        for (size_t i = 0; i < g->sc[j].n; i++) {
            int l, e;
            if (!expert_series(g->sc[j].s[i].series, &l, &e) || (size_t)e >= E) continue;
            size_t p = 0;
            while (p < n_l && layers[p] != l) p++;
            if (p < n_l) cnt[(j * n_l + p) * E + (size_t)e] = g->sc[j].s[i].v;
        }
    double *v = td_malloc(n_l * E * C * sizeof(double)), vmax = 0;
    for (size_t p = 0; p < n_l; p++)
        for (size_t c = 0; c < C; c++) {
            double tot = 0;
            for (size_t e = 0; e < E; e++) tot += cnt[((c + 1) * n_l + p) * E + e] - cnt[(c * n_l + p) * E + e];
            for (size_t e = 0; e < E; e++) {
                double d = cnt[((c + 1) * n_l + p) * E + e] - cnt[(c * n_l + p) * E + e];
                double share = isfinite(tot) && tot > 0 && d >= 0 ? d / tot : NAN;
                v[(p * E + e) * C + c] = share;
                if (isfinite(share)) vmax = fmax(vmax, share);
            }
        }
    /* the heatmap's columns start at each interval's beginning */
    double *xc = td_malloc(C * sizeof(double));
    for (size_t c = 0; c < C; c++) xc[c] = c ? x[c - 1] : 0;
    char **plabel = td_malloc(n_l * sizeof(char *));
    for (size_t p = 0; p < n_l; p++) plabel[p] = td_sprintf("layer %d", layers[p]);
    Heatmap h = { "expert load: share of each MoE layer's routed tokens per interval",
                  "seconds since the first scrape", "expert", "share of the layer's tokens", n_l, E, C,
                  (const char *const *)plabel, xc, v, vmax > 0 ? vmax : 1 };
    char *base = td_sprintf("%s/serve_expert_load", o->out);
    char err[4200];
    int rc = chart_heatmap_write(&h, base, err, sizeof err);
    if (rc) {
        td_error("plot: %s", err);
    } else {
        size_t *pts = td_malloc(n_l * sizeof(size_t));
        for (size_t p = 0; p < n_l; p++) pts[p] = C;
        plot_out_written(o, "serve_expert_load", base, (const char *const *)plabel, pts, n_l);
        td_free(pts);
    }
    td_free(base);
    for (size_t p = 0; p < n_l; p++) td_free(plabel[p]);
    td_free(plabel);
    td_free(xc);
    td_free(v);
    td_free(cnt);
    td_free(layers);
    return rc;
}

int cmd_plot_serve(int argc, char **argv)
{
    static const char *const spec[] = { "serve=", "out=", NULL };
    Args a = { 0 };
    char err[4200];
    if (args_parse(&a, argc, argv, 1, spec, err, sizeof err)) {
        td_error("plot: %s", err);
        return 2;
    }
    const char *path = args_get(&a, "serve");
    if (a.help || !path || !path[0] || a.n_pos) {
        FILE *f = a.help ? stdout : stderr;
        fprintf(f, "usage: tandem plot --serve SCRAPE_LOG [--out DIR]\n"
                   "Draws the serving figures of a scrape log (GET /metrics every interval, each\n"
                   "scrape after a line '# scrape <unix time>'; bench/soak_load.py --scrape-log)\n"
                   "as PNG and SVG into DIR (default: SCRAPE_LOG's directory/plots): TTFT,\n"
                   "inter-token and queue-wait p50/p99, tokens and requests per second, KV\n"
                   "occupancy and prefix-cache hit rate, expert load over time\n"
                   "(docs/observability.md).\n");
        int rc = a.help ? 0 : 2;
        args_free(&a);
        return rc;
    }
    ScrapeLog g;
    int rc = log_read(&g, path, err, sizeof err);
    if (rc) td_error("plot: %s", err);
    char *out = NULL;
    if (!rc) {
        if (args_get(&a, "out")) {
            out = td_strdup(args_get(&a, "out"));
        } else {
            const char *slash = strrchr(path, '/');
            out = slash ? td_sprintf("%.*s/plots", (int)(slash - path), path) : td_strdup("plots");
        }
        if (td_mkdir_p(out)) {
            td_error("plot: %s: %s", out, strerror(errno));
            rc = 1;
        }
    }
    if (!rc) {
        PlotOut o = { out, NULL, NULL };
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "scrape_log", path);
        cJSON_AddNumberToObject(root, "scrapes", (double)g.n);
        o.figures = cJSON_AddArrayToObject(root, "figures");
        o.skipped = cJSON_AddArrayToObject(root, "skipped");
        const size_t n = g.n - 1;
        double *x = td_malloc(n * sizeof(double));
        for (size_t j = 0; j < n; j++) x[j] = g.sc[j + 1].t - g.sc[0].t;
        static const char *const tok_n[2] = { "tandem_generation_tokens_total", "tandem_prompt_tokens_total" };
        static const char *const tok_l[2] = { "generated", "prompt (computed, not found cached)" };
        static const char *const req_n[2] = { "tandem_requests_total", "tandem_request_seconds_count" };
        static const char *const req_l[2] = { "finished choices", "completed HTTP requests" };
        rc = latency_figure(&o, &g, x, "serve_ttft", "tandem_time_to_first_token_seconds",
                            "time to first token (per interval)");
        if (!rc)
            rc = latency_figure(&o, &g, x, "serve_itl", "tandem_inter_token_latency_seconds",
                                "inter-token latency (per interval)");
        if (!rc)
            rc = latency_figure(&o, &g, x, "serve_queue_wait", "tandem_queue_wait_seconds",
                                "queue wait: submission to first scheduled (per interval)");
        if (!rc)
            rc = rate_figure(&o, &g, x, "serve_tokens_per_s", "token throughput", "tokens per second", tok_n, tok_l,
                             2);
        if (!rc)
            rc = rate_figure(&o, &g, x, "serve_requests_per_s", "request throughput", "per second", req_n, req_l, 2);
        if (!rc) rc = cache_figure(&o, &g, x);
        if (!rc) rc = expert_figure(&o, &g, x);
        if (!rc && plot_out_index(&o, root)) rc = 1;
        td_free(x);
        cJSON_Delete(root);
        chart_release();
    }
    td_free(out);
    log_free(&g);
    args_free(&a);
    return rc;
}
