/* train/quant/quant_cmd.c - `tandem ckpt quantize IN OUT.h5 --dtype
 * bf16|int8 [--calib DATA.bin [--gptq]]` (quant_cmd.h).
 *
 * Writes the quantized checkpoint (checkpoint/ckpt_serve.h: ckpt_quantize)
 * and prints, one JSON object a line, each tensor's relative error
 * ||W - deq(W)||_2 / ||W||_2; then, with --calib, scores held-out windows
 * of the token file twice with the training forward -- the float32 model
 * (IN served as f32) and OUT loaded back as a serving command loads it --
 * and prints the perplexity of each and its change, the largest change of
 * a token's log-probability, and the share of tokens whose top-k experts
 * (as a set) change, per MoE layer and over all of them.  With --gptq the
 * int8 matrices are rounded by GPTQ (gptq.h) from windows of the token
 * file's train split before they are written (the scoring above still
 * reads --split).
 */
#include "train/quant/quant_cmd.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/common.h"
#include "core/model/backprop.h"
#include "train/data.h"
#include "train/quant/gptq.h"
#include "train/quant/route_fit.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const g_help =
    "usage: tandem ckpt quantize IN OUT.h5 --dtype bf16|int8 [--embed-dtype D] [--head-dtype D]\n"
    "                            [--attn-dtype D]\n"
    "                            [--calib DATA.bin [--split val|train|all] [--seq-len 256]\n"
    "                             [--windows 16] [--kv-dtype auto|f32|bf16|int8]\n"
    "                             [--gptq [--gptq-windows 64] [--gptq-damp 0.01]]\n"
    "                             [--fit-routers [--fit-windows 64] [--fit-ridge 0.01]]]\n"
    "Writes OUT.h5, the checkpoint IN (a float32, f16 or bf16 checkpoint, or a run\n"
    "directory: its latest) with its matrices in bf16, or int8 with one scale (a\n"
    "bfloat16 value) per 32 weights along the input dim; routers (mlp/gate), norms, biases and\n"
    "shared_expert_gate stay float32 (docs/checkpoint.md).  --embed-dtype and\n"
    "--head-dtype override what the embedding and lm_head get (default: --dtype's\n"
    "plan, docs/serving.md), --attn-dtype what the attention projections get\n"
    "(self_attn/*_proj; default --dtype).  Prints one JSON line per tensor\n"
    "(relative error); with --calib, the perplexity of IN (float32) and of OUT on\n"
    "--windows windows of the token file, and the share of tokens whose top-k\n"
    "experts change, per MoE layer and overall (OUT computed with --kv-dtype;\n"
    "default auto, what serving OUT holds it in by default: bf16 for bf16 and\n"
    "int8 files, f32 for --dtype f32 copies, or the KV dtype of a fit).\n"
    "--dtype f32 copies the weights and, with --kv-dtype, measures the KV dtype\n"
    "alone.\n"
    "--gptq (int8): rounds each int8 matrix by GPTQ, from the second moments of its\n"
    "inputs over --gptq-windows windows of the token file's train split (same format,\n"
    "groups and scales; lower output error, higher weight error; docs/serving.md).\n"
    "--fit-routers: refits each MoE layer's float32 router, by ridge least squares over\n"
    "--fit-windows windows of the train split, so that on OUT's own hidden states (its\n"
    "weights and --kv-dtype) it gives the float32 model's router logits; only the\n"
    "routers change (the fit belongs to that --kv-dtype; docs/serving.md).\n";

/* Log-probabilities (n_win T) and experts (n_win T, n_moe, k) of windows of
 * tok under m, in batches of up to 8 windows. */
static void calib_run(Model *m, const int32_t *tok, size_t n_win, size_t T, float *logp, int32_t *routes, int n_moe)
{
    const size_t B = td_min(8, n_win), k = m->k, per = (size_t)n_moe * k;
    TrainActs a;
    model_train_acts_init(&a, m, B, T, RECOMPUTE_NONE);
    int32_t *ids = td_malloc(B * T * sizeof(int32_t)), *tg = td_malloc(B * T * sizeof(int32_t));
    for (size_t w0 = 0; w0 < n_win; w0 += B) {
        for (size_t r = 0; r < B; r++) {
            const size_t w = w0 + r < n_win ? w0 + r : 0;   /* padding rows: copies of window 0 */
            memcpy(ids + r * T, tok + w * T, T * sizeof(int32_t));
            memcpy(tg + r * T, tok + w * T + 1, T * sizeof(int32_t));
        }
        model_train_forward(m, &a, ids, tg, B * T, NULL);
        const size_t nb = td_min(B, n_win - w0);
        memcpy(logp + w0 * T, a.logp, nb * T * sizeof(float));
        int mi = 0;
        for (int li = 0; li < m->topo.layer_end - m->topo.layer_begin; li++) {
            if (!m->layers[m->topo.layer_begin + li].moe) continue;
            for (size_t t = 0; t < nb * T; t++)
                memcpy(routes + ((w0 * T + t) * per + (size_t)mi * k), a.la[li].topk_idx + t * k, k * sizeof(int32_t));
            mi++;
        }
    }
    td_free(ids);
    td_free(tg);
    model_train_acts_free(&a);
}

/* Same set of k experts? */
static bool same_experts(const int32_t *a, const int32_t *b, size_t k)
{
    for (size_t i = 0; i < k; i++) {
        bool found = false;
        for (size_t j = 0; j < k && !found; j++) found = a[i] == b[j];
        if (!found) return false;
    }
    return true;
}

static int read_windows(const char *path, const char *split, size_t T, size_t max_win, int V, int32_t **out,
                        size_t *n_win, char *err, size_t n)
{
    TokenFile tf;
    if (tokfile_open(&tf, path, err, n)) return -1;
    TokenStream s = { &tf, 0, tf.count };
    if (!strcmp(split, "val")) s = tokfile_val(&tf);
    else if (!strcmp(split, "train")) s = tokfile_train(&tf);
    size_t nw = s.len > 0 ? (size_t)((s.len - 1) / T) : 0;
    nw = td_min(nw, max_win);
    if (nw == 0) {
        snprintf(err, n, "--calib %s: the %s split (%llu tokens) holds no window of %zu + 1", path, split,
                 (unsigned long long)s.len, T);
        tokfile_close(&tf);
        return -1;
    }
    int32_t *t = td_malloc((nw * T + 1) * sizeof(int32_t));
    for (size_t i = 0; i < nw * T + 1; i++) {
        t[i] = tokfile_get(&tf, s.begin + i);
        if (t[i] < 0 || t[i] >= V) {
            snprintf(err, n, "--calib %s: token %d at %zu is outside the model's vocabulary (%d)", path, t[i], i, V);
            td_free(t);
            tokfile_close(&tf);
            return -1;
        }
    }
    tokfile_close(&tf);
    *out = t;
    *n_win = nw;
    return 0;
}

/* path opened as a serving model: in float32 (kv NULL, and a float32 KV
 * cache), or as it stores its weights with the KV cache --kv-dtype gave
 * (kv: ckpt_serve_dtypes' parse; not given: auto, as a serving command).
 * 0, or 1 after one line. */
static int open_model(const char *path, const ServeDtypes *kv, Model *m)
{
    char err[1024];
    const ServeDtypes sd = kv ? (ServeDtypes){ .kv_set = kv->kv_set, .kv = kv->kv }
                              : (ServeDtypes){ .dtype_set = true, .dtype = DTYPE_F32, .kv_set = true, .kv = DTYPE_F32 };
    if (ckpt_open_serving(path, m, NULL, &sd, err, sizeof err)) {
        if (err[0]) td_error("ckpt quantize: %s", err);
        return 1;
    }
    return 0;
}

/* The windows of T + 1 tokens (at most max_win) of split of data for m:
 * *tok (td_malloc'd) and *n_win.  0; 2 after one line when T exceeds m's
 * context; 1 after one line (prefixed by what: "", "--gptq: " ...) when
 * data does not give them. */
static int model_windows(const Model *m, const char *data, const char *split, size_t T, size_t max_win,
                         const char *what, int32_t **tok, size_t *n_win)
{
    char err[1024];
    if (T > (size_t)m->cfg.max_position_embeddings) {
        td_error("ckpt quantize: --seq-len %zu exceeds the model's max_position_embeddings %d", T,
                 m->cfg.max_position_embeddings);
        return 2;
    }
    if (read_windows(data, split, T, max_win, m->cfg.vocab_size, tok, n_win, err, sizeof err)) {
        td_error("ckpt quantize: %s%s", what, err);
        return 1;
    }
    return 0;
}

static int calibrate(const char *in, const char *out, const char *data, const char *split, size_t T, size_t max_win,
                     const ServeDtypes *kv)
{
    Model f, q;
    if (open_model(in, NULL, &f)) return 1;
    int32_t *tok;
    size_t n_win;
    const int wrc = model_windows(&f, data, split, T, max_win, "", &tok, &n_win);
    if (wrc) {
        model_free(&f);
        return wrc;
    }
    int n_moe = 0;
    for (int l = f.topo.layer_begin; l < f.topo.layer_end; l++) n_moe += f.layers[l].moe;
    const size_t N = n_win * T, k = f.k, per = (size_t)n_moe * k;
    float *lp_f = td_malloc(N * sizeof(float)), *lp_q = td_malloc(N * sizeof(float));
    int32_t *rt_f = td_malloc((N * per + 1) * sizeof(int32_t)), *rt_q = td_malloc((N * per + 1) * sizeof(int32_t));
    calib_run(&f, tok, n_win, T, lp_f, rt_f, n_moe);
    model_free(&f);   /* one model at a time */
    if (open_model(out, kv, &q)) {
        td_free(tok);
        td_free(lp_f);
        td_free(lp_q);
        td_free(rt_f);
        td_free(rt_q);
        return 1;
    }
    calib_run(&q, tok, n_win, T, lp_q, rt_q, n_moe);
    double sf = 0, sq = 0, dmax = 0, changed_any = 0;
    double *per_layer = td_calloc(((size_t)n_moe + 1) * sizeof(double));
    for (size_t t = 0; t < N; t++) {
        sf -= lp_f[t];
        sq -= lp_q[t];
        dmax = fmax(dmax, fabs((double)lp_f[t] - (double)lp_q[t]));
        bool any = false;
        for (int l = 0; l < n_moe; l++) {
            const bool ch = !same_experts(rt_f + t * per + (size_t)l * k, rt_q + t * per + (size_t)l * k, k);
            per_layer[l] += ch;
            any |= ch;
        }
        changed_any += any;
    }
    double all = 0;
    for (int l = 0; l < n_moe; l++) all += per_layer[l];
    const double ppl_f = exp(sf / (double)N), ppl_q = exp(sq / (double)N);
    printf("{\"calib\":\"%s\",\"split\":\"%s\",\"windows\":%zu,\"seq_len\":%zu,\"tokens\":%zu,\"weights\":\"%s\","
           "\"attn\":\"%s\",\"kv_dtype\":\"%s\",\"ppl_f32\":%.6f,\"ppl\":%.6f,\"ppl_change_pct\":%.4f,"
           "\"logprob_diff_max\":%.6g,\"topk_changed_share\":%.6f,\"topk_changed_any_layer_share\":%.6f,"
           "\"topk_changed_share_per_layer\":[",
           data, split, n_win, T, N, dtype_name(q.dt.mat), dtype_name(q.dt.attn), dtype_name(q.attn.kv), ppl_f, ppl_q,
           100.0 * (ppl_q / ppl_f - 1.0), dmax, n_moe ? all / ((double)N * n_moe) : 0.0, changed_any / (double)N);
    for (int l = 0; l < n_moe; l++) printf("%s%.6f", l ? "," : "", per_layer[l] / (double)N);
    printf("]}\n");
    model_free(&q);
    td_free(per_layer);
    td_free(tok);
    td_free(lp_f);
    td_free(lp_q);
    td_free(rt_f);
    td_free(rt_q);
    return 0;
}

/* The GPTQ factors of in's float32 model from n_win windows of T of the
 * train split of data; NULL after one printed line. */
static GptqSet *gptq_build(const char *in, const char *data, size_t T, size_t n_win, double damp)
{
    Model f;
    if (open_model(in, NULL, &f)) return NULL;
    int32_t *tok = NULL;
    size_t nw = 0;
    GptqSet *g = NULL;
    if (!model_windows(&f, data, "train", T, n_win, "--gptq: ", &tok, &nw))
        g = gptq_collect(&f, tok, nw, T, damp);   /* takes f over */
    td_free(tok);
    model_free(&f);
    return g;
}

/* Fits the routers of the quantized file (not yet published) to in's
 * float32 model on n_win windows of T of the train split of data, with the
 * KV cache in kv, and writes them into file.  0, or 1 after one line. */
static int fit_routers(const char *in, const char *file, const char *data, size_t T, size_t n_win, double ridge,
                       const ServeDtypes *kv)
{
    char err[1024];
    Model f, q;
    if (open_model(in, NULL, &f)) return 1;
    if (open_model(file, kv, &q)) {
        model_free(&f);
        return 1;
    }
    int32_t *tok = NULL;
    size_t nw = 0;
    RouteFit *r = NULL;
    int n = 0, rc = model_windows(&f, data, "train", T, n_win, "--fit-routers: ", &tok, &nw) ? 1 : 0;
    if (!rc && route_fit(&f, &q, tok, nw, T, ridge, &r, &n, err, sizeof err)) {
        td_error("ckpt quantize: --fit-routers: %s", err);
        rc = 1;
    }
    char note[256];
    (void)td_snprintf(note, sizeof note,
                      "{\"kv_dtype\":\"%s\",\"split\":\"train\",\"windows\":%zu,\"seq_len\":%zu,\"ridge\":%g}",
                      dtype_name(q.attn.kv), nw, T, ridge);
    if (!rc && n > 0) {
        CkptF32 *t = td_malloc((size_t)n * sizeof *t);
        for (int i = 0; i < n; i++) t[i] = (CkptF32){ r[i].name, r[i].w, r[i].E * r[i].d };
        if (ckpt_overwrite_f32(file, t, n, "router_fit", note, err, sizeof err)) {
            td_error("ckpt quantize: --fit-routers: %s", err);
            rc = 1;
        }
        td_free(t);
    }
    if (!rc) {
        printf("{\"fit_routers\":%d,\"kv_dtype\":\"%s\",\"windows\":%zu,\"seq_len\":%zu,\"ridge\":%g,"
               "\"logit_rmse_before\":[", n, dtype_name(q.attn.kv), nw, T, ridge);
        for (int i = 0; i < n; i++) printf("%s%.6g", i ? "," : "", r[i].logit_rmse_before);
        printf("],\"logit_rmse_after\":[");
        for (int i = 0; i < n; i++) printf("%s%.6g", i ? "," : "", r[i].logit_rmse_after);
        printf("]}\n");
        fflush(stdout);
        if (n == 0) fprintf(stderr, "ckpt quantize: --fit-routers: the model has no MoE layer: nothing to fit\n");
    }
    route_fit_free(r, n);
    td_free(tok);
    model_free(&q);
    model_free(&f);
    return rc;
}

static int quant_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "dtype=", "embed-dtype=", "head-dtype=", "attn-dtype=", "calib=", "split=",
                                        "seq-len=", "windows=", "kv-dtype=", "gptq", "gptq-windows=", "gptq-damp=",
                                        "fit-routers", "fit-windows=", "fit-ridge=", NULL };
    char err[1024];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("ckpt quantize: %s", err);
        return 2;
    }
    if (ap->help) {
        fputs(g_help, stdout);
        return 0;
    }
    if (ap->n_pos != 2 || !args_get(ap, "dtype")) {
        td_error("ckpt quantize: usage: tandem ckpt quantize IN OUT.h5 --dtype bf16|int8 [--calib DATA.bin]");
        return 2;
    }
    Dtype d;
    if (dtype_parse(args_get(ap, "dtype"), &d)) {
        td_error("ckpt quantize: --dtype must be bf16 or int8 (or f32: a copy), not \"%s\"", args_get(ap, "dtype"));
        return 2;
    }
    ModelDtypes dt = model_dtypes_default(d);
    static const char *const opt[3] = { "embed-dtype", "head-dtype", "attn-dtype" };
    Dtype *dst[3] = { &dt.embed, &dt.head, &dt.attn };
    for (int i = 0; i < 3; i++)
        if (args_get(ap, opt[i]) && dtype_parse(args_get(ap, opt[i]), dst[i])) {
            td_error("ckpt quantize: --%s must be f32, bf16 or int8, not \"%s\"", opt[i], args_get(ap, opt[i]));
            return 2;
        }
    ServeDtypes kv;   /* --kv-dtype only, parsed as the serving commands parse it */
    if (ckpt_serve_dtypes(&kv, NULL, args_get(ap, "kv-dtype"), err, sizeof err)) {
        td_error("ckpt quantize: %s", err);
        return 2;
    }
    const char *split = args_str(ap, "split", "val");
    if (strcmp(split, "val") && strcmp(split, "train") && strcmp(split, "all")) {
        td_error("ckpt quantize: --split must be val, train or all");
        return 2;
    }
    double T, nw, gw, damp, fw, ridge;
    if (args_num(ap, "seq-len", 256, 2, 1 << 20, &T, err, sizeof err) < 0 ||
        args_num(ap, "windows", 16, 1, 1 << 20, &nw, err, sizeof err) < 0 ||
        args_num(ap, "gptq-windows", 64, 1, 1 << 20, &gw, err, sizeof err) < 0 ||
        args_num(ap, "gptq-damp", 0.01, 1e-6, 10, &damp, err, sizeof err) < 0 ||
        args_num(ap, "fit-windows", 64, 1, 1 << 20, &fw, err, sizeof err) < 0 ||
        args_num(ap, "fit-ridge", 0.01, 1e-6, 100, &ridge, err, sizeof err) < 0) {
        td_error("ckpt quantize: %s", err);
        return 2;
    }
    const char *calib = args_get(ap, "calib");
    const bool gptq = args_flag(ap, "gptq");
    if (gptq && (d != DTYPE_INT8 || !calib)) {
        td_error("ckpt quantize: --gptq rounds int8 matrices from calibration data: it needs --dtype int8 and --calib");
        return 2;
    }
    const bool fit = args_flag(ap, "fit-routers");
    if (fit && !calib) {
        td_error("ckpt quantize: --fit-routers fits the routers on calibration data: it needs --calib");
        return 2;
    }
    const char *in = ap->pos[0], *out = ap->pos[1];
    /* with --fit-routers the file is made under another name and published
     * once its routers are written */
    char staged[PATH_MAX + 16];
    (void)td_snprintf(staged, sizeof staged, "%s%s", out, fit ? ".unfitted" : "");
    GptqSet *g = gptq ? gptq_build(in, calib, (size_t)T, (size_t)gw, damp) : NULL;
    if (gptq && !g) return 1;
    CkptQuantRound round = g ? gptq_round(g) : (CkptQuantRound){ 0 };
    CkptQuantTensor *rep;
    int n_rep;
    const int qrc = ckpt_quantize(in, staged, &dt, g ? &round : NULL, &rep, &n_rep, err, sizeof err);
    size_t n_near = 0, peak = 0;
    const size_t n_gptq = g ? gptq_factored(g, &n_near, &peak) : 0;
    gptq_free(g);
    if (qrc) {
        if (err[0]) td_error("ckpt quantize: %s", err);
        return 1;
    }
    double worst = 0;
    for (int i = 0; i < n_rep; i++) {
        printf("{\"tensor\":\"%s\",\"dtype\":\"%s\",\"numel\":%zu,\"rel_err\":%.6g,\"max_abs_err\":%.6g}\n", rep[i].name,
               dtype_name(rep[i].dtype), rep[i].numel, rep[i].rel_err, rep[i].max_abs_err);
        worst = fmax(worst, rep[i].rel_err);
    }
    printf("{\"quantized\":\"%s\",\"dtype\":\"%s\",\"embed_dtype\":\"%s\",\"head_dtype\":\"%s\",\"attn_dtype\":\"%s\","
           "\"tensors\":%d,\"rel_err_max\":%.6g,\"rounding\":\"%s\",\"gptq_matrices\":%zu,\"gptq_nearest\":%zu,"
           "\"gptq_factor_bytes\":%zu}\n",
           out, dtype_name(dt.mat), dtype_name(dt.embed), dtype_name(dt.head), dtype_name(dt.attn), n_rep, worst,
           gptq ? "gptq" : "nearest", n_gptq, n_near, peak);
    fflush(stdout);
    td_free(rep);
    if (fit) {
        if (fit_routers(in, staged, calib, (size_t)T, (size_t)fw, ridge, &kv)) {
            unlink(staged);
            return 1;
        }
        if (rename(staged, out)) {
            td_error("ckpt quantize: cannot publish %s as %s: %s", staged, out, strerror(errno));
            unlink(staged);
            return 1;
        }
    }
    return calib ? calibrate(in, out, calib, split, (size_t)T, (size_t)nw, &kv) : 0;
}

int cmd_ckpt_quantize(int argc, char **argv)
{
    Args a = { 0 };
    int rc = quant_run(&a, argc, argv);
    args_free(&a);
    return rc;
}
