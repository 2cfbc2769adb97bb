/* bench/sampler.c - time per token of the sampler (infer/sampler.h) at a
 * large vocabulary, next to the sort-based version it replaced
 * (tests/sampler_ref.h) on the same logits (bench/sampler.sh runs it;
 * `make bench`).
 *
 *   sampler [--vocab 152064] [--reps 30]
 *
 * Logits are N(0, 3^2) (a spread like a trained model's); settings:
 * temperature 1 over the whole vocabulary, a nucleus (T 0.8, top_p 0.9),
 * top_k 50, and greedy with 20 alternatives (logprobs=20).  Each figure is
 * the median of R picks after a warm-up, in microseconds per token of the
 * thread's own CPU time (CLOCK_THREAD_CPUTIME_ID: on a shared machine,
 * time other processes take from the core is not counted).  Both versions
 * are checked to pick the same token.  Prints a table and, last, one JSON
 * line starting with {"bench":"sampler".
 */
#include "core/common.h"
#include "core/rng.h"
#include "infer/sampler.h"
#include "tests/sampler_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median microseconds per pick; which = 0: new, 1: reference. */
static double time_pick(int which, const float *x, size_t V, const SamplingParams *sp, int n_top, int reps,
                        void *scratch, int32_t *id)
{
    double *t = td_malloc((size_t)reps * sizeof(double));
    for (int r = -2; r < reps; r++) {   /* two warm-up picks */
        Rng g;
        rng_seed(&g, 7);
        Sampled s;
        double t0 = cpu_now();
        if (which == 0) sampler_pick(&s, x, V, sp, &g, n_top, scratch);
        else ref_pick(&s, x, V, sp, &g, n_top);
        double dt = cpu_now() - t0;
        if (r >= 0) t[r] = dt * 1e6;
        *id = s.id;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_d);
    double med = t[reps / 2];
    td_free(t);
    return med;
}

int main(int argc, char **argv)
{
    size_t V = 152064;
    int reps = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) V = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (V < 1 || reps < 1) {
        fprintf(stderr, "usage: sampler [--vocab V] [--reps R]\n");
        return 2;
    }
    float *x = td_malloc(V * sizeof(float));
    for (size_t j = 0; j < V; j++) x[j] = (float)(3.0 * rng_normal_at(11, j));
    void *scratch = td_malloc(sampler_scratch_bytes(V));
    struct {
        const char *name;
        SamplingParams sp;
        int n_top;
    } cases[] = {
        { "T=1, whole vocabulary", { 1.0, 0, 1.0 }, 0 },
        { "nucleus T=0.8 top_p=0.9", { 0.8, 0, 0.9 }, 0 },
        { "top_k=50", { 1.0, 50, 1.0 }, 0 },
        { "greedy, logprobs=20", { 0, 0, 1.0 }, 20 },
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    double t_new[8], t_old[8];
    int rc = 0;
    printf("sampler, V = %zu, median of %d picks, one thread (us of CPU time per token)\n", V, reps);
    printf("%-28s %12s %12s %8s\n", "setting", "sort (before)", "select (now)", "speedup");
    for (int c = 0; c < nc; c++) {
        int32_t a, b;
        t_old[c] = time_pick(1, x, V, &cases[c].sp, cases[c].n_top, reps, scratch, &a);
        t_new[c] = time_pick(0, x, V, &cases[c].sp, cases[c].n_top, reps, scratch, &b);
        if (a != b) {
            fprintf(stderr, "sampler: %s: picked %d, the reference %d\n", cases[c].name, b, a);
            rc = 1;
        }
        printf("%-28s %12.1f %12.1f %7.1fx\n", cases[c].name, t_old[c], t_new[c], t_old[c] / t_new[c]);
    }
    printf("{\"bench\":\"sampler\",\"vocab\":%zu,\"reps\":%d,\"cases\":[", V, reps);
    for (int c = 0; c < nc; c++)
        printf("%s{\"setting\":\"%s\",\"sort_us\":%.1f,\"select_us\":%.1f}", c ? "," : "", cases[c].name, t_old[c],
               t_new[c]);
    printf("]}\n");
    td_free(scratch);
    td_free(x);
    return rc;
}
