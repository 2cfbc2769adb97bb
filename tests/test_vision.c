/* tests/test_vision.c - the vision tower and projector (core/model/vision.h)
 * inside a whole LLaVA-style VLM against PyTorch (vlm.h5 from
 * tests/ref/fixtures_vision.py): image vectors, loss, log-probabilities and
 * the gradient of every parameter; an image encoded alone gives the bits
 * of the same image in a batch; the config keys. */
#include "core/common.h"
#include "core/pool.h"
#include "core/model/backprop.h"
#include "core/model/config.h"
#include "core/model/vision.h"
#include "tests/fixture.h"

#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void setup(void) { pool_init(1); }
static void teardown(void) { pool_free(); }

TestSuite(vision, .init = setup, .fini = teardown);

static const char *const FX = "vlm.h5";

static char *attr_str(const char *file, const char *name)
{
    hid_t f = H5Fopen(fixture_path(file), H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(f >= 0, "fixture %s missing", file);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT), t = H5Aget_type(a);
    char *s = NULL;
    cr_assert(H5Tis_variable_str(t) > 0, "%s: %s is not a string", file, name);
    char *v = NULL;
    H5Aread(a, t, &v);
    s = td_strdup(v);
    H5free_memory(v);
    H5Tclose(t);
    H5Aclose(a);
    H5Fclose(f);
    return s;
}

typedef struct {
    Model m;
    TrainActs a;
    VisionActs va;
    int32_t *ids, *targets;
    float *pixels, *dlogp;
    size_t B, T, N;
    LossParts lp;
} Vlm;

static void vlm_open(Vlm *c, Recompute mode)
{
    memset(c, 0, sizeof *c);
    char *js = attr_str(FX, "config"), err[256];
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
        float *w = fixture_f32(FX, name, &n);
        cr_assert_eq(n, p->numel, "%s: %zu elements, model has %zu", p->name, n, p->numel);
        memcpy(p->w, w, n * sizeof(float));
        td_free(w);
    }
    model_pack(&c->m);
    size_t n;
    c->ids = fixture_i32(FX, "ids", &c->N);
    c->targets = fixture_i32(FX, "targets", &n);
    c->pixels = fixture_f32(FX, "pixels", &n);
    c->B = 2;
    c->T = c->N / c->B;
    model_train_acts_init(&c->a, &c->m, c->B, c->T, mode);
    vision_acts_init(&c->va, &c->m, c->B);
    c->a.vis = &c->va;
    c->a.pixels = c->pixels;
    c->a.n_img = c->B;
    c->dlogp = td_malloc(c->N * sizeof(float));
}

static void vlm_close(Vlm *c)
{
    model_train_acts_free(&c->a);
    vision_acts_free(&c->va);
    model_free(&c->m);
    td_free(c->ids);
    td_free(c->targets);
    td_free(c->pixels);
    td_free(c->dlogp);
}

static double vlm_step(Vlm *c)
{
    memset(c->m.g, 0, c->m.n_w * sizeof(float));
    model_train_forward(&c->m, &c->a, c->ids, c->targets, c->N, &c->lp);
    for (size_t t = 0; t < c->N; t++) c->dlogp[t] = -1.0f / (float)c->N;
    const ModelConfig *cfg = &c->m.cfg;
    const float daux = (float)(cfg->router_aux_loss_coef / c->lp.n_moe), dz = (float)(cfg->router_z_loss_coef / c->lp.n_moe);
    model_train_backward(&c->m, &c->a, c->targets, c->dlogp, daux, dz);
    return c->lp.ce_sum / (double)c->N + cfg->router_aux_loss_coef * c->lp.aux + cfg->router_z_loss_coef * c->lp.z;
}

Test(vision, vlm_loss_and_every_gradient_match_torch)
{
    Vlm c;
    vlm_open(&c, RECOMPUTE_NONE);
    cr_assert_eq(vision_tokens_per_image(&c.m.cfg), 25);
    const double loss = vlm_step(&c), want = fixture_attr(FX, "loss");
    /* float32 forward of a 2 + 2 layer model vs float64: ~1e-6 relative */
    cr_expect(fabs(loss - want) <= 2e-5 * fabs(want), "loss %.8f, torch %.8f", loss, want);
    size_t n;
    float *img = fixture_f32(FX, "img", &n);
    cr_assert_eq(n, c.va.R * c.m.d);
    /* image vectors: O(1) values through 2 encoder layers and the projector */
    EXPECT_CLOSE(c.va.out, img, n, 2e-5, 2e-5, "image vectors");
    float *logp = fixture_f32(FX, "logp", &n);
    EXPECT_CLOSE(c.a.logp, logp, n, 2e-5, 2e-5, "logp");
    size_t n_vis = 0, n_vis_w = 0;
    for (int i = 0; i < c.m.n_params; i++) {
        Param *p = &c.m.params[i];
        char name[160];
        snprintf(name, sizeof name, "g/%s", p->name);
        float *g = fixture_f32(FX, name, &n);
        const bool vis = !strncmp(p->name, "vision_tower/", 13) || !strncmp(p->name, "multi_modal_projector/", 22);
        n_vis += vis;
        n_vis_w += vis ? p->numel : 0;
        /* as tests/test_model.c: relative error of the tensor, then
         * elementwise against its scale */
        double num = 0, den = 0, gmax = 0;
        for (size_t j = 0; j < n; j++) {
            num += ((double)p->g[j] - g[j]) * ((double)p->g[j] - g[j]);
            den += (double)g[j] * g[j];
            gmax = fmax(gmax, fabs(g[j]));
        }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        if (gmax < 1e-12) {
            /* k_proj.bias: softmax does not see a bias shared by all keys, the
             * gradient is 0 (torch: ~1e-19); float32 rounding leaves ~5e-10 */
            EXPECT_CLOSE(p->g, g, n, 1e-8, 0, p->name);
            td_free(g);
            continue;
        }
        cr_expect(rel <= 1e-4 && isfinite(rel), "gradient %s relative error %.3g (|g|max %.3g)", p->name, rel, gmax);
        EXPECT_CLOSE(p->g, g, n, 2e-4 * gmax, 1e-3, p->name);
        td_free(g);
    }
    cr_expect_eq(n_vis, 9 + 16 * 2, "vision and projector tensors: %zu", n_vis);
    cr_expect_eq(n_vis_w, config_vision_param_count(&c.m.cfg), "vision parameters %zu, config_vision_param_count %zu",
                 n_vis_w, config_vision_param_count(&c.m.cfg));
    /* the placeholder's embedding row is replaced, so it gets no gradient */
    const float *ge = c.m.embed->g + (size_t)c.m.cfg.image_token_index * c.m.d;
    for (size_t j = 0; j < c.m.d; j++) cr_expect(ge[j] == 0.0f, "placeholder embedding gradient %zu = %g", j, ge[j]);
    td_free(img);
    td_free(logp);
    vlm_close(&c);
    EXPECT_NO_LEAKS();
}

Test(vision, recompute_modes_and_two_threads_give_the_same_bits)
{
    Vlm c[3];
    const Recompute modes[3] = { RECOMPUTE_NONE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE };
    for (int i = 0; i < 3; i++) {
        pool_init(i == 2 ? 2 : 1);
        vlm_open(&c[i], modes[i]);
        vlm_step(&c[i]);
    }
    pool_init(1);
    for (int i = 1; i < 3; i++) {
        EXPECT_BITWISE(c[i].a.logp, c[0].a.logp, c[0].N, i == 1 ? "recompute full: logp" : "selective, 2 threads: logp");
        EXPECT_BITWISE(c[i].m.g, c[0].m.g, c[0].m.n_w, i == 1 ? "recompute full: gradients" : "selective, 2 threads: gradients");
    }
    for (int i = 0; i < 3; i++) vlm_close(&c[i]);
    EXPECT_NO_LEAKS();
}

Test(vision, an_image_encoded_alone_gives_the_bits_of_the_batch)
{
    Vlm c;
    vlm_open(&c, RECOMPUTE_NONE);
    const size_t P = vision_tokens_per_image(&c.m.cfg), d = c.m.d, S = c.m.vis.S;
    float *both = td_malloc(2 * P * d * sizeof(float)), *one = td_malloc(P * d * sizeof(float));
    model_vision_encode(&c.m, c.pixels, 2, both);
    model_vision_encode(&c.m, c.pixels + 3 * S * S, 1, one);
    EXPECT_BITWISE(one, both + P * d, P * d, "image 1 alone vs in a batch of 2");
    pool_init(2);
    model_vision_encode(&c.m, c.pixels, 1, one);
    pool_init(1);
    EXPECT_BITWISE(one, both, P * d, "image 0 alone on 2 threads vs in a batch of 2");
    /* the trainer's forward puts the same vectors in the placeholder rows */
    model_train_forward(&c.m, &c.a, c.ids, c.targets, c.N, &c.lp);
    EXPECT_BITWISE(c.va.out, both, 2 * P * d, "model_vision_encode vs the trainer's forward");
    td_free(both);
    td_free(one);
    vlm_close(&c);
    EXPECT_NO_LEAKS();
}

Test(vision, config_keys_round_trip_and_bad_values_are_refused_by_name)
{
    ModelConfig c, r;
    char err[256];
    cr_assert(config_parse(&c, "{\"vocab_size\": 10, \"hidden_size\": 8, \"num_attention_heads\": 2, "
                           "\"image_token_index\": 9, \"vision_config\": {\"hidden_size\": 12, \"num_attention_heads\": 3, "
                           "\"image_size\": 32, \"patch_size\": 8, \"image_mean\": [0.1, 0.2, 0.3]}}", err, sizeof err) == 0,
              "%s", err);
    cr_expect_eq(c.vision_config.intermediate_size, 48, "default intermediate_size 4 x hidden_size");
    cr_expect_eq(vision_tokens_per_image(&c), 16);
    cr_expect(c.vision_config.image_mean[2] == 0.3 && c.vision_config.image_std[0] == 0.5);
    char *js = config_to_json(&c);
    cr_assert(config_parse(&r, js, err, sizeof err) == 0, "%s: %s", err, js);
    cr_expect(!memcmp(&r.vision_config, &c.vision_config, sizeof c.vision_config) && r.image_token_index == 9,
              "round trip: %s", js);
    td_free(js);
    static const struct { const char *json, *says; } bad[] = {
        { "{\"vision_config\": {\"hidden_size\": 8}}", "image_token_index" },
        { "{\"image_token_index\": 3}", "needs a \"vision_config\"" },
        { "{\"image_token_index\": 3, \"vision_config\": {\"image_size\": 30, \"patch_size\": 8}}", "patch_size" },
        { "{\"image_token_index\": 3, \"vision_config\": {\"hidden_size\": 10, \"num_attention_heads\": 4}}",
          "num_attention_heads" },
        { "{\"image_token_index\": 3, \"vision_config\": {\"colour\": 1}}", "unknown vision_config key \"colour\"" },
        { "{\"image_token_index\": 3, \"vision_config\": {\"image_std\": [1, 0, 1]}}", "image_std" },
        { "{\"image_token_index\": 3, \"vision_config\": {}, \"projector_hidden_act\": \"relu\"}", "projector_hidden_act" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        cr_expect(config_parse(&c, bad[i].json, err, sizeof err) != 0, "accepted %s", bad[i].json);
        cr_expect(strstr(err, bad[i].says) != NULL, "%s: error \"%s\" does not name %s", bad[i].json, err, bad[i].says);
    }
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ a tiny VLM learns from pixels */

#include "core/image/shapes.h"
#include "train/optim.h"

/* Tokens: colours 0..6, shapes 7..9, the question 10, the image
 * placeholder 11.  A sequence is the image's P placeholders, the question
 * "What color is the shape?", the answer; only the answer is scored. */
enum { TV_QCOLOR = 10, TV_IMG = 11 };

static void tv_sample(Rng *r, float *pixels, int32_t *ids, int32_t *targets, size_t P, size_t T, size_t S,
                      const float *mean, const float *std)
{
    Image im;
    Shape s;
    shapes_sample(r, &s);
    shapes_render(&s, &im);
    image_to_pixels(&im, S, mean, std, pixels);
    image_free(&im);
    for (size_t t = 0; t < T; t++) ids[t] = targets[t] = 0;
    for (size_t t = 0; t < P; t++) ids[t] = TV_IMG;
    ids[P] = TV_QCOLOR;
    targets[P] = s.color;
    ids[P + 1] = targets[P];
}

Test(vision, a_tiny_vlm_trained_on_shapes_names_the_colour_of_held_out_images, .timeout = 120)
{
    /* The whole path trains: the answer's gradient flows through the
     * language model into the placeholder rows, the projector and the tower
     * down to the patch embedding; the colour is only in the pixels (text
     * alone is right 1 time in 7).  The images are the shapes task's (64 x
     * 64, resized to 32).  Measured: 64/64 after 600 steps at lr 1e-3 on
     * questions mixed with shape ones; here colour only, 300 steps. */
    char err[256];
    ModelConfig cfg;
    cr_assert(config_parse(&cfg, "{\"vocab_size\": 12, \"hidden_size\": 32, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"first_k_dense_replace\": 1, "
                           "\"max_position_embeddings\": 80, \"image_token_index\": 11, \"vision_config\": "
                           "{\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 2, \"image_size\": 32, \"patch_size\": 4}}", err, sizeof err) == 0,
              "%s", err);
    Topology topo;
    topo_single(&topo, &cfg);
    Model m;
    model_init(&m, &cfg, &topo, true, 16);
    model_init_weights(&m, 5);
    const size_t B = 8, P = vision_tokens_per_image(&cfg), T = P + 2, N = B * T, S = m.vis.S, V = m.V;
    TrainActs a;
    VisionActs va;
    model_train_acts_init(&a, &m, B, T, RECOMPUTE_NONE);
    vision_acts_init(&va, &m, B);
    float mean[3], std[3];
    for (int c = 0; c < 3; c++) {
        mean[c] = (float)cfg.vision_config.image_mean[c];
        std[c] = (float)cfg.vision_config.image_std[c];
    }
    float *pixels = td_malloc(B * 3 * S * S * sizeof(float)), *dlogp = td_calloc(N * sizeof(float));
    float *m1 = td_calloc(m.n_w * sizeof(float)), *m2 = td_calloc(m.n_w * sizeof(float));
    int32_t *ids = td_malloc(N * sizeof(int32_t)), *targets = td_malloc(N * sizeof(int32_t));
    a.vis = &va;
    a.pixels = pixels;
    a.n_img = B;
    Rng r;
    rng_seed(&r, 1);
    const AdamHyper h = { 0.9, 0.95, 1e-8, 0.0 };
    const int steps = 300;
    for (int step = 1; step <= steps; step++) {
        for (size_t b = 0; b < B; b++)
            tv_sample(&r, pixels + b * 3 * S * S, ids + b * T, targets + b * T, P, T, S, mean, std);
        memset(m.g, 0, m.n_w * sizeof(float));
        model_train_forward(&m, &a, ids, targets, N, NULL);
        for (size_t b = 0; b < B; b++) dlogp[b * T + P] = -1.0f / (float)B;   /* the answers only */
        model_train_backward(&m, &a, targets, dlogp, 0.0f, 0.0f);
        adamw_step(&m, m1, m2, &h, step, 3e-3 * (step < 30 ? step / 30.0 : 1.0), 1.0f);
        model_pack(&m);
    }
    /* held-out images (another seed): the answer is the argmax at the question */
    rng_seed(&r, 99);
    int right = 0, total = 0;
    for (int round = 0; round < 8; round++) {
        for (size_t b = 0; b < B; b++)
            tv_sample(&r, pixels + b * 3 * S * S, ids + b * T, targets + b * T, P, T, S, mean, std);
        model_train_forward(&m, &a, ids, targets, N, NULL);
        for (size_t b = 0; b < B; b++) {
            const float *lg = a.logits + (b * T + P) * V;
            size_t best = 0;
            for (size_t v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
            right += (int32_t)best == targets[b * T + P];
            total++;
        }
    }
    cr_expect(right >= total * 95 / 100, "colour accuracy on held-out images %d/%d", right, total);
    model_train_acts_free(&a);
    vision_acts_free(&va);
    model_free(&m);
    td_free(pixels);
    td_free(dlogp);
    td_free(m1);
    td_free(m2);
    td_free(ids);
    td_free(targets);
    EXPECT_NO_LEAKS();
}

/* ------------------------------------------------------------ serving images (infer/engine.h) */

#include "infer/engine.h"

#define TV_MAX_STEPS 20000

static void engine_open(Engine *e, const Model *m)
{
    EngineOpts o;
    engine_opts_default(&o);
    o.max_running = 4;
    o.max_batch_tokens = 64;
    o.prefill_chunk = 16;   /* an image's 25 placeholders span prefill chunks and KV blocks */
    o.kv_budget_bytes = 40 * (size_t)m->cfg.num_hidden_layers * attn_block_bytes(&m->attn);
    engine_init(e, m, &o);
}

static Request *image_request(const int32_t *prompt, size_t n, const float *pixels, size_t n_img, int max_tokens)
{
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = max_tokens;
    gp.sp.temperature = 0;
    gp.sp.top_p = 1;
    gp.ignore_eos = true;
    Request *r = request_new(prompt, n, &gp);
    if (n_img) request_set_images(r, pixels, n_img);
    return r;
}

static bool drain(Engine *e)
{
    for (int s = 0; s < TV_MAX_STEPS; s++)
        if (engine_step(e) == 0) return true;
    return false;
}

Test(vision, image_requests_generate_the_trainer_forward_bits_alone_or_batched_with_text)
{
    Vlm c;
    vlm_open(&c, RECOMPUTE_NONE);
    const size_t T = c.T, S = c.m.vis.S, img_px = 3 * S * S, NT = 4;
    /* sequence 0 of the fixture (image 0's placeholders at 2..26) as a prompt */
    Engine e;
    engine_open(&e, &c.m);
    Request *alone = image_request(c.ids, T, c.pixels, 1, (int)NT);
    cr_assert_eq(engine_submit(&e, alone), 0, "%s", alone->error);
    cr_assert(drain(&e), "the image request did not end");
    cr_assert_eq(alone->n_out, NT);
    /* the same request beside a text request, itself with the other image,
     * and sequence 1 with its own image, all in one batch */
    Request *rs[4] = { image_request(c.ids + T, T, NULL, 0, (int)NT), image_request(c.ids, T, c.pixels, 1, (int)NT),
                       image_request(c.ids, T, c.pixels + img_px, 1, (int)NT),
                       image_request(c.ids + T, T, c.pixels + img_px, 1, (int)NT) };
    /* sequence 1 holds image placeholders: as a text request it is refused by name */
    cr_expect_eq(engine_submit(&e, rs[0]), -2, "placeholders without images accepted");
    cr_expect(rs[0]->refusal == ENGINE_BAD_IMAGE && strstr(rs[0]->error, "image placeholder"), "%s", rs[0]->error);
    request_free(rs[0]);
    int32_t text[T];
    for (size_t i = 0; i < T; i++) text[i] = (int32_t)(i * 7 % 60);
    rs[0] = image_request(text, T, NULL, 0, (int)NT);
    for (int i = 0; i < 4; i++) cr_assert_eq(engine_submit(&e, rs[i]), 0, "%s", rs[i]->error);
    cr_assert(drain(&e), "the batch did not end");
    cr_expect_arr_eq(rs[1]->out, alone->out, NT * sizeof(int32_t), "image request batched vs alone: tokens");
    cr_expect_arr_eq(rs[1]->out_logp, alone->out_logp, NT * sizeof(float), "image request batched vs alone: logp");
    /* the same tokens with another image: not the first image's cached keys */
    cr_expect(memcmp(rs[2]->out_logp, alone->out_logp, NT * sizeof(float)) != 0,
              "another image, same tokens: the same log-probabilities (image ignored or cache shared)");
    /* the trainer's forward over prompt + output scores the generated tokens
     * with the engine's bits: sequence 0 then (rs[3]) sequence 1 with image 1 */
    const Request *want[2] = { alone, rs[3] };
    const size_t TT = T + NT - 1;
    TrainActs a;
    VisionActs va;
    model_train_acts_init(&a, &c.m, 2, TT, RECOMPUTE_NONE);
    vision_acts_init(&va, &c.m, 2);
    int32_t *ids = td_malloc(2 * TT * sizeof(int32_t)), *tg = td_malloc(2 * TT * sizeof(int32_t));
    float *px = td_malloc(2 * img_px * sizeof(float));
    memcpy(px, c.pixels, img_px * sizeof(float));
    memcpy(px + img_px, c.pixels + img_px, img_px * sizeof(float));
    for (size_t b = 0; b < 2; b++)
        for (size_t t = 0; t < TT; t++) {
            const Request *r = want[b];
            ids[b * TT + t] = t < T ? r->prompt[t] : r->out[t - T];
            tg[b * TT + t] = t + 1 < T ? r->prompt[t + 1] : r->out[t + 1 - T];
        }
    a.vis = &va;
    a.pixels = px;
    a.n_img = 2;
    model_train_forward(&c.m, &a, ids, tg, 2 * TT, NULL);
    for (size_t b = 0; b < 2; b++)
        cr_expect_arr_eq(a.logp + b * TT + T - 1, want[b]->out_logp, NT * sizeof(float),
                         "sequence %zu: the trainer's log-probabilities of the generated tokens", b);
    model_train_acts_free(&a);
    vision_acts_free(&va);
    td_free(ids);
    td_free(tg);
    td_free(px);
    for (int i = 0; i < 4; i++) request_free(rs[i]);
    request_free(alone);
    /* an image for a prompt without placeholders, two images for one image's */
    Request *bad[2] = { image_request(text, T, c.pixels, 1, 1), image_request(c.ids, T, c.pixels, 2, 1) };
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(engine_submit(&e, bad[i]), -2, "bad image request %d accepted", i);
        cr_expect_eq(bad[i]->refusal, ENGINE_BAD_IMAGE, "%s", bad[i]->error);
        cr_expect(strstr(bad[i]->error, "image placeholder tokens (id 63)") != NULL, "%s", bad[i]->error);
        request_free(bad[i]);
    }
    engine_free(&e);
    vlm_close(&c);
    EXPECT_NO_LEAKS();
}
