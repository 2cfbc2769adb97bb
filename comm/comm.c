/* comm/comm.c - MPI groups and timed collectives (comm.h). */
#include "comm/comm.h"
#include "core/common.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    bool active;
    int rank, size;
    MPI_Comm g[COMM_N_GROUPS];
    int gsize[COMM_N_GROUPS], grank[COMM_N_GROUPS];
    CommStat st[COMM_N_GROUPS];
} C = { .size = 1 };

static const char *g_names[COMM_N_GROUPS] = { "world", "dp", "tp", "pp", "ep", "edp", "all", "sync", "cp" };
const char *comm_group_name(CommGroup g) { return g_names[g]; }

static void abort_hook(void) { if (C.active) MPI_Abort(MPI_COMM_WORLD, 1); }

void comm_abort(int code)
{
    fflush(stdout);
    fflush(stderr);
    if (C.active) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* MPI failures are environment failures of the whole job: one line, abort. */
static void check(int rc, const char *what, CommGroup g)
{
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    td_error("MPI %s on group %s failed: %s", what, g_names[g], msg);
    comm_abort(1);
}

static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
           getenv("PMI_SIZE");
}

int comm_init(int *argc, char ***argv)
{
    if (C.active || !launched_by_mpirun()) return 0;
    /* FUNNELED: tandem's own threads (the pool, the HTTP server, the
     * checkpoint writer) never call MPI, only the main thread does */
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        td_error("MPI_Init_thread failed");
        return -1;
    }
    if (provided < MPI_THREAD_FUNNELED) {
        td_error("MPI provides thread support level %d (MPI_THREAD_SINGLE); tandem runs threads beside the MPI "
                 "calls of its main thread and needs MPI_THREAD_FUNNELED (%d)",
                 provided, MPI_THREAD_FUNNELED);
        MPI_Finalize();
        return -1;
    }
    C.active = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &C.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &C.size);
    for (int g = 0; g < COMM_N_GROUPS; g++) {
        bool whole = g == COMM_WORLD || g == COMM_ALL;
        C.g[g] = MPI_COMM_WORLD;
        C.gsize[g] = whole ? C.size : 1;
        C.grank[g] = whole ? C.rank : 0;
    }
    if (C.size > 1) td_log_rank = C.rank;
    td_abort_hook = abort_hook;
    return 0;
}

void comm_finalize(void)
{
    if (!C.active) return;
    for (int g = 0; g < COMM_N_GROUPS; g++)
        if (C.g[g] != MPI_COMM_WORLD && C.g[g] != MPI_COMM_NULL) MPI_Comm_free(&C.g[g]);
    MPI_Finalize();
    C.active = false;
}

bool comm_active(void) { return C.active; }
int comm_rank(void) { return C.rank; }
int comm_size(void) { return C.size; }
int comm_group_size(CommGroup g) { return C.active ? C.gsize[g] : 1; }
int comm_group_rank(CommGroup g) { return C.active ? C.grank[g] : 0; }
void *comm_mpi_handle(CommGroup g) { return C.active ? (void *)&C.g[g] : NULL; }

/* Splits the job (COMM_WORLD) into group g; color MPI_UNDEFINED leaves
 * this rank alone in g (size 1). */
static void split_from(MPI_Comm base, CommGroup g, int color, int key)
{
    MPI_Comm old = C.g[g];
    check(MPI_Comm_split(base, color, key, &C.g[g]), "Comm_split", g);
    if (old != MPI_COMM_WORLD && old != MPI_COMM_NULL && old != base) MPI_Comm_free(&old);
    if (C.g[g] == MPI_COMM_NULL) {
        C.gsize[g] = 1;
        C.grank[g] = 0;
        return;
    }
    MPI_Comm_set_errhandler(C.g[g], MPI_ERRORS_RETURN);
    MPI_Comm_size(C.g[g], &C.gsize[g]);
    MPI_Comm_rank(C.g[g], &C.grank[g]);
}

static void split(CommGroup g, int color, int key) { split_from(C.g[COMM_WORLD], g, color, key); }

int comm_split_world(int color)
{
    if (!C.active) return 0;
    MPI_Comm job;
    int all_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &all_rank);
    check(MPI_Comm_split(MPI_COMM_WORLD, color, all_rank, &job), "Comm_split", COMM_WORLD);
    MPI_Comm_set_errhandler(job, MPI_ERRORS_RETURN);
    if (C.g[COMM_WORLD] != MPI_COMM_WORLD) MPI_Comm_free(&C.g[COMM_WORLD]);
    C.g[COMM_WORLD] = job;
    MPI_Comm_size(job, &C.gsize[COMM_WORLD]);
    MPI_Comm_rank(job, &C.grank[COMM_WORLD]);
    C.rank = C.grank[COMM_WORLD];
    C.size = C.gsize[COMM_WORLD];
    return 0;
}

int comm_sync_group(bool member)
{
    if (!C.active) return 0;
    int all_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &all_rank);
    split_from(MPI_COMM_WORLD, COMM_SYNC, member ? 1 : MPI_UNDEFINED, all_rank);
    return 0;
}

int comm_setup(const Topology *t)
{
    if (t->world != C.size) {
        td_error("topology: dp*tp*pp*cp = %d*%d*%d*%d = %d ranks, but the job has %d", t->dp, t->tp,
                 t->pp, t->cp, t->world, C.size);
        return -1;
    }
    if (!C.active) return 0;
    /* rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank; dp
     * and edp span the cp ranks (comm.h) */
    const int cp = t->cp, dpc = t->dp_rank * cp + t->cp_rank;
    split(COMM_DP, t->pp_rank * t->tp + t->tp_rank, dpc);
    split(COMM_TP, (t->pp_rank * t->dp + t->dp_rank) * cp + t->cp_rank, t->tp_rank);
    split(COMM_PP, dpc * t->tp + t->tp_rank, t->pp_rank);
    split(COMM_CP, (t->pp_rank * t->dp + t->dp_rank) * t->tp + t->tp_rank, t->cp_rank);
    int egroup = t->dp_rank / t->ep;
    split(COMM_EP, ((t->pp_rank * cp + t->cp_rank) * t->tp + t->tp_rank) * (t->dp / t->ep) + egroup, t->ep_rank);
    split(COMM_EDP, (t->pp_rank * t->tp + t->tp_rank) * t->ep + t->ep_rank, egroup * cp + t->cp_rank);
    return 0;
}

/* ---------------------------------------------------------------- timing */

#define TIMED(g, nbytes, what, call)                                        \
    do {                                                                    \
        double t0_ = td_now();                                              \
        check((call), what, g);                                             \
        C.st[g].seconds += td_now() - t0_;                                  \
        C.st[g].bytes += (double)(nbytes);                                  \
        C.st[g].calls++;                                                    \
    } while (0)

static bool trivial(CommGroup g) { return !C.active || C.gsize[g] <= 1 || C.g[g] == MPI_COMM_NULL; }

void comm_barrier(CommGroup g)
{
    if (trivial(g)) return;
    TIMED(g, 0, "Barrier", MPI_Barrier(C.g[g]));
}

/* MPI counts and displacements are int.  Calls that stream a buffer go in
 * pieces of at most g_chunk elements (bytes for the byte calls); the
 * variable-block calls make one MPI call while every count and
 * displacement is at most g_one_call (INT_MAX), and go block by block
 * beyond.  comm_set_chunk_limit lowers both so that tests run every cut
 * path on small buffers. */
#define CHUNK_DEFAULT ((size_t)1 << 28)
static size_t g_chunk = CHUNK_DEFAULT, g_one_call = INT_MAX;

void comm_set_chunk_limit(size_t n)
{
    g_chunk = n ? td_min(n, CHUNK_DEFAULT) : CHUNK_DEFAULT;
    g_one_call = n ? td_min(n, (size_t)INT_MAX) : (size_t)INT_MAX;
}

void comm_allreduce_f32(CommGroup g, float *buf, size_t n)
{
    if (trivial(g)) return;
    for (size_t o = 0; o < n; o += g_chunk) {
        int c = (int)td_min(g_chunk, n - o);
        TIMED(g, (size_t)c * 4, "Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + o, c, MPI_FLOAT, MPI_SUM, C.g[g]));
    }
}

void comm_allreduce_f64(CommGroup g, double *buf, size_t n)
{
    if (trivial(g)) return;
    for (size_t o = 0; o < n; o += g_chunk) {
        int c = (int)td_min(g_chunk, n - o);
        TIMED(g, (size_t)c * 8, "Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + o, c, MPI_DOUBLE, MPI_SUM, C.g[g]));
    }
}

void comm_allreduce_max_f64(CommGroup g, double *buf, size_t n)
{
    if (trivial(g)) return;
    for (size_t o = 0; o < n; o += g_chunk) {
        int c = (int)td_min(g_chunk, n - o);
        TIMED(g, (size_t)c * 8, "Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + o, c, MPI_DOUBLE, MPI_MAX, C.g[g]));
    }
}

void comm_allreduce_min_i32(CommGroup g, int32_t *buf, size_t n)
{
    if (trivial(g)) return;
    for (size_t o = 0; o < n; o += g_chunk) {
        int c = (int)td_min(g_chunk, n - o);
        TIMED(g, (size_t)c * 4, "Allreduce", MPI_Allreduce(MPI_IN_PLACE, buf + o, c, MPI_INT32_T, MPI_MIN, C.g[g]));
    }
}

void comm_bcast(CommGroup g, void *buf, size_t bytes, int root)
{
    if (trivial(g)) return;
    for (size_t o = 0; o < bytes; o += g_chunk) {
        int c = (int)td_min(g_chunk, bytes - o);
        TIMED(g, C.grank[g] == root ? (size_t)c : 0, "Bcast",
              MPI_Bcast((char *)buf + o, c, MPI_BYTE, root, C.g[g]));
    }
}

/* Counts (and, with displs, the displacements and their end) all within
 * one MPI call's int? */
static bool fits_one_call(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int i = 0; i < n; i++) {
        if (counts[i] > g_one_call || (displs && displs[i] > g_one_call)) return false;
        end = td_max(end, (displs ? displs[i] : end) + counts[i]);
    }
    return end <= g_one_call;
}

void comm_reduce_scatter_v_f32(CommGroup g, float *out, const float *in, const size_t *counts)
{
    int n = comm_group_size(g);
    if (trivial(g)) {
        if (out != in) memmove(out, in, counts[0] * sizeof(float));
        return;
    }
    size_t tot = 0;
    for (int i = 0; i < n; i++) tot += counts[i];
    if (fits_one_call(counts, NULL, n)) {
        int c[n];
        for (int i = 0; i < n; i++) c[i] = (int)counts[i];
        /* what a rank sends in a ring: every block but its own, once */
        TIMED(g, (tot - counts[C.grank[g]]) * 4, "Reduce_scatter",
              MPI_Reduce_scatter(in, out, c, MPI_FLOAT, MPI_SUM, C.g[g]));
        return;
    }
    /* beyond an int: each block summed onto its owner, in chunks */
    size_t at = 0;
    for (int r = 0; r < n; r++) {
        for (size_t o = 0; o < counts[r]; o += g_chunk) {
            int c = (int)td_min(g_chunk, counts[r] - o);
            bool mine = r == C.grank[g];
            TIMED(g, (size_t)c * 4, "Reduce",
                  MPI_Reduce(in + at + o, mine ? out + o : NULL, c, MPI_FLOAT, MPI_SUM, r, C.g[g]));
        }
        at += counts[r];
    }
}

void comm_allgather_v_f32(CommGroup g, float *buf, const size_t *counts)
{
    int n = comm_group_size(g);
    if (trivial(g)) return;
    if (fits_one_call(counts, NULL, n)) {
        int c[n], dsp[n];
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            c[i] = (int)counts[i];
            dsp[i] = (int)o;
            o += counts[i];
        }
        TIMED(g, counts[C.grank[g]] * 4 * (size_t)(n - 1), "Allgatherv",
              MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c, dsp, MPI_FLOAT, C.g[g]));
        return;
    }
    /* beyond an int: each block broadcast from its owner, in chunks */
    size_t at = 0;
    for (int r = 0; r < n; r++) {
        for (size_t o = 0; o < counts[r]; o += g_chunk) {
            int c = (int)td_min(g_chunk, counts[r] - o);
            TIMED(g, r == C.grank[g] ? (size_t)c * 4 * (size_t)(n - 1) : 0, "Bcast",
                  MPI_Bcast(buf + at + o, c, MPI_FLOAT, r, C.g[g]));
        }
        at += counts[r];
    }
}

void comm_alltoallv(CommGroup g, const void *send, const size_t *sc, const size_t *sd,
                    void *recv, const size_t *rc, const size_t *rd)
{
    int n = comm_group_size(g);
    if (trivial(g)) {
        memmove((char *)recv + rd[0], (const char *)send + sd[0], sc[0]);
        return;
    }
    const int me = C.grank[g];
    if (fits_one_call(sc, sd, n) && fits_one_call(rc, rd, n)) {
        int isc[n], isd[n], irc[n], ird[n];
        size_t sent = 0;
        for (int i = 0; i < n; i++) {
            isc[i] = (int)sc[i]; isd[i] = (int)sd[i]; irc[i] = (int)rc[i]; ird[i] = (int)rd[i];
            if (i != me) sent += sc[i];
        }
        TIMED(g, sent, "Alltoallv",
              MPI_Alltoallv(send, isc, isd, MPI_BYTE, recv, irc, ird, MPI_BYTE, C.g[g]));
        return;
    }
    /* beyond an int: pairwise exchanges, step s sends to me + s and
     * receives from me - s (both sides of a pair meet at the same step) */
    memmove((char *)recv + rd[me], (const char *)send + sd[me], sc[me]);
    for (int s = 1; s < n; s++) {
        int dst = (me + s) % n, src = (me - s + n) % n;
        comm_sendrecv(g, (const char *)send + sd[dst], sc[dst], dst, (char *)recv + rd[src], rc[src], src, 0x7a11);
    }
}

#define MAX_PENDING 4096
static struct {
    MPI_Request req[MAX_PENDING];
    CommGroup group[MAX_PENDING];
    int n;
} P;

void comm_iallreduce_f32(CommGroup g, float *buf, size_t n)
{
    if (trivial(g) || n == 0) return;
    for (size_t o = 0; o < n; o += g_chunk) {
        if (P.n == MAX_PENDING) comm_wait_all();
        int c = (int)td_min(g_chunk, n - o);
        double t0 = td_now();
        check(MPI_Iallreduce(MPI_IN_PLACE, buf + o, c, MPI_FLOAT, MPI_SUM, C.g[g], &P.req[P.n]),
              "Iallreduce", g);
        C.st[g].seconds += td_now() - t0;
        C.st[g].bytes += (double)c * 4;
        C.st[g].calls++;
        P.group[P.n++] = g;
    }
}

void comm_poll(void)
{
    if (!P.n) return;
    int flag;
    MPI_Testall(P.n, P.req, &flag, MPI_STATUSES_IGNORE);
    if (flag) P.n = 0;
}

void comm_wait_all(void)
{
    if (!P.n) return;
    double t0 = td_now();
    check(MPI_Waitall(P.n, P.req, MPI_STATUSES_IGNORE), "Waitall", P.group[0]);
    double dt = td_now() - t0;
    /* charge the wait to the groups in flight, evenly */
    for (int i = 0; i < P.n; i++) C.st[P.group[i]].seconds += dt / P.n;
    P.n = 0;
}

void comm_sendrecv(CommGroup g, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes,
                   int src, int tag)
{
    if (dst < 0 && src < 0) return;
    TD_CHECK(C.active, "comm_sendrecv without MPI");
    if (dst < 0) sbytes = 0;
    if (src < 0) rbytes = 0;
    /* piece k of each direction goes in call k; a direction with fewer
     * pieces sends or receives nothing (MPI_PROC_NULL) in the calls after
     * its last.  Messages between two ranks are matched in order, so the
     * peer, whose own calls cut the same bytes the same way, reads piece k
     * as piece k. */
    size_t ns = (sbytes + g_chunk - 1) / g_chunk, nr = (rbytes + g_chunk - 1) / g_chunk;
    size_t calls = td_max(ns, nr);
    for (size_t k = 0; k < calls; k++) {
        size_t o = k * g_chunk;
        int cs = k < ns ? (int)td_min(g_chunk, sbytes - o) : 0, cr = k < nr ? (int)td_min(g_chunk, rbytes - o) : 0;
        const void *sp = cs ? (const char *)sbuf + o : sbuf;
        void *rp = cr ? (char *)rbuf + o : rbuf;
        TIMED(g, (size_t)cs, "Sendrecv",
              MPI_Sendrecv(sp, cs, MPI_BYTE, k < ns ? dst : MPI_PROC_NULL, tag, rp, cr, MPI_BYTE,
                           k < nr ? src : MPI_PROC_NULL, tag, C.g[g], MPI_STATUS_IGNORE));
    }
}

void comm_stats(CommGroup g, CommStat *out) { *out = C.st[g]; }
void comm_stats_reset(void) { memset(C.st, 0, sizeof C.st); }
