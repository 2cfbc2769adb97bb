/* comm/comm.h - the only place tandem talks to MPI.
 *
 * Process groups come from the topology (core/model/topology.h) with
 * MPI_Comm_split: world, dp, tp, pp, ep (the expert-parallel group, carved
 * from dp) and edp (ranks that hold the same experts: same tp and pp rank,
 * same ep_rank, across expert groups; expert gradients are reduced there),
 * and cp (context parallelism, SPEC section 12: the ranks that share each
 * sequence; same pp, dp and tp rank).  With cp > 1 the dp group is the dp x
 * cp ranks of the same pp and tp rank (all hold the same weights and see
 * different tokens of the micro-batch: gradients, token counts and router
 * statistics are summed there), ordered dp_rank * cp + cp_rank; edp
 * likewise spans the cp ranks, and ep stays within one cp rank.
 * Every collective is timed and its bytes counted per group (comm_stats).
 *
 * MPI is initialised only when the process was started by mpirun (or
 * another PMI launcher); a plain `tandem ...` runs as a single process
 * without MPI, and every collective on a group of one is a no-op.
 * Communicators use MPI_ERRORS_RETURN: a failed call reports one line and
 * aborts the job (comm_fatal), so no rank hangs.
 *
 * Call collectives from the main thread only, in the same order on every
 * rank of the group; each function says which ranks call it.
 */
#ifndef TANDEM_COMM_COMM_H
#define TANDEM_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/topology.h"

/* COMM_WORLD is the job: every rank, unless comm_split_world divided them
 * (tandem rl with separate rollout ranks), then the ranks of this rank's
 * part.  COMM_ALL is always every rank.  COMM_SYNC is what
 * comm_sync_group made (trainer rank 0 and the rollout ranks). */
typedef enum {
    COMM_WORLD, COMM_DP, COMM_TP, COMM_PP, COMM_EP, COMM_EDP, COMM_ALL, COMM_SYNC, COMM_CP, COMM_N_GROUPS
} CommGroup;

typedef struct {
    double seconds;     /* wall time inside collectives of this group */
    double bytes;       /* payload bytes this rank sent */
    long calls;
} CommStat;

/* Initialise MPI when launched by mpirun; returns 0 or -1 (message printed). */
int comm_init(int *argc, char ***argv);
/* MPI_Finalize if initialised; safe twice. */
void comm_finalize(void);
/* Abort every rank (MPI_Abort) after printing msg; exits when not under MPI. */
void comm_abort(int code) __attribute__((noreturn));

bool comm_active(void);
int comm_rank(void);          /* rank in the job (COMM_WORLD), 0 without MPI */
int comm_size(void);          /* ranks in the job, 1 without MPI */

/* Divides the ranks into jobs by color (all ranks call, before
 * comm_setup): afterwards COMM_WORLD, comm_rank and comm_size refer to
 * this rank's job; COMM_ALL keeps everyone. */
int comm_split_world(int color);
/* Builds COMM_SYNC from the ranks passing member = true (all ranks of
 * COMM_ALL call), ordered by their COMM_ALL rank. */
int comm_sync_group(bool member);

/* Builds the groups of t (all ranks call).  t->world must equal comm_size(). */
int comm_setup(const Topology *t);
int comm_group_size(CommGroup g);
int comm_group_rank(CommGroup g);
/* The MPI_Comm of a group as an opaque pointer (for parallel HDF5); NULL
 * without MPI. */
void *comm_mpi_handle(CommGroup g);

/* Collectives (all ranks of the group call). */
void comm_barrier(CommGroup g);
void comm_allreduce_f32(CommGroup g, float *buf, size_t n);   /* sum, in place */
void comm_allreduce_f64(CommGroup g, double *buf, size_t n);  /* sum, in place */
void comm_allreduce_max_f64(CommGroup g, double *buf, size_t n);
void comm_allreduce_min_i32(CommGroup g, int32_t *buf, size_t n);
void comm_bcast(CommGroup g, void *buf, size_t bytes, int root);
/* Variable blocks (counts[r] elements for rank r, in rank order):
 * reduce_scatter_v sums `in` (sum counts) over the group and gives rank r
 * its block in out; allgather_v fills buf (sum counts) in place from every
 * rank's own block (at its displacement). */
void comm_reduce_scatter_v_f32(CommGroup g, float *out, const float *in, const size_t *counts);
void comm_allgather_v_f32(CommGroup g, float *buf, const size_t *counts);
/* Variable all-to-all of bytes: send_counts/recv_counts/displacements in
 * bytes, one per rank of the group. */
void comm_alltoallv(CommGroup g, const void *send, const size_t *send_counts, const size_t *send_displs,
                    void *recv, const size_t *recv_counts, const size_t *recv_displs);

/* Non-blocking in-place sum (MPI_Iallreduce) of buf over the group; the
 * request joins the pending set, completed by comm_wait_all.  comm_poll
 * lets MPI progress pending requests (call it between pieces of work).
 * buf must stay untouched until comm_wait_all returns.  Time counted is
 * the time spent waiting, not the time in flight. */
void comm_iallreduce_f32(CommGroup g, float *buf, size_t n);
void comm_poll(void);
void comm_wait_all(void);

/* Send `sbytes` to rank dst and receive `rbytes` from rank src of the group
 * at once (MPI_Sendrecv), so that two ranks exchanging in opposite
 * directions never wait on each other.  dst or src < 0: that half is
 * skipped. */
void comm_sendrecv(CommGroup g, const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes,
                   int src, int tag);

/* MPI counts are int: every call above whose count could pass INT_MAX is
 * cut into calls of at most 2^28 elements (bytes for the byte calls);
 * variable blocks (reduce_scatter_v, allgather_v, alltoallv) whose counts
 * or displacements pass INT_MAX go block by block (Reduce / Bcast onto or
 * from the owner, pairwise Sendrecv).  Tests lower both limits to n (0
 * restores them) to run those paths on small buffers. */
void comm_set_chunk_limit(size_t n);

/* Statistics since the last reset. */
void comm_stats(CommGroup g, CommStat *out);
void comm_stats_reset(void);
const char *comm_group_name(CommGroup g);

#endif
