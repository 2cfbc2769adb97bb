/* tests/test_config.c - model configs (core/model/config.h): the sizes of
 * today's largest open MoE models validate, and only what would overflow
 * (an int matrix dimension, size_t byte counts) is refused.  Nothing here
 * allocates a model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/model/config.h"

static int parse(ModelConfig *c, const char *js, char *err, size_t n) { return config_parse(c, js, err, n); }

/* Parameters of the tandem model (SPEC section 2) counted tensor by
 * tensor, as the checkpoint schema (SPEC section 4) lists them. */
static double count(double V, double d, double L, double H, double Hkv, double hd, double Fd, double F, double E,
                    double S, double dense, int tied)
{
    double embed = V * d, head = tied ? 0 : V * d, norm = d;
    double attn = d + H * hd * d + 2 * Hkv * hd * d + d * H * hd + d;   /* two norms, q k v o */
    double mlp_dense = 3 * Fd * d;
    double mlp_moe = E * d + 2 * E * F * d + E * d * F + (S > 0 ? 3 * S * F * d : 0);
    return embed + head + norm + L * attn + dense * mlp_dense + (L - dense) * mlp_moe;
}

/* DeepSeek-V3 (671B with MLA; tandem's config has grouped-query attention
 * in its place): E = 256, F = 2048, d = 7168.  E F d = 3.76e9 per
 * stacked expert tensor, which the old "E*F*d < 2e9" check refused. */
Test(config, deepseek_v3_sizes_validate)
{
    const char *js = "{\"vocab_size\": 129280, \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
                     " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"head_dim\": 128,"
                     " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_local_experts\": 256,"
                     " \"num_experts_per_tok\": 8, \"n_shared_experts\": 1, \"first_k_dense_replace\": 3,"
                     " \"max_position_embeddings\": 163840, \"rope_theta\": 10000}";
    ModelConfig c;
    char err[256] = "";
    cr_assert_eq(parse(&c, js, err, sizeof err), 0, "refused: %s", err);
    double want = count(129280, 7168, 61, 128, 128, 128, 18432, 2048, 256, 1, 3, 0);
    cr_assert_eq((double)config_param_count(&c), want, "%zu parameters, counted %.0f", config_param_count(&c), want);
    cr_assert(want > 6e11, "%.3g: the test model is not DeepSeek-sized", want);
}

/* Kimi-K2: E = 384, F = 2048, d = 7168 (over 1e12 parameters). */
Test(config, kimi_k2_sizes_validate)
{
    const char *js = "{\"vocab_size\": 163840, \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
                     " \"num_attention_heads\": 64, \"num_key_value_heads\": 64, \"head_dim\": 128,"
                     " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_local_experts\": 384,"
                     " \"num_experts_per_tok\": 8, \"n_shared_experts\": 1, \"first_k_dense_replace\": 1,"
                     " \"max_position_embeddings\": 131072}";
    ModelConfig c;
    char err[256] = "";
    cr_assert_eq(parse(&c, js, err, sizeof err), 0, "refused: %s", err);
    double want = count(163840, 7168, 61, 64, 64, 128, 18432, 2048, 384, 1, 1, 0);
    cr_assert_eq((double)config_param_count(&c), want);
    cr_assert(want > 1e12, "%.3g", want);
}

/* What does overflow is refused, naming it. */
Test(config, refuses_what_overflows)
{
    struct {
        const char *js, *want;
    } cases[] = {
        /* 4 * hidden_size, the default intermediate_size, beyond an int */
        { "{\"hidden_size\": 900000000, \"num_attention_heads\": 3515625, \"head_dim\": 256}",
          "\"intermediate_size\" and \"moe_intermediate_size\" must be in [0, 2147483647]" },
        /* q_proj has H * hd rows: a GEMM dimension */
        { "{\"hidden_size\": 64, \"num_attention_heads\": 16777216, \"head_dim\": 256}",
          "num_attention_heads x head_dim = 4294967296 exceeds 2147483647" },
        { "{\"hidden_size\": 64, \"num_attention_heads\": 1, \"moe_intermediate_size\": 1000000000,"
          " \"n_shared_experts\": 4, \"num_local_experts\": 2}",
          "the shared experts' width 4000000000 exceeds" },
        /* E F d far past what size_t byte counts hold */
        { "{\"hidden_size\": 1000000, \"num_attention_heads\": 8, \"head_dim\": 8, \"num_local_experts\": 1000000000,"
          " \"moe_intermediate_size\": 1000000000}",
          "parameters; this build addresses at most 2^58" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ModelConfig c;
        char err[256] = "";
        cr_assert_eq(parse(&c, cases[i].js, err, sizeof err), -1, "case %zu accepted", i);
        cr_assert(strstr(err, cases[i].want), "case %zu: \"%s\" does not say \"%s\"", i, err, cases[i].want);
    }
}

/* rope_scaling (HF's object; core/ops/rope.h): yarn and linear parse into
 * the struct, write back through config_to_json to the same config, and an
 * absent original_max_position_embeddings takes the context; null and
 * "default" are no scaling; other types and keys are refused by name. */
Test(config, rope_scaling_yarn_round_trips)
{
    ModelConfig c, back;
    char err[256] = "";
    cr_assert_eq(parse(&c, "{\"max_position_embeddings\": 2048, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8,"
                           " \"beta_fast\": 16, \"mscale\": 0.707, \"mscale_all_dim\": 1, \"truncate\": false}}",
                       err, sizeof err), 0, "%s", err);
    const RopeScaling *r = &c.rope_scaling;
    cr_expect(r->type == ROPE_SCALING_YARN && r->factor == 8 && r->beta_fast == 16 && r->beta_slow == 0 &&
              r->mscale == 0.707 && r->mscale_all_dim == 1 && r->no_truncate &&
              r->original_max_position_embeddings == 2048, "parsed yarn");
    cr_expect_float_eq(rope_softmax_scale_factor(r), (0.1 * log(8.0) + 1) * (0.1 * log(8.0) + 1), 1e-12);
    char *js = config_to_json(&c);
    cr_assert_eq(parse(&back, js, err, sizeof err), 0, "%s: %s", err, js);
    cr_expect(!memcmp(&back.rope_scaling, &c.rope_scaling, sizeof c.rope_scaling), "round trip: %s", js);
    td_free(js);
    cr_assert_eq(parse(&c, "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", err, sizeof err), 0, "%s", err);
    cr_expect(c.rope_scaling.type == ROPE_SCALING_LINEAR && c.rope_scaling.factor == 2);
    cr_assert_eq(parse(&c, "{\"rope_scaling\": {\"type\": \"default\"}}", err, sizeof err), 0, "%s", err);
    cr_expect(c.rope_scaling.type == ROPE_SCALING_NONE);
    cr_assert_eq(parse(&c, "{\"rope_scaling\": null}", err, sizeof err), 0, "%s", err);
    static const struct { const char *js, *want; } bad[] = {
        { "{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}}", "rope_scaling type \"dynamic\" is not supported" },
        { "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2, \"beta_fast\": 3}}",
          "rope_scaling key \"beta_fast\" is not supported for type \"linear\"" },
        { "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0}}", "needs a \"factor\" > 0" },
        { "{\"rope_scaling\": {\"type\": \"yarn\", \"rope_type\": \"linear\", \"factor\": 2}}", "both alike" },
        { "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, \"original_max_position_embeddings\": 10.5}}",
          "rope_scaling.original_max_position_embeddings must be a number >= 0 (an integer)" },
        { "{\"rope_scaling\": 4}", "\"rope_scaling\" must be an object or null" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        cr_expect(parse(&c, bad[i].js, err, sizeof err) != 0 && strstr(err, bad[i].want), "case %zu: wanted \"%s\", got \"%s\"",
                  i, bad[i].want, err);
    }
}

/* DeepSeek-V3 with its multi-head latent attention (HF config.json shapes):
 * the MLA tensors counted by hand, 671e9 parameters in all (the published
 * size, the MTP layer not included); head_dim derived as HF does. */
Test(config, deepseek_v3_mla_sizes_validate)
{
    const char *js = "{\"vocab_size\": 129280, \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
                     " \"num_attention_heads\": 128, \"num_key_value_heads\": 128,"
                     " \"q_lora_rank\": 1536, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128,"
                     " \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"rope_interleave\": true,"
                     " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_local_experts\": 256,"
                     " \"num_experts_per_tok\": 8, \"n_shared_experts\": 1, \"first_k_dense_replace\": 3,"
                     " \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-6}";
    ModelConfig c;
    char err[256] = "";
    cr_assert_eq(parse(&c, js, err, sizeof err), 0, "refused: %s", err);
    cr_assert_eq(c.head_dim, 64, "head_dim %d, want qk_rope_head_dim", c.head_dim);
    cr_assert(config_mla(&c));
    const double d = 7168, H = 128;
    const double mla = 1536 * d + 1536 + H * 192 * 1536 + 576 * d + 512 + H * 256 * 512 + d * H * 128;
    const double ordinary = count(129280, d, 61, H, H, 128, 18432, 2048, 256, 1, 3, 0);
    const double gqa = d + H * 128 * d + 2 * H * 128 * d + d * H * 128 + d;   /* what count() put per layer */
    const double want = ordinary - 61 * gqa + 61 * (2 * d + mla);
    cr_assert_eq((double)config_param_count(&c), want, "%zu parameters, counted %.0f", config_param_count(&c), want);
    cr_assert(fabs(want - 671.0e9) < 0.5e9, "%.4g parameters, DeepSeek-V3 has 671e9", want);
}

/* MLA's keys refused when they do not make a model, naming the key. */
Test(config, refuses_inconsistent_mla_keys)
{
    static const char *const base = "\"hidden_size\": 64, \"num_attention_heads\": 4, \"kv_lora_rank\": 16, "
                                    "\"qk_nope_head_dim\": 8, \"v_head_dim\": 8";
    struct {
        const char *extra, *want;
    } cases[] = {
        { ", \"qk_rope_head_dim\": 5", "\"qk_rope_head_dim\" must be even" },
        { ", \"qk_rope_head_dim\": 8, \"num_key_value_heads\": 2", "\"num_key_value_heads\" (2) must equal" },
        { ", \"qk_rope_head_dim\": 8, \"head_dim\": 16", "\"head_dim\" (16) must equal \"qk_rope_head_dim\" (8)" },
        { ", \"qk_rope_head_dim\": 8, \"qk_norm\": \"head\"", "not defined for MLA" },
        { ", \"qk_rope_head_dim\": 8, \"kv_lora_rank\": 1020", "exceeds 1024" },
        { ", \"qk_rope_head_dim\": 8, \"v_head_dim\": 0", "\"v_head_dim\" must be >= 1" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char js[512];
        snprintf(js, sizeof js, "{%s%s}", base, cases[i].extra);
        ModelConfig c;
        char err[256] = "";
        cr_assert_eq(parse(&c, js, err, sizeof err), -1, "case %zu accepted: %s", i, js);
        cr_assert(strstr(err, cases[i].want), "case %zu: \"%s\" does not say \"%s\"", i, err, cases[i].want);
    }
    ModelConfig c;
    char err[256] = "";
    cr_assert_eq(parse(&c, "{\"q_lora_rank\": 8}", err, sizeof err), -1, "q_lora_rank without MLA accepted");
    cr_assert(strstr(err, "\"q_lora_rank\" needs \"kv_lora_rank\" > 0"), "%s", err);
}

/* The DeepSeek-V3 router keys: each impossible or unsupported value is
 * refused in one line naming its key. */
Test(config, refuses_bad_v3_router_keys)
{
#define V3 "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
    struct {
        const char *js, *want;
    } cases[] = {
        { "{" V3 "\"topk_method\": \"group_limited_greedy\", \"scoring_func\": \"sigmoid\"}",
          "\"topk_method\" \"group_limited_greedy\" is not supported (\"greedy\" | \"noaux_tc\")" },
        { "{" V3 "\"scoring_func\": \"softmax2\"}", "\"scoring_func\" \"softmax2\" is not supported" },
        { "{" V3 "\"scoring_func\": 1}", "\"scoring_func\" must be a string" },
        { "{" V3 "\"topk_method\": \"noaux_tc\"}", "\"topk_method\" \"noaux_tc\" needs \"scoring_func\" \"sigmoid\"" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 3}",
          "\"n_group\" (3) must divide num_local_experts (8)" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 0}",
          "\"n_group\" must be in [1, num_local_experts = 8] (got 0)" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 4, \"topk_group\": 5}",
          "\"topk_group\" must be in [1, n_group = 4] (got 5)" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 8}",
          "\"n_group\" 8 leaves one expert per group" },
        { "{\"num_local_experts\": 8, \"num_experts_per_tok\": 3, \"scoring_func\": \"sigmoid\", "
          "\"topk_method\": \"noaux_tc\", \"n_group\": 4, \"topk_group\": 1}",
          "\"num_experts_per_tok\" (3) exceeds the experts of the topk_group = 1 kept groups (2)" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"n_group\": 2}", "need \"topk_method\" \"noaux_tc\"" },
        { "{" V3 "\"routed_scaling_factor\": 2.5}", "\"routed_scaling_factor\" 2.5 needs \"scoring_func\" \"sigmoid\"" },
        { "{" V3 "\"scoring_func\": \"sigmoid\", \"routed_scaling_factor\": 0}", "\"routed_scaling_factor\" must be > 0" },
        { "{" V3 "\"moe_layer_freq\": 0}", "\"moe_layer_freq\" must be >= 1 (got 0)" },
    };
#undef V3
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ModelConfig c;
        char err[256] = "";
        cr_expect_eq(parse(&c, cases[i].js, err, sizeof err), -1, "accepted: %s", cases[i].js);
        cr_expect(strstr(err, cases[i].want) != NULL, "%s: error \"%s\", want \"%s\"", cases[i].js, err, cases[i].want);
        cr_expect(strchr(err, '\n') == NULL, "more than one line: %s", err);
    }
}

/* DeepSeek's layer schedule: MoE iff l >= first_k_dense_replace and
 * l % moe_layer_freq == 0; with the V3 router keys round-tripping. */
Test(config, v3_layer_schedule_and_round_trip)
{
    ModelConfig c, d;
    char err[256] = "";
    const char *js = "{\"num_hidden_layers\": 7, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2, "
                     "\"num_local_experts\": 8, \"num_experts_per_tok\": 3, \"scoring_func\": \"sigmoid\", "
                     "\"topk_method\": \"noaux_tc\", \"n_group\": 4, \"topk_group\": 2, "
                     "\"routed_scaling_factor\": 2.5}";
    cr_assert_eq(parse(&c, js, err, sizeof err), 0, "refused: %s", err);
    static const bool moe[7] = { false, false, true, false, true, false, true };
    for (int l = 0; l < 7; l++) cr_expect_eq(config_layer_is_moe(&c, l), moe[l], "layer %d", l);
    cr_expect_eq(config_n_moe_layers(&c), 3);
    cr_expect(config_router_bias(&c));
    char *j = config_to_json(&c);
    cr_assert_eq(parse(&d, j, err, sizeof err), 0, "round trip refused: %s", err);
    cr_expect(d.scoring_func == ROUTER_SIGMOID && d.topk_method == TOPK_NOAUX_TC && d.n_group == 4 &&
              d.topk_group == 2 && d.routed_scaling_factor == 2.5 && d.moe_layer_freq == 2, "round trip: %s", j);
    td_free(j);
    /* the defaults: softmax, greedy, no bias */
    cr_assert_eq(parse(&c, "{}", err, sizeof err), 0, "%s", err);
    cr_expect(c.scoring_func == ROUTER_SOFTMAX && c.topk_method == TOPK_GREEDY && !config_router_bias(&c));
}

/* Sliding windows per layer: Mistral/Mixtral (sliding_window alone: every
 * layer), Qwen2 (use_sliding_window false: none; true: layers >=
 * max_window_layers), layer_types (as listed, and only with an active
 * window: HF nulls sliding_window without use_sliding_window); bad values
 * refused by name; the keys round-trip. */
Test(config, sliding_window_layers_follow_the_hf_rules)
{
    ModelConfig c, d;
    char err[256] = "";
    cr_assert_eq(parse(&c, "{\"num_hidden_layers\": 4}", err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&c, l), 0, "default: no window");
    cr_assert_eq(parse(&c, "{\"num_hidden_layers\": 4, \"sliding_window\": 24}", err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&c, l), 24, "Mistral: layer %d", l);
    cr_assert_eq(parse(&c, "{\"num_hidden_layers\": 4, \"sliding_window\": 24, \"use_sliding_window\": false, "
                           "\"max_window_layers\": 2}", err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&c, l), 0, "Qwen2 off: layer %d", l);
    cr_assert_eq(parse(&c, "{\"num_hidden_layers\": 4, \"sliding_window\": 24, \"use_sliding_window\": true, "
                           "\"max_window_layers\": 2}", err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&c, l), l >= 2 ? 24 : 0, "Qwen2 on: layer %d", l);
    const char *lt = "{\"num_hidden_layers\": 4, \"sliding_window\": 8, \"max_window_layers\": 3, \"layer_types\": "
                     "[\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]}";
    cr_assert_eq(parse(&c, lt, err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&c, l), l % 2 ? 0 : 8, "layer_types: layer %d", l);
    char *j = config_to_json(&c);
    cr_assert_eq(parse(&d, j, err, sizeof err), 0, "round trip refused: %s", err);
    for (int l = 0; l < 4; l++) cr_expect_eq(config_layer_window(&d, l), config_layer_window(&c, l), "round trip: %s", j);
    td_free(j);
    static const struct { const char *js, *want; } bad[] = {
        { "{\"sliding_window\": 0}", "\"sliding_window\" must be an integer >= 1 or null" },
        { "{\"sliding_window\": 4.5}", "\"sliding_window\" must be an integer >= 1 or null" },
        { "{\"max_window_layers\": -1}", "\"max_window_layers\" must be >= 0" },
        { "{\"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\"]}", "\"layer_types\" lists 1 layers, the model has 2" },
        { "{\"num_hidden_layers\": 1, \"layer_types\": [\"chunked_attention\"]}", "\"layer_types\"[0] must be" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        cr_expect_neq(parse(&c, bad[i].js, err, sizeof err), 0, "accepted %s", bad[i].js);
        cr_expect(strstr(err, bad[i].want), "%s: got \"%s\", want \"%s\"", bad[i].js, err, bad[i].want);
    }
}
