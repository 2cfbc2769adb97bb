/* tests/test_plan.c - the size functions `tandem plan` reads (plan/plan.h)
 * against what the allocators allocate, in process: td_mem_current()
 * before and after model_init, model_train_acts_init, engine_init must
 * differ by exactly what model_init_shape, model_train_acts_bytes and
 * engine_mem say, on ranks of several topologies (core/ never calls MPI, so
 * any rank's slice can be built in one process).  tests/cli/plan.sh checks
 * whole runs under mpirun. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/pool.h"
#include "core/tok/tokenizer.h"
#include "infer/engine.h"
#include "plan/plan.h"

static void setup(void) { pool_init(1); }

TestSuite(plan, .init = setup);

/* A small MoE with a dense first layer, shared experts and q/k norm: every
 * kind of buffer the carves size. */
static const char *g_js = "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 4,"
                          " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                          " \"intermediate_size\": 48, \"first_k_dense_replace\": 1,"
                          " \"moe_intermediate_size\": 16, \"num_local_experts\": 4, \"n_shared_experts\": 1,"
                          " \"num_experts_per_tok\": 2, \"qk_norm\": \"head\", \"max_position_embeddings\": 64}";

static ModelConfig config(void)
{
    ModelConfig cfg;
    char err[256];
    cr_assert(config_parse(&cfg, g_js, err, sizeof err) == 0, "%s", err);
    return cfg;
}

/* rank r of dp x tp x pp with ep */
static Topology topo(const ModelConfig *cfg, int dp, int tp, int pp, int ep, int r)
{
    Topology t;
    char err[256];
    cr_assert(topo_init(&t, cfg, dp, tp, pp, ep, 1, r, NULL, err, sizeof err) == 0, "%s", err);
    return t;
}

static const int g_lay[][5] = { { 1, 1, 1, 1, 0 }, { 2, 1, 1, 2, 1 }, { 1, 2, 1, 1, 1 }, { 1, 1, 2, 1, 0 },
                                { 1, 1, 2, 1, 1 }, { 2, 2, 1, 2, 3 }, { 4, 1, 1, 4, 2 } };
#define N_LAY (sizeof g_lay / sizeof g_lay[0])

Test(plan, shape_has_the_tables_and_sizes_of_the_model)
{
    ModelConfig cfg = config();
    for (size_t i = 0; i < N_LAY; i++) {
        Topology t = topo(&cfg, g_lay[i][0], g_lay[i][1], g_lay[i][2], g_lay[i][3], g_lay[i][4]);
        for (int serving = 0; serving < 2; serving++) {
            ModelDtypes dt = model_dtypes_default(DTYPE_INT8);
            Model m, s;
            size_t before = td_mem_current();
            if (serving) model_init_serving(&m, &cfg, &t, 16, &dt);
            else model_init(&m, &cfg, &t, true, 16);
            size_t used = td_mem_current() - before;
            model_init_shape(&s, &cfg, &t, 16, serving ? &dt : NULL);
            cr_expect_eq(s.n_w, m.n_w, "layout %zu serving %d: n_w %zu, model %zu", i, serving, s.n_w, m.n_w);
            cr_expect_eq(s.n_packed, m.n_packed, "layout %zu serving %d: n_packed", i, serving);
            cr_expect_eq(s.n_params, m.n_params, "layout %zu serving %d: n_params", i, serving);
            for (int p = 0; p < m.n_params && p < s.n_params; p++) {
                cr_expect_str_eq(s.params[p].name, m.params[p].name);
                cr_expect_eq(s.params[p].numel, m.params[p].numel, "%s", m.params[p].name);
                cr_expect_eq(s.params[p].offset, m.params[p].offset, "%s", m.params[p].name);
                cr_expect_eq(s.params[p].mat_bytes, m.params[p].mat_bytes, "%s", m.params[p].name);
            }
            /* what model_init allocated: the slabs and the tables */
            size_t want = m.n_w * sizeof(float) * (serving ? 1 : 2) + m.n_packed + model_table_bytes(&m);
            cr_expect_eq(used, want, "layout %zu serving %d: model_init allocated %zu, the sizes say %zu", i, serving,
                         used, want);
            model_free(&s);
            model_free(&m);
        }
    }
}

Test(plan, train_acts_bytes_is_what_train_acts_init_allocates)
{
    ModelConfig cfg = config();
    for (size_t i = 0; i < N_LAY; i++) {
        Topology t = topo(&cfg, g_lay[i][0], g_lay[i][1], g_lay[i][2], g_lay[i][3], g_lay[i][4]);
        Model s;
        model_init_shape(&s, &cfg, &t, 16, NULL);
        for (int mode = RECOMPUTE_NONE; mode <= RECOMPUTE_SELECTIVE; mode++) {
            TrainActs a;
            size_t before = td_mem_current();
            model_train_acts_init(&a, &s, 3, 20, (Recompute)mode);
            size_t used = td_mem_current() - before;
            size_t want = model_train_acts_bytes(&s, 3, 20, (Recompute)mode);
            cr_expect_eq(used, want, "layout %zu mode %d: allocated %zu, model_train_acts_bytes %zu", i, mode, used,
                         want);
            model_train_acts_free(&a);
        }
        model_free(&s);
    }
}

Test(plan, engine_mem_is_what_engine_init_allocates)
{
    ModelConfig cfg = config();
    Tokenizer *tok = tok_byte_level();
    const size_t budgets[] = { 1, 100000, 3 << 20 };
    for (size_t i = 0; i < N_LAY; i++) {
        if (g_lay[i][2] != 1) continue;   /* serving: pp = 1 */
        Topology t = topo(&cfg, g_lay[i][0], g_lay[i][1], 1, g_lay[i][3], g_lay[i][4]);
        for (size_t bi = 0; bi < 3; bi++) {
            ModelDtypes dt = model_dtypes_default(DTYPE_BF16);
            Model m;
            model_init_serving(&m, &cfg, &t, 16, &dt);
            m.attn.kv = bi == 1 ? DTYPE_INT8 : DTYPE_BF16;
            EngineOpts o;
            engine_opts_default(&o);
            o.kv_budget_bytes = budgets[bi];
            o.max_running = 3 + bi;
            o.max_batch_tokens = bi == 2 ? 2 : 40;   /* below max_running: engine_init raises it */
            o.tok = tok;
            int32_t stop = 1;
            o.stop_ids = &stop;
            o.n_stop_ids = 1;
            EngineMem em;
            engine_mem(&m, &o, &em);
            Engine e;
            size_t before = td_mem_current();
            engine_init(&e, &m, &o);
            size_t used = td_mem_current() - before;
            cr_expect_eq(used, em.kv_cache + em.activations + em.workspace,
                         "layout %zu budget %zu: engine_init allocated %zu, engine_mem %zu + %zu + %zu", i, budgets[bi],
                         used, em.kv_cache, em.activations, em.workspace);
            cr_expect_eq((size_t)e.kv.n_blocks, em.kv_blocks, "blocks");
            engine_free(&e);
            model_free(&m);
        }
    }
    tok_free(tok);
}

Test(plan, every_layout_once_ranked_refusals_named)
{
    ModelConfig cfg = config();
    PlanOpts o;
    plan_opts_default(&o);
    o.world = 8;
    o.device_bytes = 1e12;
    o.seq_len = 32;
    o.micro_batch = 8;
    o.grad_accum = 2;
    PlanResult *v;
    int n = plan_all(&cfg, &o, &v);
    /* dp tp pp with dp tp pp = 8, ep | dp: (dp, ep) pairs over the 10 (tp, pp) splits */
    int want = 0;
    for (int tp = 1; tp <= 8; tp *= 2)
        for (int pp = 1; pp <= 8 / tp; pp *= 2)
            for (int ep = 1; ep <= 8 / tp / pp; ep *= 2) want++;
    cr_assert_eq(n, want, "%d layouts, want %d", n, want);
    int n_ok = 0;
    for (int i = 0; i < n; i++) {
        const PlanResult *r = &v[i];
        if (r->feasible) {
            n_ok++;
            cr_expect(i == 0 || !v[i - 1].feasible || v[i - 1].est_step_s <= r->est_step_s, "not ranked at %d", i);
            double sum = 0;
            for (int c = 0; c < PLAN_TOTAL; c++) sum += r->bytes[c];
            cr_expect(sum == r->bytes[PLAN_TOTAL], "categories add up to the total");
        } else {
            cr_expect(r->reason[0], "an infeasible layout says why");
            if (r->l.tp == 8) cr_expect(strstr(r->reason, "num_attention_heads"), "tp=8: %s", r->reason);
            if (r->l.tp == 4) cr_expect(strstr(r->reason, "num_key_value_heads"), "tp=4: %s", r->reason);
            if (r->l.pp == 8) cr_expect(strstr(r->reason, "num_hidden_layers"), "pp=8: %s", r->reason);
        }
    }
    cr_expect(n_ok > 0);
    td_free(v);
    /* nothing fits a tiny device: every layout says how much it needs */
    o.device_bytes = 1e5;
    n = plan_all(&cfg, &o, &v);
    for (int i = 0; i < n; i++) cr_expect(!v[i].feasible);
    cr_expect(strstr(v[0].reason, "needs"), "%s", v[0].reason);
    td_free(v);
}

/* Sequence parallelism (Topology.sp): the dry carve still sizes what
 * model_train_acts_init allocates, and holds less than tp alone; the plan
 * counts it per layout with tp > 1 (and ignores it at tp = 1), the
 * pipeline's messages 1/tp of tp's. */
Test(plan, sp_acts_bytes_are_allocated_and_below_tp)
{
    ModelConfig cfg = config();
    for (int r = 0; r < 2; r++) {
        Topology t = topo(&cfg, 1, 2, 1, 1, r);
        Model s;
        model_init_shape(&s, &cfg, &t, 16, NULL);
        for (int mode = RECOMPUTE_NONE; mode <= RECOMPUTE_SELECTIVE; mode++) {
            s.topo.sp = false;
            const size_t tp_only = model_train_acts_bytes(&s, 3, 20, (Recompute)mode);
            s.topo.sp = true;
            TrainActs a;
            size_t before = td_mem_current();
            model_train_acts_init(&a, &s, 3, 20, (Recompute)mode);
            size_t used = td_mem_current() - before;
            size_t want = model_train_acts_bytes(&s, 3, 20, (Recompute)mode);
            cr_expect_eq(used, want, "rank %d mode %d: allocated %zu, model_train_acts_bytes %zu", r, mode, used, want);
            cr_expect(want < tp_only, "rank %d mode %d: sp %zu bytes, tp alone %zu", r, mode, want, tp_only);
            model_train_acts_free(&a);
        }
        model_free(&s);
    }
    PlanOpts o;
    plan_opts_default(&o);
    o.world = 4;
    o.device_bytes = 1e12;
    o.seq_len = 32;
    o.micro_batch = 4;
    o.grad_accum = 2;
    const PlanLayout lays[] = { { 2, 2, 1, 1, 1 }, { 1, 2, 2, 1, 1 }, { 4, 1, 1, 1, 1 } };
    for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
        PlanResult a, b;
        o.sp = false;
        plan_layout(&cfg, &o, lays[i], &a);
        o.sp = true;
        plan_layout(&cfg, &o, lays[i], &b);
        cr_assert(a.feasible && b.feasible, "layout %zu: %s %s", i, a.reason, b.reason);
        const int tp = lays[i].tp;
        if (tp == 1) {
            cr_expect(b.bytes[PLAN_ACTIVATIONS] == a.bytes[PLAN_ACTIVATIONS] && b.comm[PLAN_TP] == 0,
                      "tp=1: sp changes nothing");
            continue;
        }
        cr_expect(b.bytes[PLAN_ACTIVATIONS] < a.bytes[PLAN_ACTIVATIONS], "layout %zu: activations %.0f vs %.0f", i,
                  b.bytes[PLAN_ACTIVATIONS], a.bytes[PLAN_ACTIVATIONS]);
        cr_expect(b.comm[PLAN_PP] * tp == a.comm[PLAN_PP], "layout %zu: pp %.0f vs %.0f", i, b.comm[PLAN_PP],
                  a.comm[PLAN_PP]);
        /* recompute=full (the default): per layer 2 x 2 + 2 all-reduces of
         * tp; sp adds h1's gather again (half a ring), and the ends: stage 0
         * gathers for the embedding, the last stage for the head */
        const int nl = lays[i].pp == 1 ? 4 : 2;
        const double ends = lays[i].pp == 1 ? 1.5 : 0.5;
        const double want = a.comm[PLAN_TP] * (nl * 6.5 + ends) / (nl * 6.0);
        cr_expect(fabs(b.comm[PLAN_TP] - want) <= 1e-9 * want, "layout %zu: tp %.0f, want %.0f", i, b.comm[PLAN_TP],
                  want);
    }
    o.seq_len = 31;   /* one sequence of 31 rows per dp rank: tp=2 does not divide them */
    o.micro_batch = 2;
    PlanResult c;
    plan_layout(&cfg, &o, (PlanLayout){ 2, 2, 1, 1, 1 }, &c);
    cr_expect(!c.feasible && strstr(c.reason, "sp: tp=2 does not divide the 31 rows"), "%s", c.reason);
}
