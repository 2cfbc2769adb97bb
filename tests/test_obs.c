/* tests/test_obs.c - obs/: metrics.jsonl read back into columns (runlog.h)
 * and the charts written through cairo (chart.h).  The pictures themselves
 * are decoded and checked by tests/cli/plot.sh; here: the reader's rules
 * (gaps, a cut-short last line, errors naming the line, expert_load's
 * shape) and that both files come out, under ASan in `make asan-test`. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "obs/chart.h"
#include "obs/runlog.h"

/* A fresh run directory holding metrics.jsonl = text; td_free the path. */
static char *run_with(const char *text)
{
    char tmpl[] = "/tmp/tandem-test-obs.XXXXXX";
    cr_assert(mkdtemp(tmpl));
    char *dir = td_strdup(tmpl), *path = td_sprintf("%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    td_free(path);
    return dir;
}

static void run_rm(char *dir)
{
    char *cmd = td_sprintf("rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    td_free(cmd);
    td_free(dir);
}

/* runlog_read's error for text, or "" when it read. */
static void read_err(const char *text, char *err, size_t n)
{
    char *dir = run_with(text);
    RunLog r;
    err[0] = 0;
    if (!runlog_read(&r, dir, err, n)) runlog_free(&r);
    run_rm(dir);
}

Test(runlog, columns_with_gaps)
{
    char *dir = run_with("{\"step\":1,\"loss\":2.5,\"val_loss\":3,\"note\":\"x\"}\n\n{\"step\":2,\"loss\":1.5}\n");
    RunLog r;
    char err[512];
    cr_assert_eq(runlog_read(&r, dir, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_rows, 2);
    cr_assert_eq(r.cut_line, 0);
    const double *loss = runlog_get(&r, "loss"), *val = runlog_get(&r, "val_loss"), *step = runlog_get(&r, "step");
    cr_assert(loss && val && step);
    cr_assert(loss[0] == 2.5 && loss[1] == 1.5 && step[1] == 2);
    cr_assert(val[0] == 3 && isnan(val[1]), "a key absent from a row is NAN there");
    cr_assert_null(runlog_get(&r, "note"), "strings are not series");
    cr_assert_null(r.load);
    runlog_free(&r);
    runlog_free(&r);   /* safe twice */
    run_rm(dir);
}

Test(runlog, cut_last_line_is_skipped)
{
    char *dir = run_with("{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1}\n{\"step\":3,\"lo");
    RunLog r;
    char err[512];
    cr_assert_eq(runlog_read(&r, dir, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_rows, 2);
    cr_assert_eq(r.cut_line, 3);
    runlog_free(&r);
    run_rm(dir);
    /* a whole last line without its newline is a row */
    dir = run_with("{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1}");
    cr_assert_eq(runlog_read(&r, dir, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_rows, 2);
    cr_assert_eq(r.cut_line, 0);
    runlog_free(&r);
    run_rm(dir);
}

Test(runlog, errors_name_the_line)
{
    char err[512];
    read_err("{\"step\":1}\n{\"step\":2,\n{\"step\":3}\n", err, sizeof err);
    cr_assert(strstr(err, "metrics.jsonl:2: not JSON"), "%s", err);
    /* a broken last line WITH its newline is finished: an error, not a cut */
    read_err("{\"step\":1}\n{\"step\":2,\n", err, sizeof err);
    cr_assert(strstr(err, "metrics.jsonl:2: not JSON"), "%s", err);
    read_err("{\"step\":1}\n[1,2]\n", err, sizeof err);
    cr_assert(strstr(err, ":2: not a JSON object"), "%s", err);
    read_err("{\"step\":\"1\"}\n", err, sizeof err);
    cr_assert(strstr(err, ":1: no numeric \"step\""), "%s", err);
    read_err("{\"step\":1} trailing\n", err, sizeof err);
    cr_assert(strstr(err, ":1: not JSON"), "%s", err);
    read_err("", err, sizeof err);
    cr_assert(strstr(err, "no metrics rows"), "%s", err);
    RunLog r;
    cr_assert_eq(runlog_read(&r, "/nonexistent/run", err, sizeof err), -1);
    cr_assert(strstr(err, "/nonexistent/run: No such file"), "%s", err);
}

Test(runlog, arrays_and_objects_become_element_series)
{
    char *dir = run_with("{\"step\":1,\"fwd_s\":[0.5,0.25],\"act_rms\":[1,null,3],"
                         "\"mem_rank_mb\":{\"rss\":[10,20],\"act\":[1,2]},\"loss_spike\":false}\n"
                         "{\"step\":2,\"fwd_s\":[0.75,0.5]}\n");
    RunLog r;
    char err[512];
    cr_assert_eq(runlog_read(&r, dir, err, sizeof err), 0, "%s", err);
    const double *f0 = runlog_get(&r, "fwd_s[0]"), *f1 = runlog_get(&r, "fwd_s[1]");
    cr_assert(f0 && f1 && f0[0] == 0.5 && f1[0] == 0.25 && f0[1] == 0.75 && f1[1] == 0.5);
    cr_assert_null(runlog_get(&r, "fwd_s"), "an array is not itself a series");
    const double *a0 = runlog_get(&r, "act_rms[0]"), *a2 = runlog_get(&r, "act_rms[2]");
    cr_assert(a0 && a2 && a0[0] == 1 && a2[0] == 3 && isnan(a0[1]), "act_rms absent in row 2: NAN");
    cr_assert_null(runlog_get(&r, "act_rms[1]"), "a null element is no series");
    const double *rss1 = runlog_get(&r, "mem_rank_mb.rss[1]"), *act0 = runlog_get(&r, "mem_rank_mb.act[0]");
    cr_assert(rss1 && act0 && rss1[0] == 20 && act0[0] == 1);
    cr_assert_null(runlog_get(&r, "loss_spike"), "booleans are not series");
    runlog_free(&r);
    run_rm(dir);
}

Test(runlog, expert_load)
{
    char *dir = run_with("{\"step\":1,\"expert_load\":[null,[1,2,5]]}\n{\"step\":2}\n"
                         "{\"step\":3,\"expert_load\":[null,[4,4,0]]}\n");
    RunLog r;
    char err[512];
    cr_assert_eq(runlog_read(&r, dir, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_layers, 2);
    cr_assert_eq(r.n_expert, 3);
    const size_t L = 2, E = 3;
    cr_assert(isnan(r.load[(0 * L + 0) * E]), "a dense layer is NAN");
    cr_assert(r.load[(0 * L + 1) * E + 2] == 5);
    cr_assert(isnan(r.load[(1 * L + 1) * E]), "a row without expert_load is NAN");
    cr_assert(r.load[(2 * L + 1) * E + 0] == 4 && r.load[(2 * L + 1) * E + 2] == 0);
    runlog_free(&r);
    run_rm(dir);
    read_err("{\"step\":1,\"expert_load\":[[1,2],[3,4]]}\n{\"step\":2,\"expert_load\":[[1,2,3],[3,4,5]]}\n", err,
             sizeof err);
    cr_assert(strstr(err, ":2: expert_load is 2 x 3 here, 2 x 2 in earlier rows"), "%s", err);
    read_err("{\"step\":1,\"expert_load\":[[1,2],[3]]}\n", err, sizeof err);
    cr_assert(strstr(err, ":1: expert_load: every layer"), "%s", err);
    read_err("{\"step\":1,\"expert_load\":[[1,\"a\"]]}\n", err, sizeof err);
    cr_assert(strstr(err, ":1: expert_load holds a value that is not a number"), "%s", err);
}

static void assert_starts(const char *path, const char *magic, size_t n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s not written", path);
    char buf[16] = { 0 };
    cr_assert_eq(fread(buf, 1, n, f), n, "%s too short", path);
    fclose(f);
    cr_assert_eq(memcmp(buf, magic, n), 0, "%s does not start as it should", path);
}

Test(chart, writes_png_and_svg)
{
    char tmpl[] = "/tmp/tandem-test-chart.XXXXXX";
    cr_assert(mkdtemp(tmpl));
    double x[5] = { 1, 2, 3, 4, 5 }, y[5] = { 3, NAN, 2, 1.5, 1 }, c[5] = { 2, 2, 2, 2, 2 };
    ChartLine lines[2] = { { "loss", x, y, 5, 0, 0, false }, { "flat", x, c, 5, 1, 1, true } };
    LineChart lc = { "t", "step", "y", lines, 2, false };
    char base[256], err[512];
    snprintf(base, sizeof base, "%s/lines", tmpl);
    cr_assert_eq(chart_lines_write(&lc, base, err, sizeof err), 0, "%s", err);
    double v[2 * 3 * 5];
    for (size_t i = 0; i < 30; i++) v[i] = i == 7 ? NAN : (double)i / 30;
    const char *labels[2] = { "layer 0", "layer 1" };
    Heatmap h = { "h", "step", "expert", "share", 2, 3, 5, labels, x, v, 1.0 };
    snprintf(base, sizeof base, "%s/heat", tmpl);
    cr_assert_eq(chart_heatmap_write(&h, base, err, sizeof err), 0, "%s", err);
    char p[300];
    snprintf(p, sizeof p, "%s/lines.png", tmpl);
    assert_starts(p, "\x89PNG\r\n\x1a\n", 8);
    snprintf(p, sizeof p, "%s/heat.png", tmpl);
    assert_starts(p, "\x89PNG\r\n\x1a\n", 8);
    snprintf(p, sizeof p, "%s/heat.svg", tmpl);
    assert_starts(p, "<?xml", 5);
    /* a directory that does not exist: one line naming the file */
    snprintf(base, sizeof base, "%s/no/such/dir/x", tmpl);
    cr_assert_eq(chart_lines_write(&lc, base, err, sizeof err), -1);
    cr_assert(strstr(err, "no/such/dir/x.png"), "%s", err);
    chart_release();
    char *cmd = td_sprintf("rm -rf '%s'", tmpl);
    cr_assert_eq(system(cmd), 0);
    td_free(cmd);
}

Test(chart, colormap_ends)
{
    unsigned char a[3], b[3], n[3];
    chart_colormap(0, a);
    chart_colormap(1, b);
    chart_colormap(NAN, n);
    cr_assert(a[0] == 68 && a[1] == 1 && a[2] == 84, "viridis starts at #440154");
    cr_assert(b[0] == 253 && b[1] == 231 && b[2] == 37, "and ends at #fde725");
    cr_assert(!memcmp(a, n, 3), "NAN maps to the start");
    chart_color(10, a);
    chart_color(0, b);
    cr_assert(!memcmp(a, b, 3), "the palette wraps at 10");
}
