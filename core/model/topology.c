/* core/model/topology.c - parallel layout arithmetic (topology.h). */
#include "core/model/topology.h"

#include <stdio.h>
#include <string.h>

void topo_single(Topology *t, const ModelConfig *cfg)
{
    char err[16];
    int rc = topo_init(t, cfg, 1, 1, 1, 1, 1, 0, NULL, err, sizeof err);
    (void)rc;
}

#define REQUIRE(cond, ...)                                     \
    do {                                                       \
        if (!(cond)) {                                         \
            snprintf(err, err_len, "topology: " __VA_ARGS__);  \
            return -1;                                         \
        }                                                      \
    } while (0)

int topo_init(Topology *t, const ModelConfig *c, int dp, int tp, int pp, int ep, int cp, int rank,
              const int *stages, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    REQUIRE(dp >= 1 && tp >= 1 && pp >= 1 && ep >= 1 && cp >= 1, "dp, tp, pp, ep and cp must be >= 1");
    REQUIRE(pp <= TOPO_MAX_PP, "pp=%d exceeds %d", pp, TOPO_MAX_PP);
    t->dp = dp; t->tp = tp; t->pp = pp; t->ep = ep; t->cp = cp;
    t->world = dp * tp * pp * cp;
    REQUIRE(rank >= 0 && rank < t->world, "rank %d outside world %d", rank, t->world);
    t->rank = rank;
    t->tp_rank = rank % tp;
    t->cp_rank = (rank / tp) % cp;
    t->dp_rank = (rank / (tp * cp)) % dp;
    t->pp_rank = rank / (tp * cp * dp);
    t->ep_rank = t->dp_rank % ep;

    const int L = c->num_hidden_layers, H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    REQUIRE(H % tp == 0, "tp=%d does not divide num_attention_heads=%d", tp, H);
    REQUIRE(Hkv % tp == 0, "tp=%d does not divide num_key_value_heads=%d", tp, Hkv);
    REQUIRE(dp % ep == 0, "ep=%d does not divide dp=%d (expert groups are carved from dp)", ep, dp);
    const int n_moe = config_n_moe_layers(c);
    if (n_moe < L)
        REQUIRE(c->intermediate_size % tp == 0, "tp=%d does not divide intermediate_size=%d",
                tp, c->intermediate_size);
    if (n_moe > 0) {
        REQUIRE(c->num_local_experts % ep == 0, "ep=%d does not divide num_local_experts=%d",
                ep, c->num_local_experts);
        REQUIRE(c->moe_intermediate_size % tp == 0, "tp=%d does not divide moe_intermediate_size=%d",
                tp, c->moe_intermediate_size);
        REQUIRE(config_shared_width(c) % tp == 0, "tp=%d does not divide the shared expert width %d",
                tp, config_shared_width(c));
    } else {
        REQUIRE(ep == 1, "ep=%d but the model has no MoE layers", ep);
    }
    REQUIRE(pp <= L, "pp=%d exceeds num_hidden_layers=%d", pp, L);
    t->stage_begin[0] = 0;
    for (int s = 0; s < pp; s++) {
        int n = stages ? stages[s] : L / pp + (s < L % pp ? 1 : 0);
        REQUIRE(n >= 1, "pipeline stage %d has no layers", s);
        t->stage_begin[s + 1] = t->stage_begin[s] + n;
    }
    REQUIRE(t->stage_begin[pp] == L, "pipeline stages hold %d layers, the model has %d",
            t->stage_begin[pp], L);
    t->layer_begin = t->stage_begin[t->pp_rank];
    t->layer_end = t->stage_begin[t->pp_rank + 1];
    return 0;
}
