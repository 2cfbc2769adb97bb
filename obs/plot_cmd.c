/* obs/plot_cmd.c - `tandem plot` (plot_cmd.h): which figures, from which
 * keys of metrics.jsonl, and the files they go to.
 *
 * A figure is a list of keys (or a family of keys such as comm_<group>_s)
 * drawn against one x key.  One run: one colour per key.  Several runs
 * (overlay): one colour per run, one dash pattern per key, the legend
 * naming run and key.  A figure none of whose keys any run holds is
 * skipped with one note line.  OUT/index.json lists every figure written
 * (files, legend entries, points per line) and every one skipped, for
 * scripts and tests that cannot read pictures.
 */
#include "obs/plot_cmd.h"
#include "core/args.h"
#include "core/common.h"
#include "obs/chart.h"
#include "obs/plot_out.h"
#include "obs/runlog.h"
#include "obs/serve_plot.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum {
    KEYS_LISTED,     /* exactly the keys listed */
    KEYS_COMM_TIME,  /* comm_<group>_s, one per parallel group of more than one rank */
    KEYS_COMM_MB,    /* comm_<group>_mb */
    KEYS_MEMORY,     /* every key holding "mem" and ending in _mb */
    KEYS_PREFIX,     /* every key starting with one of keys[] (the elements of arrays: "fwd_s[") */
} KeyFamily;

typedef struct {
    const char *name, *title, *xkey, *xlabel, *ylabel;
    KeyFamily family;
    const char *keys[4];
    const char *absent;   /* why a figure without data is skipped */
} FigSpec;

static const FigSpec g_figs[] = {
    { "loss_steps", "training loss", "step", "step", "nats per token", KEYS_LISTED,
      { "loss", "ce", "val_loss" }, "no loss, ce or val_loss" },
    { "loss_tokens", "training loss against tokens", "tokens_seen", "tokens seen", "nats per token", KEYS_LISTED,
      { "loss", "ce", "val_loss" }, "no loss, ce or val_loss (or no tokens_seen)" },
    { "router_loss", "router losses (mean over MoE layers)", "step", "step", "loss", KEYS_LISTED,
      { "aux", "z" }, "no aux or z (a dense model?)" },
    { "lr", "learning rate", "step", "step", "learning rate", KEYS_LISTED, { "lr" }, "no lr" },
    { "grad_norm", "gradient norm (before clipping)", "step", "step", "L2 norm", KEYS_LISTED, { "grad_norm" },
      "no grad_norm" },
    { "tokens_per_s", "throughput", "step", "step", "tokens per second", KEYS_LISTED, { "tokens_per_s" },
      "no tokens_per_s" },
    { "mfu", "utilisation", "step", "step", "fraction of the peak", KEYS_LISTED, { "mfu", "gemm_eff", "sgemm_eff" },
      "no mfu, gemm_eff or sgemm_eff" },
    { "comm_time", "communication time per group (rank 0; _max: the slowest rank)", "step", "step", "seconds per step", KEYS_COMM_TIME, { 0 },
      "no comm_<group>_s (a single rank has no communication groups)" },
    { "comm_bytes", "communication volume per group", "step", "step", "MiB per step", KEYS_COMM_MB, { 0 },
      "no comm_<group>_mb (a single rank has no communication groups)" },
    { "memory", "memory", "step", "step", "MiB", KEYS_MEMORY, { 0 }, "no *mem*_mb keys" },
    { "memory_rank", "memory per rank", "step", "step", "MiB", KEYS_PREFIX,
      { "mem_rank_mb.rss[", "mem_rank_mb.alloc_peak[", "mem_rank_mb.act[" }, "no mem_rank_mb" },
    { "stage_time", "forward and backward per pipeline stage (slowest rank)", "step", "step", "seconds per step",
      KEYS_PREFIX, { "fwd_s[", "bwd_s[" }, "no fwd_s or bwd_s" },
    { "layer_time", "time per layer kind, forward + backward (slowest rank)", "step", "step", "seconds per step",
      KEYS_LISTED, { "time_attn_s", "time_router_s", "time_experts_s", "time_head_s" }, "no time_<kind>_s" },
    { "act_rms", "activation RMS per layer (each layer's output)", "step", "step", "RMS", KEYS_PREFIX,
      { "act_rms[" }, "no act_rms (health_every=0?)" },
    { "logit_max", "largest |logit|", "step", "step", "|logit|", KEYS_LISTED, { "logit_max" }, "no logit_max" },
    { "expert_entropy", "routing balance: entropy of each MoE layer's expert load", "step", "step", "nats",
      KEYS_PREFIX, { "expert_entropy[" }, "no expert_entropy (a dense model?)" },
};
#define N_FIGS (sizeof g_figs / sizeof g_figs[0])

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static bool key_in_family(const FigSpec *f, const char *k)
{
    switch (f->family) {
    case KEYS_LISTED:
        for (int i = 0; i < 4 && f->keys[i]; i++)
            if (!strcmp(f->keys[i], k)) return true;
        return false;
    case KEYS_COMM_TIME:
        return !strncmp(k, "comm_", 5) && (ends_with(k, "_s") || ends_with(k, "_s_max")) && strcmp(k, "comm_s");
    case KEYS_COMM_MB: return !strncmp(k, "comm_", 5) && ends_with(k, "_mb");
    case KEYS_MEMORY: return strstr(k, "mem") && ends_with(k, "_mb");
    case KEYS_PREFIX:
        for (int i = 0; i < 4 && f->keys[i]; i++)
            if (!strncmp(k, f->keys[i], strlen(f->keys[i]))) return true;
        return false;
    }
    return false;
}

/* The keys of figure f that any run holds: listed ones in the listed order,
 * families in order of first appearance.  Returns the count (keys borrowed
 * from the runs, at most cap). */
static size_t figure_keys(const FigSpec *f, const RunLog *runs, size_t n_runs, const char **keys, size_t cap)
{
    size_t n = 0;
    if (f->family == KEYS_LISTED) {
        for (int i = 0; i < 4 && f->keys[i]; i++)
            for (size_t r = 0; r < n_runs; r++)
                if (runlog_get(&runs[r], f->keys[i]) && runlog_get(&runs[r], f->xkey)) {
                    keys[n++] = f->keys[i];
                    break;
                }
        return n;
    }
    for (size_t r = 0; r < n_runs; r++) {
        if (!runlog_get(&runs[r], f->xkey)) continue;
        for (size_t s = 0; s < runs[r].n_series && n < cap; s++) {
            const char *k = runs[r].series[s].key;
            if (!key_in_family(f, k)) continue;
            bool seen = false;
            for (size_t j = 0; j < n; j++) seen |= !strcmp(keys[j], k);
            if (!seen) keys[n++] = k;
        }
    }
    return n;
}

/* Legend name of each run: its directory's last component, or the whole
 * path as given when two runs share that. */
static char **run_names(const RunLog *runs, size_t n_runs)
{
    char **names = td_malloc(n_runs * sizeof(char *));
    for (size_t r = 0; r < n_runs; r++) {
        char *d = td_strdup(runs[r].dir);
        size_t len = strlen(d);
        while (len > 1 && d[len - 1] == '/') d[--len] = 0;
        const char *slash = strrchr(d, '/');
        names[r] = td_strdup(slash && slash[1] ? slash + 1 : d);
        td_free(d);
    }
    for (size_t r = 0; r < n_runs; r++)
        for (size_t q = 0; q < n_runs; q++)
            if (q != r && !strcmp(names[r], names[q]) && strcmp(runs[r].dir, runs[q].dir)) {
                td_free(names[r]);
                names[r] = td_strdup(runs[r].dir);
                break;
            }
    return names;
}

static int line_figure(PlotOut *o, const FigSpec *f, const RunLog *runs, char *const *names, size_t n_runs)
{
    const char *keys[64];
    size_t nk = figure_keys(f, runs, n_runs, keys, 64);
    if (!nk) {
        plot_out_skipped(o, f->name, f->absent);
        return 0;
    }
    ChartLine *lines = td_calloc(nk * n_runs * sizeof(ChartLine));
    char **labels = td_calloc(nk * n_runs * sizeof(char *));
    size_t *points = td_calloc(nk * n_runs * sizeof(size_t));
    size_t nl = 0;
    for (size_t r = 0; r < n_runs; r++) {
        const double *x = runlog_get(&runs[r], f->xkey);
        for (size_t k = 0; k < nk && x; k++) {
            const double *y = runlog_get(&runs[r], keys[k]);
            if (!y) continue;
            size_t fin = plot_n_finite(y, runs[r].n_rows);
            labels[nl] = n_runs > 1 ? td_sprintf("%s %s", names[r], keys[k]) : td_strdup(keys[k]);
            lines[nl] = (ChartLine){ labels[nl], x, y, runs[r].n_rows, n_runs > 1 ? (int)r : (int)k,
                                     n_runs > 1 ? (int)(k % 3) : 0, fin * 2 < runs[r].n_rows || fin == 1 };
            points[nl] = fin;
            nl++;
        }
    }
    LineChart c = { f->title, f->xlabel, f->ylabel, lines, nl, !strcmp(f->xkey, "tokens_seen") };
    char *base = td_sprintf("%s/%s", o->out, f->name);
    char err[4200];
    int rc = chart_lines_write(&c, base, err, sizeof err);
    if (rc) td_error("plot: %s", err);
    else plot_out_written(o, f->name, base, (const char *const *)labels, points, nl);
    td_free(base);
    for (size_t i = 0; i < nl; i++) td_free(labels[i]);
    td_free(labels);
    td_free(lines);
    td_free(points);
    return rc;
}

/* Columns of the expert-load heatmap at most: about one per pixel. */
#define LOAD_MAX_COLS 600

/* The expert-load heatmap of one run: per MoE layer, the share of the
 * layer's routed tokens that each expert received at each step. */
static int load_figure(PlotOut *o, const RunLog *r, const char *name, size_t n_runs)
{
    char fname[300];
    if (n_runs > 1) {
        snprintf(fname, sizeof fname, "expert_load-%s", name);
        for (char *p = fname; *p; p++)
            if (!(('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') || ('0' <= *p && *p <= '9') || *p == '-' ||
                  *p == '_' || *p == '.'))
                *p = '_';
    } else {
        snprintf(fname, sizeof fname, "expert_load");
    }
    const double *step = runlog_get(r, "step");
    if (!r->load) {
        char why[400];
        snprintf(why, sizeof why, "%s has no expert_load (a dense model, or a run from before the key)", r->path);
        plot_out_skipped(o, fname, why);
        return 0;
    }
    const size_t L = r->n_layers, E = r->n_expert, S = r->n_rows;
    size_t n_moe = 0;
    int *layer = td_malloc(L * sizeof(int));
    for (size_t l = 0; l < L; l++) {
        bool any = false;
        for (size_t s = 0; s < S && !any; s++) any = isfinite(r->load[(s * L + l) * E]);
        if (any) layer[n_moe++] = (int)l;
    }
    /* columns: one per row, or the mean over consecutive rows when there
     * are more rows than LOAD_MAX_COLS (about a pixel each) */
    const size_t C = S < LOAD_MAX_COLS ? S : LOAD_MAX_COLS;
    double *v = td_malloc((n_moe * E * C + 1) * sizeof(double));
    double *x = td_malloc((C + 1) * sizeof(double));
    double vmax = 0;
    for (size_t col = 0; col < C; col++) {
        const size_t s0 = col * S / C, s1 = (col + 1) * S / C;
        x[col] = 0;
        for (size_t s = s0; s < s1; s++) x[col] += step[s] / (double)(s1 - s0);
        for (size_t p = 0; p < n_moe; p++)
            for (size_t e = 0; e < E; e++) {
                double sum = 0;
                size_t n = 0;
                for (size_t s = s0; s < s1; s++) {
                    const double *c = r->load + (s * L + (size_t)layer[p]) * E;
                    double tot = 0;
                    for (size_t j = 0; j < E; j++) tot += c[j];
                    if (isfinite(tot) && tot > 0) sum += c[e] / tot, n++;
                }
                double share = n ? sum / (double)n : NAN;
                v[(p * E + e) * C + col] = share;
                if (isfinite(share)) vmax = fmax(vmax, share);
            }
    }
    char **plabel = td_malloc((n_moe + 1) * sizeof(char *));
    for (size_t p = 0; p < n_moe; p++) plabel[p] = td_sprintf("layer %d", layer[p]);
    char *title = td_sprintf("expert load: share of each MoE layer's routed tokens (%s)", name);
    Heatmap h = { title, "step", "expert", "share of the layer's tokens", n_moe, E, C,
                  (const char *const *)plabel, x, v, vmax };
    char *base = td_sprintf("%s/%s", o->out, fname);
    char err[4200];
    int rc = chart_heatmap_write(&h, base, err, sizeof err);
    if (rc) {
        td_error("plot: %s", err);
    } else {
        size_t *pts = td_malloc((n_moe + 1) * sizeof(size_t));
        for (size_t p = 0; p < n_moe; p++) pts[p] = C;
        plot_out_written(o, fname, base, (const char *const *)plabel, pts, n_moe);
        td_free(pts);
    }
    td_free(base);
    td_free(title);
    for (size_t p = 0; p < n_moe; p++) td_free(plabel[p]);
    td_free(plabel);
    td_free(v);
    td_free(x);
    td_free(layer);
    return rc;
}

int cmd_plot(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)   /* the serving figures: obs/serve_plot.c */
        if (!strcmp(argv[i], "--serve") || !strncmp(argv[i], "--serve=", 8)) return cmd_plot_serve(argc, argv);
    static const char *const spec[] = { "out=", NULL };
    Args a = { 0 };
    char err[4200];
    if (args_parse(&a, argc, argv, 1, spec, err, sizeof err)) {
        td_error("plot: %s", err);
        return 2;
    }
    if (a.help || !a.n_pos) {
        FILE *f = a.help ? stdout : stderr;
        fprintf(f, "usage: tandem plot RUN_DIR [RUN_DIR ...] [--out DIR]\n"
                   "       tandem plot --serve SCRAPE_LOG [--out DIR]   (a server's figures: --serve --help)\n"
                   "Draws the figures of each run's RUN_DIR/metrics.jsonl as PNG and SVG into DIR\n"
                   "(default: the first RUN_DIR/plots): loss against steps and tokens, router\n"
                   "losses, learning rate, gradient norm, throughput, MFU, communication per\n"
                   "group, memory (per rank), time per stage and layer kind, activation RMS,\n"
                   "largest logit, routing entropy, and an expert-load heatmap per run.  Several\n"
                   "runs are drawn over each other.  Prints the paths written (docs/observability.md).\n");
        int rc = a.help ? 0 : 2;
        args_free(&a);
        return rc;
    }
    const size_t n_runs = (size_t)a.n_pos;
    RunLog *runs = td_calloc(n_runs * sizeof(RunLog));
    int rc = 0;
    for (size_t r = 0; r < n_runs && !rc; r++) {
        if (runlog_read(&runs[r], a.pos[r], err, sizeof err)) {
            td_error("plot: %s", err);
            rc = 2;
        } else if (runs[r].cut_line) {
            td_info("plot: %s:%ld: cut short (a run still writing?), skipped", runs[r].path, runs[r].cut_line);
        }
    }
    PlotOut o = { 0 };
    char *out = NULL;
    if (!rc) {
        out = args_get(&a, "out") ? td_strdup(args_get(&a, "out")) : td_sprintf("%s/plots", a.pos[0]);
        if (td_mkdir_p(out)) {
            td_error("plot: %s: %s", out, strerror(errno));
            rc = 1;
        }
    }
    if (!rc) {
        o.out = out;
        cJSON *root = cJSON_CreateObject();
        cJSON *rj = cJSON_AddArrayToObject(root, "runs");
        o.figures = cJSON_AddArrayToObject(root, "figures");
        o.skipped = cJSON_AddArrayToObject(root, "skipped");
        char **names = run_names(runs, n_runs);
        for (size_t r = 0; r < n_runs; r++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "dir", runs[r].dir);
            cJSON_AddStringToObject(x, "name", names[r]);
            cJSON_AddNumberToObject(x, "rows", (double)runs[r].n_rows);
            cJSON_AddItemToArray(rj, x);
        }
        for (size_t i = 0; i < N_FIGS && !rc; i++)
            if (line_figure(&o, &g_figs[i], runs, names, n_runs)) rc = 1;
        for (size_t r = 0; r < n_runs && !rc; r++)
            if (load_figure(&o, &runs[r], names[r], n_runs)) rc = 1;
        if (!rc && plot_out_index(&o, root)) rc = 1;
        for (size_t r = 0; r < n_runs; r++) td_free(names[r]);
        td_free(names);
        cJSON_Delete(root);
    }
    if (o.out) chart_release();
    td_free(out);
    for (size_t r = 0; r < n_runs; r++) runlog_free(&runs[r]);
    td_free(runs);
    args_free(&a);
    return rc;
}
