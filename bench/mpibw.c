/* bench/mpibw.c - MPI broadcast and all-reduce bandwidth between the ranks
 * of this machine (mpirun -np 2 build/bench/mpibw), to set weight-sync and
 * gradient-reduction times against what the transport can do.  Prints one
 * JSON line from rank 0. */
#include "comm/comm.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (comm_init(&argc, &argv)) return 1;
    const size_t n = (size_t)16 << 20;   /* 64 MiB of floats */
    float *buf = td_malloc(n * sizeof(float));
    memset(buf, 0, n * sizeof(float));
    double best_b = 1e9, best_a = 1e9;
    for (int rep = 0; rep < 6; rep++) {
        comm_barrier(COMM_WORLD);
        double t0 = td_now();
        comm_bcast(COMM_WORLD, buf, n * sizeof(float), 0);
        comm_barrier(COMM_WORLD);
        double t1 = td_now();
        comm_allreduce_f32(COMM_WORLD, buf, n);
        comm_barrier(COMM_WORLD);
        double t2 = td_now();
        if (rep) {   /* the first pays for first-touch memory */
            best_b = t1 - t0 < best_b ? t1 - t0 : best_b;
            best_a = t2 - t1 < best_a ? t2 - t1 : best_a;
        }
    }
    if (comm_rank() == 0)
        printf("{\"ranks\":%d,\"bytes\":%zu,\"bcast_gb_s\":%.3f,\"allreduce_gb_s\":%.3f}\n", comm_size(),
               n * sizeof(float), n * 4.0 / best_b / 1e9, n * 4.0 / best_a / 1e9);
    td_free(buf);
    comm_finalize();
    return 0;
}
