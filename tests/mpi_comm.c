/* tests/mpi_comm.c - comm/ collectives in chunks (comm/comm.h) under
 * mpirun: every call that cuts large counts into MPI calls of at most the
 * chunk limit gives, with the limit forced down to a few elements, exactly
 * what it gives in one call, and what the collective means.
 *
 *   mpirun -np 2|3 build/tests/mpi_comm
 *
 * Values are small integers, so every sum is exact whatever the order MPI
 * adds in: results are compared bit for bit with the expected values
 * computed here.  The limits 7 and 1 (prime, and the smallest) make pieces
 * of uneven length and one piece per element.  Exit 0 only when every rank
 * passed; a failure names the call, the limit and the first wrong element.
 */
#include "comm/comm.h"
#include "core/common.h"

#include <stdio.h>
#include <string.h>

static int g_fail;

#define EXPECT(cond, ...)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "mpi_comm: rank %d: ", comm_rank());           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            g_fail = 1;                                                    \
        }                                                                  \
    } while (0)

/* The value element i of rank r contributes. */
static double val(int r, size_t i) { return (double)((r * 131 + (int)(i % 97) * 7) % 50) - 20; }

static void check_f64(const char *what, size_t lim, const double *got, const double *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i])) {
            EXPECT(0, "%s, chunk limit %zu: element %zu is %g, want %g", what, lim, i, got[i], want[i]);
            return;
        }
}

static void check_f32(const char *what, size_t lim, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i])) {
            EXPECT(0, "%s, chunk limit %zu: element %zu is %g, want %g", what, lim, i, got[i], want[i]);
            return;
        }
}

static void run(size_t lim)
{
    comm_set_chunk_limit(lim);
    const int np = comm_size(), me = comm_rank();
    const size_t n = 100;

    /* all-reduces: sum, max of f64, min of i32, sum of f32 */
    double d[n], dw[n], mx[n], mxw[n];
    int32_t mi[n], miw[n];
    float f[n], fw[n];
    for (size_t i = 0; i < n; i++) {
        d[i] = val(me, i);
        mx[i] = val(me, i);
        mi[i] = (int32_t)val(me, i + 3);
        f[i] = (float)val(me, i + 5);
        dw[i] = 0;
        mxw[i] = -1e300;
        miw[i] = INT32_MAX;
        fw[i] = 0;
        for (int r = 0; r < np; r++) {
            dw[i] += val(r, i);
            mxw[i] = val(r, i) > mxw[i] ? val(r, i) : mxw[i];
            miw[i] = (int32_t)val(r, i + 3) < miw[i] ? (int32_t)val(r, i + 3) : miw[i];
            fw[i] += (float)val(r, i + 5);
        }
    }
    comm_allreduce_f64(COMM_WORLD, d, n);
    check_f64("allreduce_f64", lim, d, dw, n);
    comm_allreduce_max_f64(COMM_WORLD, mx, n);
    check_f64("allreduce_max_f64", lim, mx, mxw, n);
    comm_allreduce_min_i32(COMM_WORLD, mi, n);
    EXPECT(!memcmp(mi, miw, sizeof mi), "allreduce_min_i32, chunk limit %zu", lim);
    comm_allreduce_f32(COMM_WORLD, f, n);
    check_f32("allreduce_f32", lim, f, fw, n);
    for (size_t i = 0; i < n; i++) f[i] = (float)val(me, i + 5);
    comm_iallreduce_f32(COMM_WORLD, f, n);
    comm_wait_all();
    check_f32("iallreduce_f32", lim, f, fw, n);

    /* bcast from the last rank */
    unsigned char b[257];
    for (size_t i = 0; i < sizeof b; i++) b[i] = me == np - 1 ? (unsigned char)(i * 3 + 1) : 0;
    comm_bcast(COMM_WORLD, b, sizeof b, np - 1);
    for (size_t i = 0; i < sizeof b; i++)
        if (b[i] != (unsigned char)(i * 3 + 1)) {
            EXPECT(0, "bcast, chunk limit %zu: byte %zu", lim, i);
            break;
        }

    /* variable blocks: rank r owns counts[r] = 10 + 13 r elements (rank 1: none when np > 2) */
    size_t counts[16], tot = 0, off[16];
    for (int r = 0; r < np; r++) {
        counts[r] = (np > 2 && r == 1) ? 0 : 10 + 13 * (size_t)r;
        off[r] = tot;
        tot += counts[r];
    }
    float in[tot], full[tot], out[tot > 0 ? tot : 1], want[tot];
    for (size_t i = 0; i < tot; i++) {
        in[i] = (float)val(me, i);
        want[i] = 0;
        for (int r = 0; r < np; r++) want[i] += (float)val(r, i);
    }
    comm_reduce_scatter_v_f32(COMM_WORLD, out, in, counts);
    check_f32("reduce_scatter_v_f32", lim, out, want + off[me], counts[me]);
    for (size_t i = 0; i < tot; i++) full[i] = -1;
    for (size_t i = 0; i < counts[me]; i++) full[off[me] + i] = (float)val(me, 1000 + off[me] + i);
    comm_allgather_v_f32(COMM_WORLD, full, counts);
    for (int r = 0; r < np; r++)
        for (size_t i = 0; i < counts[r]; i++)
            if (full[off[r] + i] != (float)val(r, 1000 + off[r] + i)) {
                EXPECT(0, "allgather_v_f32, chunk limit %zu: block %d element %zu", lim, r, i);
                r = np;
                break;
            }

    /* alltoallv: me sends 5 + 3 me + 2 dst bytes to dst, each byte naming (me, dst, i) */
    size_t sc[16], sd[16], rc[16], rd[16], st = 0, rt = 0;
    for (int r = 0; r < np; r++) {
        sc[r] = 5 + 3 * (size_t)me + 2 * (size_t)r;
        rc[r] = 5 + 3 * (size_t)r + 2 * (size_t)me;
        sd[r] = st;
        rd[r] = rt;
        st += sc[r];
        rt += rc[r];
    }
    unsigned char snd[st], rcv[rt];
    for (int r = 0; r < np; r++)
        for (size_t i = 0; i < sc[r]; i++) snd[sd[r] + i] = (unsigned char)(me * 50 + r * 7 + (int)i);
    memset(rcv, 0xff, rt);
    comm_alltoallv(COMM_WORLD, snd, sc, sd, rcv, rc, rd);
    for (int r = 0; r < np; r++)
        for (size_t i = 0; i < rc[r]; i++)
            if (rcv[rd[r] + i] != (unsigned char)(r * 50 + me * 7 + (int)i)) {
                EXPECT(0, "alltoallv, chunk limit %zu: from rank %d byte %zu", lim, r, i);
                r = np;
                break;
            }

    /* sendrecv around a ring, lengths that differ by direction */
    int next = (me + 1) % np, prev = (me - 1 + np) % np;
    size_t sl = 40 + 11 * (size_t)me, rl = 40 + 11 * (size_t)prev;
    unsigned char ss[sl], rr[rl];
    for (size_t i = 0; i < sl; i++) ss[i] = (unsigned char)(me + 3 * i);
    memset(rr, 0, rl);
    comm_sendrecv(COMM_WORLD, ss, sl, next, rr, rl, prev, 3);
    for (size_t i = 0; i < rl; i++)
        if (rr[i] != (unsigned char)(prev + 3 * i)) {
            EXPECT(0, "sendrecv, chunk limit %zu: byte %zu from rank %d", lim, i, prev);
            break;
        }
    /* one direction only: rank 0 sends to the last rank */
    unsigned char one[23];
    for (size_t i = 0; i < sizeof one; i++) one[i] = me == 0 ? (unsigned char)(200 - i) : 0;
    if (me == 0) comm_sendrecv(COMM_WORLD, one, sizeof one, np - 1, NULL, 0, -1, 4);
    if (me == np - 1) comm_sendrecv(COMM_WORLD, NULL, 0, -1, one, sizeof one, 0, 4);
    if (me == np - 1)
        for (size_t i = 0; i < sizeof one; i++)
            if (one[i] != (unsigned char)(200 - i)) {
                EXPECT(0, "sendrecv one way, chunk limit %zu: byte %zu", lim, i);
                break;
            }
    comm_set_chunk_limit(0);
}

int main(int argc, char **argv)
{
    if (comm_init(&argc, &argv)) return 1;
    if (!comm_active() || comm_size() < 2 || comm_size() > 16) {
        fprintf(stderr, "mpi_comm: run under mpirun with 2 to 16 ranks\n");
        comm_finalize();
        return 1;
    }
    const size_t limits[] = { 0, 7, 1 };   /* 0: the default (one call each here) */
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) run(limits[i]);
    double bad = g_fail;
    comm_allreduce_max_f64(COMM_WORLD, &bad, 1);
    if (comm_rank() == 0)
        printf("%s mpi_comm: %d ranks, chunk limits default, 7 and 1: every collective as in one call\n",
               bad > 0 ? "FAIL" : "ok  ", comm_size());
    comm_finalize();
    return bad > 0 ? 1 : 0;
}
