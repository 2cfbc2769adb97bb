/* bench/ckpt_bench.c - checkpoint save and load bandwidth next to dd on the
 * same disk (bench/ckpt.sh runs it; `make bench`).
 *
 *   ckpt_bench DIR [--gib G] [--reps R]
 *
 * Builds a single-process MoE model of at least G GiB of float32 weights
 * (default 1) and, R times (default 3), interleaved so that both see the
 * same disk and the same machine load:
 *   dd write   dd if=/dev/zero of=DIR/dd.bin bs=8M count=N conv=fsync
 *   save       ckpt_save to DIR/bench.h5: temporary name, Fletcher32
 *              chunks, fsync, rename (the whole durable path)
 *              (each write starts with its previous file removed and a
 *              sync, outside the timing)
 *   dd read    DIR/dd.bin dropped from the page cache (iflag=nocache
 *              count=0), then dd if=DIR/dd.bin of=/dev/null bs=8M
 *   load       bench.h5 dropped from the page cache (posix_fadvise), then
 *              ckpt_load into a model (every byte checksummed), checked bit
 *              for bit against the saved weights
 * with N * 8 MiB >= the checkpoint's size.  Each side keeps its best run
 * (shared disks and virtual machines are noisy).  A first save and a first
 * load into never-touched model memory come before the loop and are
 * reported apart: on virtual machines that back guest memory lazily, that
 * first touch costs more than the disk.  The last line is for the script:
 *   ckpt_bench bytes=B save_gbs=X dd_write_gbs=Y load_gbs=Z dd_read_gbs=W
 * GB = 1e9 bytes.
 */
#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/pool.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Runs a shell command ending in dd and returns the seconds dd reports
 * ("... copied, S s, ..."), or -1. */
static double run_dd(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    double s = -1;
    while (fgets(line, sizeof line, p)) {
        char *c = strstr(line, "copied, ");
        if (c) s = atof(c + 8);
    }
    pclose(p);
    return s > 0 ? s : -1;
}

static double gbs(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ckpt_bench DIR [--gib G] [--reps R]\n");
        return 2;
    }
    if (comm_init(&argc, &argv)) return 1;
    const char *dir = argv[1];
    double gib = 1.0;
    int reps = 3;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gib")) gib = atof(argv[i + 1]);
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1;
    }
    pool_init(getenv("TANDEM_THREADS") ? atoi(getenv("TANDEM_THREADS")) : pool_cores());

    /* d = 1024, 8 experts of width 2048 (53 M parameters per layer), a
     * 32k vocabulary (67 M in embedding and head): layers are added until
     * the weights reach gib GiB. */
    ModelConfig cfg;
    char err[512];
    for (int L = 1;; L++) {
        char js[512];
        snprintf(js, sizeof js,
                 "{\"vocab_size\":32768,\"hidden_size\":1024,\"num_hidden_layers\":%d,\"num_attention_heads\":16,"
                 "\"num_key_value_heads\":8,\"moe_intermediate_size\":2048,\"num_local_experts\":8,"
                 "\"num_experts_per_tok\":2,\"max_position_embeddings\":256}", L);
        if (config_parse(&cfg, js, err, sizeof err)) {
            td_error("%s", err);
            return 1;
        }
        if ((double)config_param_count(&cfg) * sizeof(float) >= gib * 1073741824.0) break;
    }
    Topology t;
    topo_single(&t, &cfg);
    Model m, m2;
    model_init(&m, &cfg, &t, false, 16);
    model_init_weights(&m, 7);
    model_init(&m2, &cfg, &t, false, 16);
    printf("model: %d layers, %.1f M parameters, %.3f GiB of float32 weights; %d threads\n", cfg.num_hidden_layers,
           (double)config_param_count(&cfg) / 1e6, (double)config_param_count(&cfg) * 4 / 1073741824.0,
           pool_threads());

    char path[1024], dd[1024], cmd[3300];
    snprintf(path, sizeof path, "%s/bench.h5", dir);
    snprintf(dd, sizeof dd, "%s/dd.bin", dir);
    unlink(path);

    /* first touch: a save into fresh page cache, a load into fresh memory */
    double t0 = td_now();
    if (ckpt_save(path, &m, NULL, NULL, NULL, CKPT_F32)) return 1;
    double first_save = td_now() - t0;
    struct stat sb;
    stat(path, &sb);
    double bytes = (double)sb.st_size;
    drop_cache(path);
    t0 = td_now();
    if (ckpt_load(path, &m2, NULL, NULL, NULL, err, sizeof err)) {
        td_error("%s", err);
        return 1;
    }
    double first_load = td_now() - t0;
    printf("first save: %.3f s = %.3f GB/s; first load into fresh model memory: %.3f s = %.3f GB/s\n", first_save,
           gbs(bytes, first_save), first_load, gbs(bytes, first_load));
    long count = (long)((sb.st_size + (8 << 20) - 1) / (8 << 20));

    double best[4] = { 1e30, 1e30, 1e30, 1e30 };   /* save, dd write, load, dd read (seconds) */
    for (int rep = 0; rep < reps; rep++) {
        /* both start from a clean page cache and no file to replace */
        snprintf(cmd, sizeof cmd, "rm -f '%s' && sync && dd if=/dev/zero of='%s' bs=8M count=%ld conv=fsync 2>&1", dd,
                 dd, count);
        double ddw = run_dd(cmd);
        unlink(path);   /* as dd's rm: freeing the old file's blocks is not the save's */
        sync();
        t0 = td_now();
        if (ckpt_save(path, &m, NULL, NULL, NULL, CKPT_F32)) return 1;
        double s = td_now() - t0;
        snprintf(cmd, sizeof cmd, "dd if='%s' iflag=nocache count=0 2>/dev/null; dd if='%s' of=/dev/null bs=8M 2>&1",
                 dd, dd);
        double ddr = run_dd(cmd);
        unlink(dd);
        drop_cache(path);
        t0 = td_now();
        if (ckpt_load(path, &m2, NULL, NULL, NULL, err, sizeof err)) {
            td_error("%s", err);
            return 1;
        }
        double l = td_now() - t0;
        printf("run %d: dd write %.3f s, save %.3f s | dd read %.3f s, load %.3f s\n", rep + 1, ddw, s, ddr, l);
        double v[4] = { s, ddw, l, ddr };
        for (int k = 0; k < 4; k++)
            if (v[k] > 0 && v[k] < best[k]) best[k] = v[k];
    }
    if (memcmp(m.w, m2.w, m.n_w * sizeof(float))) {
        td_error("bench: the loaded weights differ from the saved ones");
        return 1;
    }
    printf("ckpt_bench bytes=%.0f save_gbs=%.4f dd_write_gbs=%.4f load_gbs=%.4f dd_read_gbs=%.4f\n", bytes,
           gbs(bytes, best[0]), gbs((double)count * (8 << 20), best[1]), gbs(bytes, best[2]),
           gbs((double)count * (8 << 20), best[3]));
    if (!getenv("CKPT_BENCH_KEEP")) unlink(path);
    model_free(&m);
    model_free(&m2);
    pool_free();
    comm_finalize();
    return 0;
}
