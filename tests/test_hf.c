/* tests/test_hf.c - the Hugging Face mapping (checkpoint/hf/: families,
 * hf_config, hf_map, hf_load, hf_export) in one process, on the reference's
 * checkpoints of tests/ref/fixtures_safetensors.py (a sharded v5 bf16
 * Qwen2-MoE, a v4 f32 Mixtral): name patterns; every family's table maps
 * every parameter of its config in both layouts; slices read through the
 * mapping (a tp box of a fused v5 gate_up, an ep range of a v4 stack, raw
 * bf16) equal the same box of the whole tensor; import -> export gives the
 * HF files' bytes back; configs written for a family read back as the same
 * model, a tandem-native config finds its family or is refused; the
 * tokenizer of an HF dir and of its import encode alike.  The command-level
 * comparisons with PyTorch are tests/cli/hf_import.sh; this suite runs
 * under ASan + UBSan (make asan-test).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/hf/families.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/hf_export.h"
#include "checkpoint/hf/hf_load.h"
#include "checkpoint/hf/hf_map.h"
#include "core/common.h"
#include "core/dtype.h"
#include "core/pool.h"
#include "core/tok/tokenizer.h"
#include "tests/fixture.h"

static char g_dir[256];

static void setup(void)
{
    pool_init(2);
    snprintf(g_dir, sizeof g_dir, "/tmp/tandem_test_hf_XXXXXX");
    if (!mkdtemp(g_dir)) g_dir[0] = 0;
}

static void teardown(void)
{
    pool_free();
    if (!g_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_hf: cannot remove %s\n", g_dir);
}

TestSuite(hf, .init = setup, .fini = teardown);

static const char *tmp(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

/* prefix + name (static buffer). */
static const char *tmp_name(const char *prefix, const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s%s", prefix, name);
    return p;
}

static void open_ok(HfModel *h, const char *dir)
{
    char err[1024];
    cr_assert(hf_model_open(h, dir, err, sizeof err) == 0, "%s", err);
}

/* ---------------------------------------------------------------- patterns */

Test(hf, patterns)
{
    char out[128];
    cr_assert(hf_pattern_fill(out, sizeof out, "model.layers.{L}.mlp.experts.{E}.w1.weight", 12, 7) == 0);
    cr_expect_str_eq(out, "model.layers.12.mlp.experts.7.w1.weight");
    cr_expect(hf_pattern_fill(out, 10, "model.layers.{L}.x", 3, 0) != 0, "does not fit");
    int l = -1, e = -1;
    cr_expect(hf_pattern_match("model.layers.{L}.mlp.experts.{E}.w1.weight", "model.layers.3.mlp.experts.17.w1.weight",
                               4, &l, &e) && l == 3 && e == 17);
    cr_expect(!hf_pattern_match("model.layers.{L}.x", "model.layers.4.x", 4, NULL, NULL), "{L} below num_hidden_layers");
    cr_expect(!hf_pattern_match("model.layers.{L}.x", "model.layers.03.x", 8, NULL, NULL), "no leading zeros");
    cr_expect(!hf_pattern_match("model.layers.{L}.x", "model.layers..x", 8, NULL, NULL));
    cr_expect(hf_pattern_match("model.layers.{N}.*", "model.layers.61.eh_proj.weight", 61, &l, NULL) && l == 61,
              "{N}: the layer past the model (DeepSeek-V3's MTP)");
    cr_expect(!hf_pattern_match("model.layers.{N}.*", "model.layers.60.eh_proj.weight", 61, NULL, NULL));
    cr_expect(hf_family_find("OlmoeForCausalLM") && !hf_family_find("LlamaForCausalLM"));
}

/* ---------------------------------------------------------------- tables */

/* Every family's rows map every parameter of a config that turns all its
 * options on, in every layout it has. */
Test(hf, every_parameter_has_a_row)
{
    static const char *const cfgs[] = {
        "{\"architectures\":[\"MixtralForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":16,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_local_experts\":4,\"vocab_size\":40,\"tie_word_embeddings\":true,"
        "\"max_position_embeddings\":64}",
        "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":16,\"moe_intermediate_size\":8,"
        "\"shared_expert_intermediate_size\":12,\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"head_dim\":12,"   /* != d / H: written back too (the config fuzzer found it dropped) */
        "\"num_experts\":4,\"num_experts_per_tok\":2,\"mlp_only_layers\":[1],\"vocab_size\":40,\"max_position_embeddings\":64}",
        "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":16,\"moe_intermediate_size\":8,"
        "\"head_dim\":12,\"attention_bias\":true,\"decoder_sparse_step\":2,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":2,\"vocab_size\":40,\"max_position_embeddings\":64}",
        "{\"architectures\":[\"OlmoeForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":16,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4,\"attention_bias\":true,\"clip_qkv\":2.0,\"num_experts\":4,\"num_experts_per_tok\":2,"
        "\"vocab_size\":40,\"max_position_embeddings\":64}",
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        HfConfig hc;
        char err[512];
        cr_assert(hf_config_parse(&hc, cfgs[c], "config.json", err, sizeof err) == 0, "%s", err);
        Topology t;
        topo_single(&t, &hc.cfg);
        Param *ps;
        int np = model_param_table(&hc.cfg, &t, &ps);
        for (int lay = HF_V4; lay <= HF_V5; lay <<= 1)
            for (int i = 0; i < np; i++) {
                int layer;
                cr_expect(hf_rule_for(hc.fam, (HfLayout)lay, ps[i].name, &layer) != NULL, "%s %s: no row for %s",
                          hc.fam->architecture, lay == HF_V4 ? "v4" : "v5", ps[i].name);
            }
        /* what the config says, written for the family and read back, is the same model */
        char *text = hf_config_write(hc.fam, &hc.cfg, HF_V5, "bfloat16", "{\"eos_token_id\": 7}", err, sizeof err);
        cr_assert(text, "%s", err);
        HfConfig back;
        cr_assert(hf_config_parse(&back, text, "written", err, sizeof err) == 0, "%s: %s", err, text);
        char why[256] = "";
        cr_expect(hf_config_same_math(&hc.cfg, &back.cfg, why, sizeof why), "%s: %s", hc.fam->architecture, why);
        cr_expect(strstr(text, "\"eos_token_id\": 7") && strstr(text, "\"rope_parameters\": {") &&
                      strstr(text, "\"dtype\": \"bfloat16\""),
                  "v5 config with the generation ids: %s", text);
        char note[256];
        const HfFamily *f = hf_config_family_of(&hc.cfg, note, sizeof note, err, sizeof err);
        cr_expect(f == hc.fam, "%s: the model is expressed by %s (%s)", hc.fam->architecture,
                  f ? f->architecture : "none", f ? "" : err);
        td_free(text);
        td_free(ps);
        hf_config_free(&back);
        hf_config_free(&hc);
    }
}

Test(hf, config_refusals_name_the_key)
{
    static const struct { const char *json, *want; } cases[] = {
        { "{\"architectures\":[\"GPT2LMHeadModel\"]}", "architecture \"GPT2LMHeadModel\" is not supported" },
        { "{\"model_type\":\"mixtral\"}", "architectures (absent) does not name an architecture" },
        { "{\"architectures\":[\"MixtralForCausalLM\"],\"sliding_window\":0,\"max_position_embeddings\":512}",
          "\"sliding_window\" must be an integer >= 1 or null" },
        { "{\"architectures\":[\"MixtralForCausalLM\"],\"sliding_window\":512,\"max_position_embeddings\":512,"
          "\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}}", "rope_scaling type \"dynamic\" is not supported" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1e6,"
          "\"partial_rotary_factor\":0.5}}", "rope_parameters key \"partial_rotary_factor\" (0.5) is not supported" },
        { "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"layer_types\":[\"full_attention\"],\"num_hidden_layers\":2}",
          "\"layer_types\" lists 1 layers, the model has 2" },
        { "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"num_key_value_heads\":16,\"num_hidden_layers\":2,"
          "\"rope_theta\":1e4,\"rope_parameters\":{\"rope_theta\":5e5}}", "rope_theta 10000 and rope_parameters.rope_theta 500000 disagree" },
        { "{\"architectures\":[\"OlmoeForCausalLM\"],\"hidden_act\":\"relu\"}", "hidden_act \"relu\" is not supported" },
        { "{\"architectures\":[\"OlmoeForCausalLM\"],\"vocab_size\":null}", "vocab_size must not be null" },
        /* rope_scaling (issue 16): yarn and linear are computed, others refused by name */
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"rope_scaling\":{\"type\":\"longrope\",\"factor\":2}}",
          "rope_scaling type \"longrope\" is not supported" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"rope_scaling\":{\"rope_type\":\"yarn\"}}",
          "rope_scaling type \"yarn\" needs a \"factor\" > 0" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4,\"low_freq_factor\":1}}",
          "rope_scaling key \"low_freq_factor\" is not supported for type \"yarn\"" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"rope_parameters\":{\"rope_type\":\"dynamic\",\"rope_theta\":1e6,"
          "\"factor\":2}}", "rope_scaling type \"dynamic\" is not supported" },
        /* quantization_config: fp8 e4m3 dynamic block-scaled only */
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4}}",
          "quantization_config (quant_method \"awq\"): quantized checkpoints are not supported" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}}",
          "quantization_config fmt \"e5m2\" is not supported" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"quantization_config\":{\"quant_method\":\"fp8\","
          "\"activation_scheme\":\"static\"}}", "quantization_config activation_scheme \"static\" is not supported" },
        { "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"quantization_config\":{\"quant_method\":\"fp8\","
          "\"weight_block_size\":[128]}}", "quantization_config weight_block_size [128] is not two block sizes" },
        { "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v2\"}",
          "model_type \"deepseek_v2\" does not match DeepseekV3ForCausalLM" },
        { "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":true}",
          "attention_bias true is not supported for DeepseekV3ForCausalLM" },
        { "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"kv_lora_rank\":0}",
          "kv_lora_rank 0 must be > 0 for DeepseekV3ForCausalLM" },
        { "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"topk_method\":\"greedy\"}",
          "topk_method \"greedy\" is not supported for DeepseekV3ForCausalLM (it computes \"noaux_tc\")" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        HfConfig hc;
        char err[512] = "";
        cr_expect(hf_config_parse(&hc, cases[i].json, "cfg", err, sizeof err) != 0 && strstr(err, cases[i].want),
                  "case %zu: wanted \"%s\", got \"%s\"", i, cases[i].want, err);
        cr_expect(!hc.fam && !hc.text, "nothing kept after a refusal");
        hf_config_free(&hc);
    }
    /* a tandem model no family expresses: refused naming each family's obstacle */
    ModelConfig c;
    char err[1024];
    cr_assert(config_parse(&c, "{\"hidden_size\":32,\"num_attention_heads\":4,\"first_k_dense_replace\":1,\"n_shared_experts\":1,"
                               "\"num_local_experts\":4,\"vocab_size\":40,\"max_position_embeddings\":64}", err, sizeof err) == 0, "%s", err);
    cr_expect(!hf_config_family_of(&c, NULL, 0, err, sizeof err) &&
                  strstr(err, "no Hugging Face family expresses this model (MixtralForCausalLM: "),
              "%s", err);
}

/* ---------------------------------------------------------------- slices */

/* Every binding of the directory: a box (the second half of dim 0 and the
 * middle of dim 1, as a tp/ep rank would own) read through the mapping
 * equals that box cut out of the whole tensor; raw 16-bit reads upcast to
 * the float32 ones. */
static void check_slices(const char *dir)
{
    HfModel h;
    open_ok(&h, dir);
    char err[512];
    int n_checked = 0;
    for (int i = 0; i < h.n_b; i++) {
        const HfBinding *b = &h.b[i];
        size_t numel = 1, zero[3] = { 0 };
        for (int d = 0; d < b->ndim; d++) numel *= b->shape[d];
        float *whole = td_malloc(numel * sizeof(float));
        cr_assert(hf_read_box(&h, b, zero, b->shape, whole, false, err, sizeof err) == 0, "%s", err);
        if (b->dtype == ST_BF16) {
            uint16_t *raw = td_malloc(numel * 2);
            cr_assert(hf_read_box_serial(&h, b, zero, b->shape, raw, true, err, sizeof err) == 0, "%s", err);
            size_t bad = 0;
            for (size_t k = 0; k < numel; k++) bad += dtype_f32_from_bf16(raw[k]) != whole[k];
            cr_expect(bad == 0, "%s: %zu raw values differ from the float32 read", b->tandem, bad);
            td_free(raw);
        }
        if (b->ndim >= 2) {
            size_t off[3] = { 0 }, cnt[3];
            for (int d = 0; d < b->ndim; d++) cnt[d] = b->shape[d];
            off[0] = b->shape[0] / 2;
            cnt[0] = b->shape[0] - off[0];
            off[1] = b->shape[1] / 4;
            cnt[1] = b->shape[1] / 2 ? b->shape[1] / 2 : 1;
            size_t bn = cnt[0] * cnt[1] * (b->ndim > 2 ? cnt[2] : 1);
            float *box = td_malloc(bn * sizeof(float));
            cr_assert(hf_read_box(&h, b, off, cnt, box, false, err, sizeof err) == 0, "%s", err);
            size_t inner = b->ndim > 2 ? b->shape[2] : 1, bad = 0, k = 0;
            for (size_t a = 0; a < cnt[0]; a++)
                for (size_t c = 0; c < cnt[1]; c++)
                    for (size_t e = 0; e < inner; e++, k++)
                        bad += box[k] != whole[((off[0] + a) * b->shape[1] + off[1] + c) * inner + e];
            cr_expect(bad == 0, "%s: %zu of %zu values of the box differ", b->tandem, bad, bn);
            td_free(box);
            n_checked++;
        }
        td_free(whole);
    }
    cr_expect(n_checked > 5);
    hf_model_close(&h);
    hf_model_close(&h);   /* safe twice */
}

Test(hf, slices_of_a_v5_fused_bf16_checkpoint)
{
    HfModel h;
    open_ok(&h, fixture_path("st_hf_q2"));
    cr_expect(h.layout == HF_V5 && h.hc.fam == hf_family_find("Qwen2MoeForCausalLM"));
    const HfBinding *b = hf_model_find(&h, "model/layers/0/mlp/experts/up_proj");
    cr_assert(b && b->rule->how == HFT_PART && b->rule->part == 1 && b->dtype == ST_BF16);
    hf_model_close(&h);
    check_slices(fixture_path("st_hf_q2"));
}

Test(hf, slices_of_a_v4_stacked_f32_checkpoint)
{
    HfModel h;
    open_ok(&h, fixture_path("st_hf_mx"));
    const HfBinding *b = hf_model_find(&h, "model/layers/1/mlp/experts/down_proj");
    cr_assert(h.layout == HF_V4 && b && b->rule->how == HFT_STACK && b->n_src == (int)b->shape[0]);
    cr_expect_str_eq(b->src[2]->name, "model.layers.1.block_sparse_moe.experts.2.w2.weight");
    hf_model_close(&h);
    check_slices(fixture_path("st_hf_mx"));
}

/* ---------------------------------------------------------------- import / export */

static void same_files(const char *a, const char *b)
{
    StCheckpoint sa, sb;
    char err[512];
    cr_assert(st_open(&sa, a, err, sizeof err) == 0, "%s", err);
    cr_assert(st_open(&sb, b, err, sizeof err) == 0, "%s", err);
    cr_assert_eq(sa.n_tensors, sb.n_tensors);
    for (size_t i = 0; i < sa.n_tensors; i++) {
        const StTensor *x = &sa.tensors[i], *y = st_find(&sb, x->name);
        cr_assert(y, "%s is missing from the export", x->name);
        cr_expect(x->dtype == y->dtype && x->ndim == y->ndim && !memcmp(x->shape, y->shape, sizeof x->shape) &&
                      x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes),
                  "%s differs", x->name);
    }
    st_close(&sa);
    st_close(&sb);
}

Test(hf, import_then_export_gives_the_files_back)
{
    const char *src[2] = { fixture_path("st_hf_q2"), NULL };
    char dirs[2][512];
    snprintf(dirs[0], sizeof dirs[0], "%s", src[0]);
    snprintf(dirs[1], sizeof dirs[1], "%s", fixture_path("st_hf_mx"));
    for (int k = 0; k < 2; k++) {
        char h5[512], out[512], err[1024];
        snprintf(h5, sizeof h5, "%s", tmp(k ? "mx.h5" : "q2.h5"));
        snprintf(out, sizeof out, "%s", tmp(k ? "mx_out" : "q2_out"));
        HfImportReport rep;
        cr_assert(hf_import(dirs[k], h5, NULL, &rep, err, sizeof err) == 0, "%s", err);
        cr_expect(rep.dtype == (k ? CKPT_F32 : CKPT_BF16), "the HF files' own dtype by default");
        cr_expect(ckpt_verify(h5, err, sizeof err) == 0, "%s", err);
        HfExportOpts o = { NULL, 64u << 10, 0 };
        HfExportReport er;
        cr_assert(hf_export(h5, out, &o, &er, err, sizeof err) == 0, "%s", err);
        cr_expect(er.original_config && er.n_files > 1, "the imported config.json, sharded at 64 KiB");
        same_files(dirs[k], out);
        /* the import loads as the HF directory does, bit for bit */
        ModelConfig c1, c2;
        cr_assert(ckpt_read_config(dirs[k], &c1, NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(ckpt_read_config(h5, &c2, NULL, err, sizeof err) == 0, "%s", err);
        Topology t;
        topo_single(&t, &c1);
        Model m1, m2;
        model_init(&m1, &c1, &t, false, 16);
        model_init(&m2, &c2, &t, false, 16);
        cr_assert(ckpt_load(dirs[k], &m1, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        cr_assert(ckpt_load(h5, &m2, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        cr_expect(m1.n_w == m2.n_w && !memcmp(m1.w, m2.w, m1.n_w * sizeof(float)));
        float ea;
        cr_expect(ckpt_load(dirs[k], &m1, &ea, &ea, NULL, err, sizeof err) != 0 && strstr(err, "no optimizer state"),
                  "%s", err);
        model_free(&m1);
        model_free(&m2);
    }
}

/* ---------------------------------------------------------------- tokenizer */

Test(hf, tokenizer_of_a_directory_and_of_its_import)
{
    char dir[512], cmd[1200], err[1024];
    snprintf(dir, sizeof dir, "%s", tmp("mx_tok"));
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", fixture_path("st_hf_mx"), dir);
    cr_assert(system(cmd) == 0);
    Tokenizer *t0;
    cr_assert(ckpt_open_tokenizer(dir, &t0, err, sizeof err) == 0, "%s", err);
    cr_expect(tok_is_byte_level(t0), "no tokenizer.json: byte level");
    tok_free(t0);
    char p[600];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}", f);
    fclose(f);
    char h5[512];
    snprintf(h5, sizeof h5, "%s", tmp("mx_tok.h5"));
    cr_assert(hf_import(dir, h5, NULL, NULL, err, sizeof err) == 0, "%s", err);
    Tokenizer *ta, *tb;
    cr_assert(ckpt_open_tokenizer(dir, &ta, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_open_tokenizer(h5, &tb, err, sizeof err) == 0, "%s", err);
    TokIds ia = { 0 }, ib = { 0 };
    cr_assert(tok_encode(ta, "abab", 4, false, &ia, err, sizeof err) == 0, "%s", err);
    cr_assert(tok_encode(tb, "abab", 4, false, &ib, err, sizeof err) == 0, "%s", err);
    cr_expect(ia.n == 2 && ib.n == 2 && ia.ids[0] == 2 && ib.ids[1] == 2, "\"abab\" -> [2, 2] from both");
    tok_ids_free(&ia);
    tok_ids_free(&ib);
    tok_free(ta);
    tok_free(tb);
}

/* ---------------------------------------------------------------- FP8 */

/* A Qwen3-MoE checkpoint in DeepSeek-V3's FP8 format (st_hf_f8, from
 * tests/ref/fixtures_safetensors.py: every *_proj.weight F8_E4M3 with a
 * float32 *_scale_inv per 32x16 block, edge blocks partial): each F8
 * tensor read through the mapping equals the reference's dequantization
 * q * s bit for bit, per expert of a stack too; boxes that cut blocks equal
 * the box of the whole; raw 16-bit reads of F8 data are refused. */
Test(hf, fp8_blocks_dequantize_exactly)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", fixture_path("st_hf_f8"));   /* fixture_f32 reuses fixture_path's buffer */
    HfModel h;
    open_ok(&h, dir);
    cr_expect(h.hc.fp8_block[0] == 32 && h.hc.fp8_block[1] == 16, "block %dx%d", h.hc.fp8_block[0], h.hc.fp8_block[1]);
    char err[512];
    int n_f8 = 0;
    for (int i = 0; i < h.n_b; i++) {
        const HfBinding *b = &h.b[i];
        if (b->src[0]->dtype != ST_F8_E4M3) {
            cr_expect(!b->scale[0], "%s: a scale on a %s tensor", b->tandem, st_dtype_name(b->src[0]->dtype));
            continue;
        }
        size_t numel = 1, zero[3] = { 0 };
        for (int d = 0; d < b->ndim; d++) numel *= b->shape[d];
        float *got = td_malloc(numel * sizeof(float));
        cr_assert(hf_read_box(&h, b, zero, b->shape, got, false, err, sizeof err) == 0, "%s", err);
        size_t per = numel / (b->rule->how == HFT_STACK ? b->shape[0] : 1), bad = 0;
        for (int e = 0; e < b->n_src; e++) {
            char name[256];
            hf_pattern_fill(name, sizeof name, b->rule->hf, b->layer, e);
            cr_assert(b->scale[e], "%s: no scale bound", name);
            size_t n;
            float *want = fixture_f32("st_expect.h5", tmp_name("hf_f8/", name), &n);
            cr_assert_eq(n, per, "%s: %zu values, the binding has %zu", name, n, per);
            for (size_t k = 0; k < n; k++) bad += memcmp(&got[e * per + k], &want[k], sizeof(float)) != 0;
            td_free(want);
            n_f8++;
        }
        cr_expect(bad == 0, "%s: %zu values differ from the reference's q * s", b->tandem, bad);
        uint16_t raw[4];
        size_t one[3] = { 1, 1, 1 };
        cr_expect(hf_read_box(&h, b, zero, one, raw, true, err, sizeof err) != 0 && strstr(err, "F8_E4M3"),
                  "a raw read of F8 data: %s", err);
        td_free(got);
    }
    cr_expect(n_f8 > 40, "%d F8 tensors checked", n_f8);
    hf_model_close(&h);
    check_slices(dir);
}

/* ---------------------------------------------------------------- published configs */

/* configs/ holds the published DeepSeek-V3 and Kimi-K2 config.json files
 * and a 3T / 1M-context variant (docs/import.md): each maps onto a tandem
 * config with the parameter counts their model cards give (DeepSeek-V3
 * 671B total, 37B active with the 0.9B embedding; Kimi-K2 1.04T, 32B). */
Test(hf, published_configs_parse_with_their_parameter_counts)
{
    static const struct { const char *file; double total, active, tol; int ctx; } cases[] = {
        { "configs/deepseek_v3.json", 671e9, 37e9, 0.015, 163840 },
        { "configs/kimi_k2.json", 1.03e12, 32e9, 0.03, 131072 },
        { "configs/dsv3_3t_1m.json", 3.0e12, 57e9, 0.02, 1048576 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(cases[i].file, "rb");
        cr_assert(f, "%s: cannot open (run from the repository root)", cases[i].file);
        static char text[16384];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        HfConfig hc;
        char err[512];
        cr_assert(hf_config_parse(&hc, text, cases[i].file, err, sizeof err) == 0, "%s", err);
        const ModelConfig *c = &hc.cfg;
        double total = (double)config_param_count(c);
        /* tandem's active count leaves out the embedding lookup; the model cards count it */
        double active = (double)config_active_param_count(c) + (double)c->vocab_size * c->hidden_size;
        cr_log_info("%s: %.4g parameters, %.4g active, context %d", cases[i].file, total, active,
                    c->max_position_embeddings);
        cr_expect(fabs(total / cases[i].total - 1) < cases[i].tol, "%s: %.4g parameters, want %.4g", cases[i].file,
                  total, cases[i].total);
        cr_expect(fabs(active / cases[i].active - 1) < cases[i].tol * 2, "%s: %.4g active, want %.4g", cases[i].file,
                  active, cases[i].active);
        cr_expect_eq(c->max_position_embeddings, cases[i].ctx);
        cr_expect(c->rope_scaling.type == ROPE_SCALING_YARN && hc.fp8_block[0] == 128, "%s: yarn and fp8", cases[i].file);
        hf_config_free(&hc);
    }
}
