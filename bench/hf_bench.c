/* bench/hf_bench.c - Hugging Face import and direct-load bandwidth next to
 * dd reading the same bytes cold (bench/import.sh runs it; `make bench`).
 *
 *   hf_bench HF_DIR OUT.h5 [--reps R]
 *
 * R times (default 3), interleaved so that every side sees the same disk
 * and machine load, each starting from a cold page cache for the files it
 * reads (posix_fadvise DONTNEED per file: /proc/sys/vm/drop_caches needs a
 * root that may write it, which containers rarely have):
 *   dd read      dd if=<each safetensors file> of=/dev/null bs=16M
 *   dd copy      dd if=<each file> of=OUT.dd bs=16M conv=fsync (the same bytes
 *                read cold and written durably: what an import must do)
 *   direct load  ckpt_load(HF_DIR) into a fresh model (model_init outside the
 *                timing, but its weights never touched: their page faults
 *                and zeroing are timed, as in serve/score/train): validation,
 *                every rank-slice read through the mapping, bf16 upcast to
 *                float32; then once more into the same weights (cold files
 *                again), the load without the first touch
 *   import       hf_import(HF_DIR, OUT.h5): validation, reads, the HDF5 write
 *                with Fletcher32 chunks, fsync, rename
 * Each side keeps its best run.  The last line is for the script:
 *   hf_bench bytes=B dd_read_gbs=X dd_copy_gbs=Y load_gbs=Z import_gbs=W load_warm_gbs=V
 * GB = 1e9 bytes of safetensors data (the files' sizes).
 */
#include "checkpoint/ckpt.h"
#include "checkpoint/hf/hf_load.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES 256

static char g_files[MAX_FILES][1024];
static int g_n;

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* /proc/sys/vm/drop_caches when this process may write it (root outside a
 * container), else each file dropped with posix_fadvise (clean pages). */
static bool g_sysctl;

static void drop_all(void)
{
    for (int i = 0; i < g_n; i++) drop_cache(g_files[i]);
    if (!g_sysctl) return;
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f) {
        fputs("3\n", f);
        fclose(f);
    }
}

/* Seconds dd reports ("... copied, S s, ..."), summed over its lines; -1 on failure. */
static double run_dd(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    double s = 0;
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        char *c = strstr(line, "copied, ");
        if (c) {
            s += atof(c + 8);
            n++;
        }
    }
    pclose(p);
    return n ? s : -1;
}

static double gbs(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: hf_bench HF_DIR OUT.h5 [--reps R]\n");
        return 2;
    }
    if (comm_init(&argc, &argv)) return 1;
    const char *dir = argv[1], *out = argv[2];
    int reps = 3;
    for (int i = 3; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1;
    pool_init(getenv("TANDEM_THREADS") ? atoi(getenv("TANDEM_THREADS")) : pool_cores());
    DIR *d = opendir(dir);
    if (!d) {
        td_error("%s: cannot list", dir);
        return 1;
    }
    double bytes = 0;
    for (struct dirent *de; (de = readdir(d)) && g_n < MAX_FILES;) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        snprintf(g_files[g_n], sizeof g_files[g_n], "%s/%s", dir, de->d_name);
        struct stat sb;
        if (!stat(g_files[g_n], &sb)) bytes += (double)sb.st_size;
        g_n++;
    }
    closedir(d);
    char err[1024];
    ModelConfig cfg;
    if (ckpt_read_config(dir, &cfg, NULL, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    Topology t;
    topo_single(&t, &cfg);
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    FILE *dc = fopen("/proc/sys/vm/drop_caches", "w");
    g_sysctl = dc != NULL;
    if (dc) fclose(dc);
    printf("model: %s, %d safetensors files, %.1f MB; %.1f M parameters; %d threads\n", dir, g_n, bytes / 1e6,
           (double)config_param_count(&cfg) / 1e6, pool_threads());
    printf("cold reads: %s\n", g_sysctl ? "echo 3 > /proc/sys/vm/drop_caches (and posix_fadvise) before each run"
                                         : "/proc/sys/vm/drop_caches is not writable here (a container): each file is "
                                           "dropped from the page cache with posix_fadvise(DONTNEED) before each run");
    char ddout[1100], cmd[8192];
    snprintf(ddout, sizeof ddout, "%s.dd", out);
    double best[5] = { 1e30, 1e30, 1e30, 1e30, 1e30 };   /* dd read, dd copy, load, import, load again */
    for (int rep = 0; rep < reps; rep++) {
        drop_all();
        size_t k = 0;
        for (int i = 0; i < g_n; i++)
            k += (size_t)snprintf(cmd + k, sizeof cmd - k, "dd if='%s' of=/dev/null bs=16M 2>&1; ", g_files[i]);
        double ddr = run_dd(cmd);
        drop_all();
        k = 0;
        for (int i = 0; i < g_n; i++)
            k += (size_t)snprintf(cmd + k, sizeof cmd - k, "rm -f '%s'; dd if='%s' of='%s' bs=16M conv=fsync 2>&1; ",
                                  ddout, g_files[i], ddout);
        double ddc = run_dd(cmd);
        unlink(ddout);
        /* fresh weights, as serve/score/train have them: their first touch
         * (page faults, zeroing) is part of the load */
        model_free(&m);
        model_init(&m, &cfg, &t, false, 16);
        drop_all();
        double t0 = td_now();
        if (ckpt_load(dir, &m, NULL, NULL, NULL, err, sizeof err)) {
            td_error("%s", err);
            return 1;
        }
        double l = td_now() - t0;
        /* the same weights again: the load without the first touch */
        drop_all();
        t0 = td_now();
        if (ckpt_load(dir, &m, NULL, NULL, NULL, err, sizeof err)) {
            td_error("%s", err);
            return 1;
        }
        double lw = td_now() - t0;
        drop_all();
        unlink(out);
        sync();
        t0 = td_now();
        if (hf_import(dir, out, NULL, NULL, err, sizeof err)) {
            td_error("%s", err);
            return 1;
        }
        double im = td_now() - t0;
        drop_cache(out);
        printf("run %d: dd read %.3f s, direct load %.3f s (weights touched before: %.3f s) | dd copy %.3f s, import "
               "%.3f s\n", rep + 1, ddr, l, lw, ddc, im);
        double v[5] = { ddr, ddc, l, im, lw };
        for (int j = 0; j < 5; j++)
            if (v[j] > 0 && v[j] < best[j]) best[j] = v[j];
    }
    printf("hf_bench bytes=%.0f dd_read_gbs=%.4f dd_copy_gbs=%.4f load_gbs=%.4f import_gbs=%.4f load_warm_gbs=%.4f\n",
           bytes, gbs(bytes, best[0]), gbs(bytes, best[1]), gbs(bytes, best[2]), gbs(bytes, best[3]),
           gbs(bytes, best[4]));
    unlink(out);
    model_free(&m);
    pool_free();
    comm_finalize();
    return 0;
}
