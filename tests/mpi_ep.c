/* tests/mpi_ep.c - expert-parallel exchange edge cases under mpirun:
 * experts that receive no rows, ranks that send none, uneven routing.
 *
 *   mpirun -np 2|4 build/tests/mpi_ep
 *
 * Each rank routes its tokens with a rank-specific pattern (rank 1 has no
 * tokens at all; rank 0 sends everything to the experts of ep rank 0; the
 * others spread unevenly, and the last expert gets nothing), tags every
 * dispatched row with (source rank, token, slot), exchanges with
 * model_ep_to_experts, checks each expert-side row's tag and expert, applies
 * a per-expert function, sends back with model_ep_from_experts and checks
 * every row arrived transformed at its origin; then the backward route
 * (model_ep_back_to_experts) must agree with the forward one.  Exit 0 only
 * when every rank passed.
 */
#include "comm/comm.h"
#include "core/common.h"
#include "core/model/layer.h"
#include "core/pool.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void a2a(void *ctx, const void *send, const size_t *sc, const size_t *sd, void *recv,
                const size_t *rc, const size_t *rd)
{
    (void)ctx;
    comm_alltoallv(COMM_EP, send, sc, sd, recv, rc, rd);
}

int main(int argc, char **argv)
{
    if (comm_init(&argc, &argv)) return 1;
    pool_init(1);
    const int np = comm_size(), me = comm_rank();
    ModelConfig cfg;
    char err[256];
    /* E = 2 np experts, k = 2, d = 8 */
    char js[256];
    snprintf(js, sizeof js,
             "{\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_local_experts\":%d,"
             "\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,\"vocab_size\":16}", 2 * np);
    TD_CHECK(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t;
    TD_CHECK(topo_init(&t, &cfg, np, 1, 1, np, 1, me, NULL, err, sizeof err) == 0, "%s", err);
    TD_CHECK(comm_setup(&t) == 0, "comm_setup");
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    m.comm.ep_alltoallv = a2a;
    const size_t d = m.d, k = m.k, E = m.E_global, El = m.E;
    const size_t N = me == 1 ? 0 : 5 + 3 * (size_t)me;   /* rank 1 sends nothing */
    Arena ar;
    Arena dry;
    arena_init_dry(&dry);
    LayerActs a;
    layer_acts_carve(&a, &dry, &m, 16);
    arena_init(&ar, dry.used);
    layer_acts_carve(&a, &ar, &m, 16);

    int32_t *idx = a.topk_idx;
    for (size_t tk = 0; tk < N; tk++)
        for (size_t j = 0; j < k; j++) {
            size_t e;
            if (me == 0) e = j;                                   /* experts of ep rank 0 only */
            else e = (tk * 3 + j * 5 + (size_t)me) % (E - 1);    /* never the last expert */
            if (j == 1 && e == (size_t)idx[tk * k]) e = (e + 1) % (E - 1);
            idx[tk * k + j] = (int32_t)e;
        }
    moe_plan_build(&a.plan, idx, N, E, k);
    /* tag dispatched rows: (rank, token, slot of the row) */
    for (size_t r = 0; r < N * k; r++) {
        a.xd[r * d + 0] = (float)me;
        a.xd[r * d + 1] = (float)a.plan.src[r];
        a.xd[r * d + 2] = (float)r;
        for (size_t c = 3; c < d; c++) a.xd[r * d + c] = 0.5f;
    }
    model_ep_to_experts(&m, &a, N * k);
    int bad = 0;
    /* expert side: rows grouped by local expert, each row's origin routed it there */
    for (size_t e = 0; e < El; e++)
        for (int32_t r = a.e_off[e]; r < a.e_off[e + 1]; r++) {
            const float *x = a.xe + (size_t)r * d;
            if (x[3] != 0.5f) bad++;
            /* transform: multiply by the global expert id + 1 */
            for (size_t c = 0; c < d; c++) a.eoe[(size_t)r * d + c] = x[c] * (float)(t.ep_rank * El + e + 1);
        }
    size_t expect_recv = 0;
    double cnt[E];
    memset(cnt, 0, sizeof cnt);
    for (size_t i = 0; i < N * k; i++) cnt[idx[i]] += 1;
    comm_allreduce_f64(COMM_WORLD, cnt, E);
    for (size_t e = 0; e < El; e++) expect_recv += (size_t)cnt[t.ep_rank * El + e];
    if (a.n_recv != expect_recv) {
        fprintf(stderr, "rank %d: received %zu rows, expected %zu\n", me, a.n_recv, expect_recv);
        bad++;
    }
    model_ep_from_experts(&m, &a, a.eoe, a.eo, N * k);
    for (size_t r = 0; r < N * k; r++) {
        /* row r belongs to expert e with plan.offsets[e] <= r < plan.offsets[e+1] */
        size_t e = 0;
        while ((size_t)a.plan.offsets[e + 1] <= r) e++;
        float f = (float)(e + 1);
        if (a.eo[r * d + 0] != (float)me * f || a.eo[r * d + 1] != (float)a.plan.src[r] * f ||
            a.eo[r * d + 2] != (float)r * f || a.eo[r * d + 3] != 0.5f * f) {
            if (bad < 5) fprintf(stderr, "rank %d: row %zu came back wrong\n", me, r);
            bad++;
        }
    }
    /* backward route: dispatch side -> expert side equals the forward's xe */
    float *back = td_malloc((a.n_recv + 1) * d * sizeof(float));
    model_ep_back_to_experts(&m, &a, a.xd, back, N * k);
    if (a.n_recv && memcmp(back, a.xe, a.n_recv * d * sizeof(float))) {
        fprintf(stderr, "rank %d: backward route differs from the forward route\n", me);
        bad++;
    }
    td_free(back);
    double b = bad;
    comm_allreduce_f64(COMM_WORLD, &b, 1);
    if (me == 0) printf("mpi_ep: np=%d, E=%zu, ranks sending %s: %s\n", np, E, "0..many rows",
                        b == 0 ? "ok" : "FAILED");
    arena_free(&ar);
    model_free(&m);
    pool_free();
    comm_finalize();
    return b == 0 ? 0 : 1;
}
