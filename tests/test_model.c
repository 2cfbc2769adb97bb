/* tests/test_model.c - the whole model against the PyTorch reference
 * (tests/ref/fixtures_model.py), and recomputation modes against each other.
 */
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <string.h>

#include "core/model/backprop.h"
#include "core/model/expert_cache.h"
#include "core/common.h"
#include "core/pool.h"
#include "train/optim.h"
#include "tests/fixture.h"

static void setup(void) { pool_init(1); }

TestSuite(model, .init = setup);

static char *attr_str(const char *file, const char *name)
{
    hid_t f = H5Fopen(fixture_path(file), H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(f >= 0, "fixture %s missing", file);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t t = H5Aget_type(a);
    char *s = NULL;
    if (H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        H5Aread(a, t, &v);   /* h5py writes variable-length UTF-8 */
        s = td_strdup(v);
        H5free_memory(v);
    } else {
        size_t n = H5Tget_size(t);
        s = td_calloc(n + 1);
        H5Aread(a, t, s);
    }
    H5Tclose(t);
    H5Aclose(a);
    H5Fclose(f);
    return s;
}

typedef struct {
    Model m;
    TrainActs a;
    int32_t *ids, *targets;
    size_t B, T;
    LossParts lp;
    float *dlogp;
    double seq_coef;   /* sequence-wise balance loss coefficient (a run key) */
} Case;

/* Model with the fixture's weights, acts for its batch. */
static void case_open(Case *c, const char *file, Recompute mode)
{
    memset(c, 0, sizeof *c);
    char *js = attr_str(file, "config"), err[256];
    ModelConfig cfg;
    cr_assert(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    td_free(js);
    Topology t;
    topo_single(&t, &cfg);
    model_init(&c->m, &cfg, &t, true, 16);
    for (int i = 0; i < c->m.n_params; i++) {
        Param *p = &c->m.params[i];
        char name[160];
        snprintf(name, sizeof name, "w/%s", p->name);
        size_t n;
        float *w = fixture_f32(file, name, &n);
        cr_assert_eq(n, p->numel, "%s: %zu elements, model has %zu", p->name, n, p->numel);
        memcpy(p->w, w, n * sizeof(float));
        td_free(w);
    }
    model_pack(&c->m);
    size_t n;
    c->ids = fixture_i32(file, "ids", &n);
    c->targets = fixture_i32(file, "targets", &n);
    c->T = 19;
    c->B = n / c->T;
    model_train_acts_init(&c->a, &c->m, c->B, c->T, mode);
    c->seq_coef = fixture_attr(file, "seq_aux_coef");
    c->a.seq_bal = c->seq_coef > 0;
    c->dlogp = td_malloc(n * sizeof(float));
}

static void case_close(Case *c)
{
    model_train_acts_free(&c->a);
    model_free(&c->m);
    td_free(c->ids);
    td_free(c->targets);
    td_free(c->dlogp);
}

/* One forward + backward of the SPEC loss; returns the loss. */
static double case_step(Case *c)
{
    const size_t N = c->B * c->T;
    memset(c->m.g, 0, c->m.n_w * sizeof(float));
    model_train_forward(&c->m, &c->a, c->ids, c->targets, N, &c->lp);
    for (size_t t = 0; t < N; t++) c->dlogp[t] = -1.0f / (float)N;
    const ModelConfig *cfg = &c->m.cfg;
    float daux = c->lp.n_moe ? (float)(cfg->router_aux_loss_coef / c->lp.n_moe) : 0.0f;
    float dz = c->lp.n_moe ? (float)(cfg->router_z_loss_coef / c->lp.n_moe) : 0.0f;
    /* sequence-wise balance: mean over the B sequences and the MoE layers */
    c->a.dseq_bal = c->lp.n_moe ? (float)(c->seq_coef / ((double)c->lp.n_moe * (double)c->B)) : 0.0f;
    model_train_backward(&c->m, &c->a, c->targets, c->dlogp, daux, dz);
    const double seq = c->lp.n_moe ? c->lp.seq_bal_sum / ((double)c->lp.n_moe * (double)c->B) : 0.0;
    return c->lp.ce_sum / (double)N + cfg->router_aux_loss_coef * c->lp.aux +
           cfg->router_z_loss_coef * c->lp.z + c->seq_coef * seq;
}

static void check_against_torch(const char *file)
{
    Case c;
    case_open(&c, file, RECOMPUTE_NONE);
    double loss = case_step(&c);
    /* float32 forward of a 2-3 layer model vs float64: ~1e-6 relative */
    double want = fixture_attr(file, "loss");
    cr_expect(fabs(loss - want) <= 2e-5 * fabs(want), "%s: loss %.8f, torch %.8f", file, loss, want);
    cr_expect(fabs(c.lp.aux - fixture_attr(file, "aux")) <= 1e-5, "%s: aux %.8f vs %.8f", file,
              c.lp.aux, fixture_attr(file, "aux"));
    cr_expect(fabs(c.lp.z - fixture_attr(file, "z")) <= 1e-5 * (1 + fixture_attr(file, "z")),
              "%s: z %.8f vs %.8f", file, c.lp.z, fixture_attr(file, "z"));
    size_t n;
    float *logp = fixture_f32(file, "logp", &n);
    /* per-token log-probabilities: float32 logits, |logp| ~ 4 */
    EXPECT_CLOSE(c.a.logp, logp, n, 2e-5, 2e-5, "logp");
    td_free(logp);
    for (int i = 0; i < c.m.n_params; i++) {
        Param *p = &c.m.params[i];
        char name[160];
        snprintf(name, sizeof name, "g/%s", p->name);
        float *g = fixture_f32(file, name, &n);
        /* relative error of the whole gradient tensor: float32 accumulation
         * over ~40 tokens, 3 layers deep; the issue asks for about 1e-4 */
        double num = 0, den = 0, gmax = 0;
        for (size_t j = 0; j < n; j++) {
            num += ((double)p->g[j] - g[j]) * ((double)p->g[j] - g[j]);
            den += (double)g[j] * g[j];
            gmax = fmax(gmax, fabs(g[j]));
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        cr_expect(rel <= 1e-4 && isfinite(rel), "%s: gradient %s relative error %.3g (|g|max %.3g)",
                  file, p->name, rel, gmax);
        /* and elementwise, against the tensor's scale */
        EXPECT_CLOSE(p->g, g, n, 2e-4 * gmax, 1e-3, p->name);
        td_free(g);
    }
    case_close(&c);
}

Test(model, gradients_match_torch_base) { check_against_torch("model_base.h5"); }
Test(model, gradients_match_torch_shared_dense_tied_k1) { check_against_torch("model_variants.h5"); }
Test(model, gradients_match_torch_odd_sizes) { check_against_torch("model_odd.h5"); }
/* Hugging Face families' ops (docs/config.md): every parameter's gradient */
Test(model, gradients_match_torch_qwen2moe_bias_gated_shared_schedule) { check_against_torch("model_qwen2moe.h5"); }
Test(model, gradients_match_torch_qwen3moe_head_qk_norm_head_dim) { check_against_torch("model_qwen3moe.h5"); }
Test(model, gradients_match_torch_olmoe_full_qk_norm_clip_bias) { check_against_torch("model_olmoe.h5"); }
/* multi-head latent attention, absorbed, against HF's naive form */
Test(model, gradients_match_torch_mla_q_lora_interleaved_rope) { check_against_torch("model_mla.h5"); }
Test(model, gradients_match_torch_mla_q_proj) { check_against_torch("model_mla_q.h5"); }
Test(model, gradients_match_torch_v3router_sigmoid_groups_bias_scale_seq_balance)
{
    check_against_torch("model_v3router.h5");
}

/* recompute=full and =selective: the same gradients, bit for bit, and a
 * smaller activation peak than none. */
static void check_recompute(const char *file)
{
    Case ref, alt;
    case_open(&ref, file, RECOMPUTE_NONE);
    double l0 = case_step(&ref);
    for (int mode = RECOMPUTE_FULL; mode <= RECOMPUTE_SELECTIVE; mode++) {
        case_open(&alt, file, (Recompute)mode);
        double l1 = case_step(&alt);
        cr_expect(l0 == l1, "mode %d: loss %.9g vs %.9g", mode, l1, l0);
        size_t diff = 0, first = 0;
        for (size_t j = 0; j < ref.m.n_w; j++)
            if (memcmp(&ref.m.g[j], &alt.m.g[j], sizeof(float))) {
                if (!diff) first = j;
                diff++;
            }
        cr_expect(diff == 0, "mode %d: %zu gradient elements differ (first %zu: %.9g vs %.9g)", mode,
                  diff, first, alt.m.g[first], ref.m.g[first]);
        cr_expect(alt.a.arena.size < ref.a.arena.size, "mode %d: arena %zu not below none's %zu",
                  mode, alt.a.arena.size, ref.a.arena.size);
        case_close(&alt);
    }
    case_close(&ref);
}

Test(model, recompute_modes_bit_identical) { check_recompute("model_base.h5"); }
Test(model, recompute_modes_bit_identical_variants) { check_recompute("model_variants.h5"); }
Test(model, recompute_modes_bit_identical_qwen2moe) { check_recompute("model_qwen2moe.h5"); }
Test(model, recompute_modes_bit_identical_qwen3moe) { check_recompute("model_qwen3moe.h5"); }
Test(model, recompute_modes_bit_identical_olmoe) { check_recompute("model_olmoe.h5"); }
Test(model, recompute_modes_bit_identical_mla) { check_recompute("model_mla.h5"); }
Test(model, recompute_modes_bit_identical_mla_q) { check_recompute("model_mla_q.h5"); }
Test(model, recompute_modes_bit_identical_v3router) { check_recompute("model_v3router.h5"); }

/* Two AdamW steps on the fixture's gradients equal torch.optim.AdamW's
 * (lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices and
 * embeddings, none on norms). */
Test(model, adamw_matches_torch)
{
    Case c;
    case_open(&c, "model_variants.h5", RECOMPUTE_NONE);
    Model *m = &c.m;
    float *m1 = td_calloc(m->n_w * sizeof(float)), *m2 = td_calloc(m->n_w * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        Param *p = &m->params[i];
        char name[160];
        size_t n;
        snprintf(name, sizeof name, "g/%s", p->name);
        float *g = fixture_f32("model_variants.h5", name, &n);
        memcpy(p->g, g, n * sizeof(float));
        td_free(g);
    }
    AdamHyper h = { 0.9, 0.95, 1e-8, 0.1 };
    for (int t = 1; t <= 2; t++) {
        adamw_step(m, m1, m2, &h, t, 1e-3, 1.0f);
        for (int i = 0; i < m->n_params; i++) {
            Param *p = &m->params[i];
            char name[160];
            size_t n;
            snprintf(name, sizeof name, "adam%d/%s", t, p->name);
            float *want = fixture_f32("model_variants.h5", name, &n);
            /* float32 elementwise arithmetic in another association than
             * torch's (lerp vs mul/add, fused sqrt/div): a few ulp of w
             * (|w| ~ 0.05..1) plus ~1e-9 absolute on the update */
            EXPECT_CLOSE(p->w, want, n, 1e-8, 2e-6, p->name);
            td_free(want);
        }
    }
    td_free(m1);
    td_free(m2);
    case_close(&c);
}

/* ------------------------------------------------------------ serving models */

/* x (rows x K) rounded as dtype t stores it, written out from the
 * definitions (SPEC section 11): bf16 nearest even; int8 per row, groups
 * of 32 along K (the last K mod 32 long), s = bf16(amax / 127) (nearest
 * even), (float)rne(x / s) s. */
static void round_rows(float *x, size_t rows, size_t K, Dtype t)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t k0 = 0; k0 < K; k0 += 32) {
            float *g = x + r * K + k0, amax = 0;
            const size_t n = K - k0 < 32 ? K - k0 : 32;
            for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(g[i]));
            const float s = fixture_bf16(amax / 127.0f);
            for (size_t i = 0; i < n; i++) {
                if (t == DTYPE_BF16) {
                    g[i] = fixture_bf16(g[i]);
                } else if (t == DTYPE_INT8) {
                    const int q = s > 0 ? (int)fmaxf(-127, fminf(127, rintf(g[i] / s))) : 0;
                    g[i] = (float)q * s;
                }
            }
        }
}

/* A serving model (model_init_serving + model_quantize_from: packed in its
 * dtypes, no float32 master, embedding rows looked up from the packed
 * table) computes, bit for bit, the training forward of a float32 model
 * whose weights are the rounded ones -- log-probabilities and every
 * layer's experts -- at each plan, and with a narrow KV cache on both. */
static void check_serving(const char *file)
{
    static const ModelDtypes plans[] = { { DTYPE_F32, DTYPE_F32, DTYPE_F32, DTYPE_F32 },
                                         { DTYPE_BF16, DTYPE_BF16, DTYPE_BF16, DTYPE_BF16 },
                                         { DTYPE_INT8, DTYPE_INT8, DTYPE_INT8, DTYPE_INT8 },
                                         { DTYPE_INT8, DTYPE_F32, DTYPE_BF16, DTYPE_INT8 },
                                         { DTYPE_F32, DTYPE_F32, DTYPE_F32, DTYPE_BF16 },
                                         { DTYPE_INT8, DTYPE_INT8, DTYPE_INT8, DTYPE_BF16 } };
    for (size_t pi = 0; pi < sizeof plans / sizeof *plans; pi++)
        for (int kv = 0; kv < 3; kv += 2) {
            Case c;
            case_open(&c, file, RECOMPUTE_NONE);
            const ModelDtypes *dt = &plans[pi];
            Model s;
            model_init_serving(&s, &c.m.cfg, &c.m.topo, 16, dt);
            model_quantize_from(&s, &c.m);
            /* held once: no float32 view of a packed matrix, the weight
             * slab only the vectors (and shared_expert_gate) */
            size_t vec = 0, bad = 0;
            for (int i = 0; i < s.n_params; i++) {
                const Param *p = &s.params[i];
                bad += p->packed && p->w != NULL;
                bad += p->packed && p->dtype != model_serving_dtype(&s.cfg, dt, p);
                if (!p->packed) vec += (p->numel + 15) / 16 * 16;
            }
            cr_expect(bad == 0 && s.n_w == vec && !s.g, "%s: %zu packed matrices keep a float32 view or the wrong dtype; "
                      "weight slab %zu floats for %zu of vectors", file, bad, s.n_w, vec);
            /* the reference: the training model with rounded weights */
            for (int i = 0; i < c.m.n_params; i++) {
                Param *p = &c.m.params[i];
                const Dtype t = model_serving_dtype(&c.m.cfg, dt, p);
                if (p->ndim >= 2) round_rows(p->w, p->numel / p->lshape[p->ndim - 1], p->lshape[p->ndim - 1], t);
            }
            model_pack(&c.m);
            c.m.attn.kv = s.attn.kv = (Dtype)kv;
            model_train_acts_free(&c.a);
            model_train_acts_init(&c.a, &c.m, c.B, c.T, RECOMPUTE_NONE);
            TrainActs sa;
            model_train_acts_init(&sa, &s, c.B, c.T, RECOMPUTE_NONE);
            const size_t N = c.B * c.T;
            model_train_forward(&c.m, &c.a, c.ids, c.targets, N, NULL);
            model_train_forward(&s, &sa, c.ids, c.targets, N, NULL);
            char what[192];
            snprintf(what, sizeof what, "%s, weights %s, embed %s, head %s, attn %s, kv %s", file,
                     dtype_name(dt->mat), dtype_name(dt->embed), dtype_name(dt->head), dtype_name(dt->attn),
                     dtype_name((Dtype)kv));
            if (dt->mat != DTYPE_INT8 && dt->head != DTYPE_INT8 && dt->attn != DTYPE_INT8) {
                EXPECT_BITWISE(sa.logp, c.a.logp, N, what);
                for (int li = 0; li < s.topo.layer_end - s.topo.layer_begin; li++)
                    if (s.layers[li].moe)
                        cr_expect(!memcmp(sa.la[li].topk_idx, c.a.la[li].topk_idx, N * s.k * sizeof(int32_t)),
                                  "%s: layer %d routes differ", what, li);
            } else {
                /* int8 products round x to 16 bits a group (core/ops/gemm_q8.h): close to the
                 * float32 forward of the rounded weights, not its bits (those of int8 serving are
                 * checked against the trainer's int8 forward elsewhere).  Measured: at most
                 * 2.0e-4 with a float32 KV cache (v3router, all int8; 1.6e-4 before the
                 * weight scales went to bf16, which moved the grid), every route equal; an int8 KV cache amplifies
                 * it (x's rounding moves a key across a rounding boundary of the cache): at most
                 * 0.0078, 2 routes of 304 apart.  W8A8 (x to 8 bits) was 100 times further. */
                double dmax = 0;
                for (size_t i = 0; i < N; i++) dmax = fmax(dmax, fabs((double)sa.logp[i] - (double)c.a.logp[i]));
                size_t same = 0, all = 0;
                for (int li = 0; li < s.topo.layer_end - s.topo.layer_begin; li++)
                    if (s.layers[li].moe)
                        for (size_t i = 0; i < N * (size_t)s.k; i++, all++) same += sa.la[li].topk_idx[i] == c.a.la[li].topk_idx[i];
                const double tol = kv == DTYPE_INT8 ? 0.02 : 4e-4;
                const size_t want = kv == DTYPE_INT8 ? all * 98 / 100 : all;
                cr_expect(dmax < tol && same >= want, "%s: int8 max |logp - rounded-weights f32| %.3g (want < %g), "
                          "%zu of %zu routes equal (want >= %zu)", what, dmax, tol, same, all, want);
            }
            model_train_acts_free(&sa);
            model_free(&s);
            case_close(&c);
        }
}

Test(model, serving_models_compute_the_forward_on_the_rounded_weights) { check_serving("model_base.h5"); }
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_variants) { check_serving("model_variants.h5"); }
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_qwen2moe) { check_serving("model_qwen2moe.h5"); }
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_qwen3moe) { check_serving("model_qwen3moe.h5"); }
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_olmoe) { check_serving("model_olmoe.h5"); }
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_mla) { check_serving("model_mla.h5"); }

/* ---------------------------------------------------------------- MLA: finite differences */

/* The cross-entropy of one forward (all rows' targets), double. */
static double mla_ce(Model *m, TrainActs *a, const int32_t *ids, const int32_t *targets, size_t N)
{
    LossParts lp;
    memset(&lp, 0, sizeof lp);
    model_train_forward(m, a, ids, targets, N, &lp);
    return lp.ce_sum / (double)N;
}

Test(model, mla_gradients_match_finite_differences)
{
    /* Every attention tensor of a tiny MLA model (q_lora and not, both
     * RoPE layouts; dense FFNs: no route can flip under a perturbation):
     * the directional derivative of the loss along the gradient itself
     * (= |g|) and along a random direction u (= g . u), by central
     * differences with step 1e-2 in weight space (the float32 loss' noise
     * ~5e-7 gives ~3e-5 on derivatives of size |g| ~ 6e-3 .. 1; the
     * third-order term of a step along a large gradient dominates: worst
     * measured 0.32% of |g| (kv_a_proj_with_mqa of config 1), 2% allowed). */
    static const char *const cfgs[] = {
        "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 4, \"q_lora_rank\": 12, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
        " \"qk_rope_head_dim\": 4, \"v_head_dim\": 6, \"rope_interleave\": true, \"first_k_dense_replace\": 2,"
        " \"intermediate_size\": 40, \"max_position_embeddings\": 64}",
        "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 2, \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 6, \"qk_rope_head_dim\": 6,"
        " \"v_head_dim\": 10, \"first_k_dense_replace\": 2, \"intermediate_size\": 40,"
        " \"max_position_embeddings\": 64}",
    };
    for (int ci = 0; ci < 2; ci++) {
        ModelConfig cfg;
        char err[256];
        cr_assert(config_parse(&cfg, cfgs[ci], err, sizeof err) == 0, "%s", err);
        Topology t;
        topo_single(&t, &cfg);
        Model m;
        model_init(&m, &cfg, &t, true, 16);
        model_init_weights(&m, 5 + (uint64_t)ci);
        for (int i = 0; i < m.n_params; i++) {   /* away from the near-uniform start: std 0.1, norms 1 +- 0.3 */
            Param *p = &m.params[i];
            float *r = fixture_rand(p->numel, 800 + (uint64_t)i, -0.3f, 0.3f);
            for (size_t j = 0; j < p->numel; j++) p->w[j] = p->ndim == 1 ? 1.0f + r[j] : 5.0f * p->w[j];
            td_free(r);
        }
        model_pack(&m);
        const size_t B = 2, T = 13, N = B * T;
        TrainActs a;
        model_train_acts_init(&a, &m, B, T, RECOMPUTE_NONE);
        int32_t ids[2 * 13], targets[2 * 13];
        float dlogp[2 * 13];
        for (size_t i = 0; i < N; i++) {
            ids[i] = (int32_t)((i * 17 + 3) % 64);
            targets[i] = (int32_t)((i * 29 + 11) % 64);
            dlogp[i] = -1.0f / (float)N;
        }
        memset(m.g, 0, m.n_w * sizeof(float));
        mla_ce(&m, &a, ids, targets, N);
        model_train_backward(&m, &a, targets, dlogp, 0.0f, 0.0f);
        float *g = td_malloc(m.n_w * sizeof(float));
        memcpy(g, m.g, m.n_w * sizeof(float));
        int n_checked = 0;
        for (int i = 0; i < m.n_params; i++) {
            Param *p = &m.params[i];
            if (!strstr(p->name, "self_attn/")) continue;
            const float *gp = g + p->offset;
            double gn = 0;
            for (size_t j = 0; j < p->numel; j++) gn += (double)gp[j] * gp[j];
            gn = sqrt(gn);
            cr_assert(gn > 1e-4, "%s: gradient norm %.3g, too small to check", p->name, gn);
            float *u = fixture_rand(p->numel, 900 + (uint64_t)i, -1, 1), *w0 = td_malloc(p->numel * sizeof(float));
            memcpy(w0, p->w, p->numel * sizeof(float));
            for (int dir = 0; dir < 2; dir++) {
                double un = 0, want = 0;
                for (size_t j = 0; j < p->numel; j++) {
                    const double uj = dir == 0 ? gp[j] : u[j];
                    un += uj * uj;
                }
                un = sqrt(un);
                for (size_t j = 0; j < p->numel; j++) want += (double)gp[j] * ((dir == 0 ? gp[j] : u[j]) / un);
                const double h = 1e-2;
                double Ls[2];
                for (int s = 0; s < 2; s++) {
                    const double sg = s == 0 ? h : -h;
                    for (size_t j = 0; j < p->numel; j++)
                        p->w[j] = (float)(w0[j] + sg * (dir == 0 ? gp[j] : u[j]) / un);
                    model_pack(&m);
                    Ls[s] = mla_ce(&m, &a, ids, targets, N);
                }
                const double fd = (Ls[0] - Ls[1]) / (2 * h);
                cr_expect(fabs(fd - want) <= 0.02 * gn, "config %d %s, %s direction: FD %.6g, gradient %.6g (|g| %.3g)",
                          ci, p->name, dir == 0 ? "gradient" : "random", fd, want, gn);
                n_checked++;
            }
            memcpy(p->w, w0, p->numel * sizeof(float));
            model_pack(&m);
            td_free(u);
            td_free(w0);
        }
        cr_expect_geq(n_checked, ci == 0 ? 2 * 2 * 7 : 2 * 2 * 5, "config %d: %d checks", ci, n_checked);
        td_free(g);
        model_train_acts_free(&a);
        model_free(&m);
    }
}
Test(model, serving_models_compute_the_forward_on_the_rounded_weights_v3router) { check_serving("model_v3router.h5"); }

/* ---------------------------------------------------------------- decoding's fused experts */

/* Decoding's expert block (core/model/layer.c: each expert's gate, up,
 * SwiGLU and down on one thread, when every expert has at most 4 rows and
 * at least four per thread have some, or a whole number per thread have
 * the same rows) gives the grouped path's bits: model_experts_forward on
 * the same rows with one thread (grouped) and with two, at each dtype, for
 * spreads of rows that are fused (one row an expert; 0-4 rows; one
 * decoding sequence's top 2: two experts of one row) and ones that are not
 * (an expert with 5; three experts of one row; two of 1 and 2 rows). */
static void check_fused_experts(const char *file)
{
    static const Dtype dts[3] = { DTYPE_F32, DTYPE_BF16, DTYPE_INT8 };
    for (int di = 0; di < 3; di++) {
        Case c;
        case_open(&c, file, RECOMPUTE_NONE);
        const ModelDtypes dt = { dts[di], dts[di], dts[di], dts[di] };
        Model s;
        model_init_serving(&s, &c.m.cfg, &c.m.topo, 16, &dt);
        model_quantize_from(&s, &c.m);
        const Layer *L = NULL;
        for (int l = s.topo.layer_begin; l < s.topo.layer_end && !L; l++)
            if (s.layers[l].moe) L = &s.layers[l];
        cr_assert(L && s.E >= 8, "%s: needs a MoE layer of 8 experts or more", file);
        const size_t E = s.E, d = s.d, F = s.F;
        for (int spread = 0; spread < 6; spread++) {
            int32_t off[E + 1];
            off[0] = 0;
            for (size_t e = 0; e < E; e++) {
                int rows = spread == 0 ? 1 : spread == 1 ? (int)((e * 7 + 3) % 5) : e == 2 ? 5 : 1;
                if (spread == 3) rows = e == 1 || e == 5;                      /* top 2 of one sequence */
                if (spread == 4) rows = e == 0 || e == 3 || e == E - 1;        /* three: not even */
                if (spread == 5) rows = e == 2 ? 1 : e == 6 ? 2 : 0;           /* rows differ: not even */
                off[e + 1] = off[e] + rows;
            }
            const size_t R = (size_t)off[E];
            LayerActs a;
            memset(&a, 0, sizeof a);
            a.e_off = off;
            a.n_recv = R;
            a.xe = td_malloc(R * d * sizeof(float));
            a.eg = td_malloc(R * F * sizeof(float));
            a.eu = td_malloc(R * F * sizeof(float));
            a.eh = td_malloc(R * F * sizeof(float));
            a.eoe = td_malloc(R * d * sizeof(float));
            a.eprob = td_malloc(2 * E * sizeof(GemmProblem));
            float *ref_o = td_malloc(R * d * sizeof(float)), *ref_h = td_malloc(R * F * sizeof(float));
            for (size_t i = 0; i < R * d; i++) a.xe[i] = (float)sin(0.37 * (double)i + 0.1 * spread);
            pool_init(1);
            model_experts_forward(&s, L, &a);
            memcpy(ref_o, a.eoe, R * d * sizeof(float));
            memcpy(ref_h, a.eh, R * F * sizeof(float));
            memset(a.eoe, 0xff, R * d * sizeof(float));
            memset(a.eh, 0xff, R * F * sizeof(float));
            pool_init(2);
            model_experts_forward(&s, L, &a);
            pool_init(1);
            char what[160];
            snprintf(what, sizeof what, "%s at %s, spread %d (%zu rows): 2 threads against 1", file, dtype_name(dts[di]),
                     spread, R);
            EXPECT_BITWISE(a.eoe, ref_o, R * d, what);
            EXPECT_BITWISE(a.eh, ref_h, R * F, what);
            td_free(a.xe);
            td_free(a.eg);
            td_free(a.eu);
            td_free(a.eh);
            td_free(a.eoe);
            td_free(a.eprob);
            td_free(ref_o);
            td_free(ref_h);
        }
        model_free(&s);
        case_close(&c);
    }
}

Test(model, decoding_experts_fused_give_the_grouped_bits) { check_fused_experts("model_olmoe.h5"); }
Test(model, decoding_experts_fused_give_the_grouped_bits_qwen3moe) { check_fused_experts("model_qwen3moe.h5"); }

/* ---------------------------------------------------------------- the fused attention block */

/* A forward of a few rows at two threads runs the attention block fused
 * (core/model/layer.c: q/k/v, norm, clamp, RoPE, the KV store and
 * attention in one region, a unit of kv heads at a time); at one thread it
 * does not.  Three sequences of 5 tokens (15 rows) give the same
 * log-probability bits both ways, for head dims 16 and 32, with per-head
 * q/k norm, biases, a clamp and a window, at each weight and KV dtype.
 * (tests/test_engine.c checks decoding against the trainer's forward.) */
Test(model, fused_attention_block_gives_the_unfused_bits)
{
    static const char *variants[] = {
        "\"head_dim\": 16",
        "\"head_dim\": 32, \"qk_norm\": \"head\", \"attention_bias\": true",
        "\"head_dim\": 16, \"clip_qkv\": 0.5, \"attention_bias\": true, \"sliding_window\": 3",
    };
    static const Dtype dts[3] = { DTYPE_F32, DTYPE_BF16, DTYPE_INT8 };
    enum { B = 3, T = 5, N = B * T };
    for (size_t vi = 0; vi < sizeof variants / sizeof *variants; vi++)
        for (int di = 0; di < 3; di++) {
            char what[256];
            snprintf(what, sizeof what, "{%s} at %s", variants[vi], dtype_name(dts[di]));
            Model m, s;
            fixture_gqa_serving(&m, &s, variants[vi], 64, 21 + vi, dts[di], dts[di]);
            int32_t ids[N + 1];
            for (size_t i = 0; i <= N; i++) ids[i] = (int32_t)((i * 11 + 3 * vi) % 64);
            TrainActs a1, a2;
            model_train_acts_init(&a1, &s, B, T, RECOMPUTE_NONE);
            model_train_acts_init(&a2, &s, B, T, RECOMPUTE_NONE);
            pool_init(1);
            model_train_forward(&s, &a1, ids, ids + 1, N, NULL);
            pool_init(2);
            const ModelBatch b = { N, NULL, NULL, NULL, B, N, NULL };
            cr_assert(model_attn_fused(&s, &b), "%s: %d rows at two threads are not fused", what, N);
            model_train_forward(&s, &a2, ids, ids + 1, N, NULL);
            pool_init(1);
            EXPECT_BITWISE(a2.logp, a1.logp, N, what);
            model_train_acts_free(&a1);
            model_train_acts_free(&a2);
            model_free(&s);
            model_free(&m);
        }
}

/* ---------------------------------------------------------------- expert offload */

/* The offload test's loader: expert e of p copied from the resident
 * serving model's packed slab (what a checkpoint loader packs), or a
 * failure for one expert when fail_e >= 0. */
typedef struct {
    Model *res;
    long fail_e;
    int calls;
} CopyLoader;

static int copy_expert(void *ctx, const Param *p, size_t e, unsigned char *dst, char *err, size_t err_len)
{
    CopyLoader *x = ctx;
    x->calls++;
    if ((long)e == x->fail_e) {
        snprintf(err, err_len, "expert %zu of %s unreadable", e, p->name);
        return -1;
    }
    const Param *r = model_param(x->res, p->name);
    cr_assert(r && r->packed && r->mat_bytes == p->mat_bytes && e < r->n_mats);
    memcpy(dst, r->packed + e * r->mat_bytes, r->mat_bytes);
    return 0;
}

/* An offloading serving model with the fewest slots (min(k, E) per layer,
 * so a batch of B*T rows computes in chunks and evicts within the
 * forward) gives the resident model's log-probabilities bit for bit; its
 * slab is the slots; the counters add up; a failed load is recorded and
 * counted, not fatal. */
static void check_offload(const char *file, Dtype d)
{
    Case c;
    case_open(&c, file, RECOMPUTE_NONE);
    const ModelDtypes dt = { d, d, d, d };
    Model s, o;
    model_init_serving(&s, &c.m.cfg, &c.m.topo, 16, &dt);
    model_quantize_from(&s, &c.m);
    model_init_serving_offload(&o, &c.m.cfg, &c.m.topo, 16, &dt);
    model_quantize_from(&o, &c.m);
    char err[512];
    const size_t min = expert_cache_min_slots(&o), xb = expert_cache_expert_bytes(&o), nm = expert_cache_moe_layers(&o);
    cr_assert(nm > 0 && o.n_packed < s.n_packed, "%s: the offloading model's packed slab holds the experts", file);
    cr_expect(expert_cache_check(&o, min * xb * nm - 1, err, sizeof err) == -1 && strstr(err, "is below"),
              "%s: a budget below min(k, E) slots per layer accepted", file);
    CopyLoader x = { &s, -1, 0 };
    cr_assert(!expert_cache_attach(&o, min * xb * nm, copy_expert, &x, NULL, err, sizeof err), "%s", err);
    cr_expect(o.ecache->slots == min && model_weight_bytes(&o) == o.n_w * sizeof(float) + o.n_packed + min * xb * nm);
    TrainActs sa, oa;
    model_train_acts_init(&sa, &s, c.B, c.T, RECOMPUTE_NONE);
    model_train_acts_init(&oa, &o, c.B, c.T, RECOMPUTE_NONE);
    const size_t N = c.B * c.T;
    model_train_forward(&s, &sa, c.ids, c.targets, N, NULL);
    model_train_forward(&o, &oa, c.ids, c.targets, N, NULL);
    char what[128];
    snprintf(what, sizeof what, "%s offloaded at %s, %zu slots per layer", file, dtype_name(d), min);
    EXPECT_BITWISE(oa.logp, sa.logp, N, what);
    const ExpertCacheStats *st = &o.ecache->st;
    /* bytes: the matrices' own (a slot's parts are padded to 64 bytes) */
    const Layer *L0 = NULL;
    for (int l = o.topo.layer_begin; l < o.topo.layer_end && !L0; l++)
        if (o.layers[l].moe) L0 = &o.layers[l];
    const size_t mb = L0->egate->mat_bytes + L0->eup->mat_bytes + L0->edown->mat_bytes;
    cr_expect(st->misses > min * nm && st->bytes_loaded == st->misses * mb, "%s: %llu misses, %llu bytes loaded", what, (unsigned long long)st->misses,
              (unsigned long long)st->bytes_loaded);
    cr_expect((int)st->misses * 3 == x.calls && expert_cache_error(o.ecache)[0] == 0);
    /* a second forward: the same bits from a warm, evicting cache */
    model_train_forward(&o, &oa, c.ids, c.targets, N, NULL);
    EXPECT_BITWISE(oa.logp, sa.logp, N, what);
    /* a failing expert: the error kept, counted; the next lookup retries */
    expert_cache_invalidate(o.ecache);
    x.fail_e = 0;
    model_train_forward(&o, &oa, c.ids, c.targets, N, NULL);
    cr_expect(strstr(expert_cache_error(o.ecache), "expert 0 of") && st->load_errors > 0, "%s: error \"%s\"", what,
              expert_cache_error(o.ecache));
    expert_cache_clear_error(o.ecache);
    model_train_acts_free(&sa);
    model_train_acts_free(&oa);
    model_free(&o);
    model_free(&s);
    case_close(&c);
}

Test(model, offloaded_experts_give_the_resident_bits) { check_offload("model_base.h5", DTYPE_F32); }
Test(model, offloaded_experts_give_the_resident_bits_int8) { check_offload("model_qwen3moe.h5", DTYPE_INT8); }
Test(model, offloaded_experts_give_the_resident_bits_mla_bf16) { check_offload("model_mla.h5", DTYPE_BF16); }
