/* infer/generate_cmd.c - `tandem generate`: one prompt through the engine,
 * streamed to the terminal or printed as JSON (SPEC section 8). */
#include "infer/infer_cmd.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/common.h"
#include "core/image/image.h"
#include "core/model/vision.h"
#include "infer/engine.h"
#include "infer/server/server_image.h"

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const g_gen_help =
    "usage: tandem generate --ckpt CKPT (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                       [--max-tokens 128] [--temperature 1.0] [--top-k 0] [--top-p 1.0]\n"
    "                       [--seed 0] [--stop STR ...] [--ignore-eos] [--logprobs N] [--json]\n"
    "                       [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8] [--expert-cache-mb N] [--no-prefix-cache]\n"
    "                       [--image FILE ...]\n"
    "Streams the completion to stdout as it is produced and reports time to first\n"
    "token and tokens/s on stderr.  --temperature 0 is greedy.  --json prints one\n"
    "object instead: prompt_ids, ids, text, logprobs, finish_reason, ttft_ms,\n"
    "tokens_per_s (decode rate after the first token).  The text goes through the\n"
    "checkpoint's tokenizer (byte-level when it holds none): --prompt is encoded as\n"
    "HF's tokenizer(text) does, the output decoded without special tokens, and the\n"
    "model's end-of-turn ids end it (finish \"stop\") unless --ignore-eos.\n"
    "--dtype holds the weights in that dtype and computes from them (default: as the\n"
    "checkpoint stores them; an int8 checkpoint serves as int8); --kv-dtype holds\n"
    "the KV cache so (default auto: bf16 with --dtype bf16|int8 or a file ckpt\n"
    "quantize wrote, f32 otherwise, or the KV dtype the checkpoint's routers were\n"
    "fitted to).\n"
    "--expert-cache-mb N keeps the routed experts' weights in a cache of N MiB (LRU,\n"
    "per layer), read from the checkpoint when routed to; the output is the\n"
    "resident model's, bit for bit.  --image FILE (PNG or JPEG, repeatable) gives\n"
    "a model with a vision tower its images: the prompt holds one <image> (the\n"
    "image_token_index id) per image, or none and the images come first.\n"
    "docs/serving.md, docs/vision.md\n";

/* Shared by generate and serve/rollout: sampling options from Args. */
int infer_gen_params(GenParams *gp, const Args *a, char *err, size_t n)
{
    double v;
    memset(gp, 0, sizeof *gp);
    gp->sp.top_p = 1.0;
    gp->sp.temperature = 1.0;
    if (args_num(a, "max-tokens", 128, 1, 1 << 20, &v, err, n) < 0) return -1;
    gp->max_tokens = (int)v;
    if (args_num(a, "temperature", 1.0, 0, 100, &gp->sp.temperature, err, n) < 0) return -1;
    if (args_num(a, "top-k", 0, 0, 1 << 30, &v, err, n) < 0) return -1;
    gp->sp.top_k = (int)v;
    if (args_num(a, "top-p", 1.0, 1e-9, 1.0, &gp->sp.top_p, err, n) < 0) return -1;
    if (args_num(a, "seed", 0, 0, 1.8e19, &v, err, n) < 0) return -1;
    gp->seed = (uint64_t)v;
    if (args_num(a, "logprobs", 0, 0, SAMPLER_TOP_MAX, &v, err, n) < 0) return -1;
    gp->n_top = (int)v;
    const char *const *stops = NULL;
    int ns = args_multi(a, "stop", &stops);
    if (ns > ENGINE_MAX_STOP) {
        snprintf(err, n, "at most %d --stop strings", ENGINE_MAX_STOP);
        return -1;
    }
    for (int i = 0; i < ns; i++) {
        if (strlen(stops[i]) >= ENGINE_STOP_LEN) {
            snprintf(err, n, "--stop strings are limited to %d bytes", ENGINE_STOP_LEN - 1);
            return -1;
        }
        snprintf(gp->stop[i], ENGINE_STOP_LEN, "%s", stops[i]);
    }
    gp->n_stop = ns;
    gp->ignore_eos = args_flag(a, "ignore-eos");
    return 0;
}

/* "1,2,3" -> ids (the vocabulary is the engine's check); returns count or -1. */
static long parse_ids(const char *s, int32_t *out, size_t cap)
{
    size_t n = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX || n == cap) return -1;
        out[n++] = (int32_t)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return (long)n;
}

typedef struct {
    bool stream;
    size_t emitted;   /* bytes of the text already written */
} StreamState;

/* Writes the text as it becomes final (whole characters, never a stop
 * string), the rest when the request is done. */
static void stream_cb(Request *r, bool done, void *user)
{
    StreamState *s = user;
    (void)done;
    if (!s->stream || r->text_safe <= s->emitted) return;
    fwrite(r->text.s + s->emitted, 1, r->text_safe - s->emitted, stdout);
    s->emitted = r->text_safe;
    fflush(stdout);
}

/* --image FILE (repeatable): each decoded, resized and normalised as the
 * model's vision_config says, into *pixels (n, 3, S, S); the prompt's
 * placeholders (one image_token_index per image, "<image>" in --prompt
 * text; none: one per image is put first, LLaVA's order) expanded to
 * the image's tokens.  -1 with one line in err. */
static int load_images(Args *ap, const Model *m, TokIds *ids, float **pixels, size_t *n_img, char *err, size_t n)
{
    const ModelConfig *c = &m->cfg;
    const char *const *files = NULL;
    const size_t k = (size_t)args_multi(ap, "image", &files);
    if (!config_vision(c)) {
        snprintf(err, n, "--image: the model has no vision tower (no vision_config)");
        return -1;
    }
    ApiVision v = { .tokens = vision_tokens_per_image(c), .token_id = c->image_token_index,
                    .size = (size_t)c->vision_config.image_size };
    for (int j = 0; j < 3; j++) {
        v.mean[j] = (float)c->vision_config.image_mean[j];
        v.std[j] = (float)c->vision_config.image_std[j];
    }
    const size_t px = 3 * v.size * v.size;
    *pixels = td_malloc(k * px * sizeof(float));
    for (size_t i = 0; i < k; i++) {
        const char *path = files[i];
        Image im;
        char why[256];
        if (image_load(path, NULL, &im, why, sizeof why)) {
            snprintf(err, n, "--image: %s", why);   /* why names the file */
            td_free(*pixels);
            *pixels = NULL;
            return -1;
        }
        image_to_pixels(&im, v.size, v.mean, v.std, *pixels + i * px);
        image_free(&im);
    }
    size_t found = 0;
    for (size_t i = 0; i < ids->n; i++) found += ids->ids[i] == v.token_id;
    if (found == 0) {   /* the images first */
        int32_t *x = td_malloc((ids->n + k) * sizeof(int32_t));
        for (size_t i = 0; i < k; i++) x[i] = v.token_id;
        memcpy(x + k, ids->ids, ids->n * sizeof(int32_t));
        td_free(ids->ids);
        ids->ids = x;
        ids->n = ids->cap = ids->n + k;
    }
    *n_img = k;
    if (api_images_expand(ids, &v, k, err, n)) {
        td_free(*pixels);
        *pixels = NULL;
        return -1;
    }
    return 0;
}

static int generate_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "prompt=", "prompt-ids=", "max-tokens=", "temperature=",
                                        "top-k=", "top-p=", "seed=", "stop+", "logprobs=", "json", "ignore-eos",
                                        "dtype=", "kv-dtype=", "expert-cache-mb=", "no-prefix-cache", "image+", NULL };
    char err[512];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("generate: %s", err);
        return 2;
    }
    if (ap->help) {
        fputs(g_gen_help, stdout);
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *prompt = args_get(ap, "prompt"), *pids = args_get(ap, "prompt-ids");
    if (!ckpt || !!prompt == !!pids) {
        td_error("generate: --ckpt and one of --prompt / --prompt-ids are required");
        return 2;
    }
    GenParams gp;
    if (infer_gen_params(&gp, ap, err, sizeof err)) {
        td_error("generate: %s", err);
        return 2;
    }
    bool json = args_flag(ap, "json");
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err) ||
        ckpt_serve_expert_cache(&sd, args_get(ap, "expert-cache-mb"), err, sizeof err)) {
        td_error("generate: %s", err);
        return 2;
    }
    Model m;
    if (ckpt_open_serving(ckpt, &m, NULL, &sd, err, sizeof err)) {
        if (err[0]) td_error("generate: %s", err);
        return 1;
    }
    CkptText tx;
    if (ckpt_open_text(ckpt, false, &tx, err, sizeof err)) {
        td_error("generate: %s", err);
        model_free(&m);
        return 1;
    }
    TokIds pv = { 0 };
    long n_ids;
    if (prompt) {
        n_ids = tok_encode(tx.tok, prompt, strlen(prompt), true, &pv, err, sizeof err) ? -2 : (long)pv.n;
    } else {
        size_t cap = strlen(pids) + 1;
        pv.ids = td_malloc(cap * sizeof(int32_t));
        pv.cap = cap;
        n_ids = parse_ids(pids, pv.ids, cap);
        pv.n = n_ids > 0 ? (size_t)n_ids : 0;
    }
    float *pixels = NULL;
    size_t n_img = 0;
    const char *const *img_files = NULL;
    if (n_ids > 0 && args_multi(ap, "image", &img_files) > 0 &&
        load_images(ap, &m, &pv, &pixels, &n_img, err, sizeof err)) {
        td_error("generate: %s", err);
        td_free(pv.ids);
        ckpt_text_free(&tx);
        model_free(&m);
        return 2;
    }
    n_ids = n_ids > 0 ? (long)pv.n : n_ids;
    int32_t *ids = pv.ids;
    int rc = 1;
    if (n_ids <= 0) {
        td_error("generate: %s", n_ids == -2 ? err
                                 : n_ids < 0 ? "--prompt-ids must be comma-separated non-negative integers"
                                             : "the prompt is empty");
        td_free(ids);
        ckpt_text_free(&tx);
        model_free(&m);
        return 2;
    }
    EngineOpts eo;
    engine_opts_default(&eo);
    eo.tok = tx.tok;
    eo.stop_ids = tx.stop_ids;
    eo.n_stop_ids = tx.n_stop_ids;
    eo.prefix_cache = !args_flag(ap, "no-prefix-cache");
    size_t need = (size_t)n_ids + (size_t)gp.max_tokens + 16;
    eo.kv_budget_bytes = td_max((size_t)16 << 20, need * (attn_block_bytes(&m.attn) / m.attn.bs) *
                                                      (size_t)(m.topo.layer_end - m.topo.layer_begin) * 2);
    eo.max_running = 1;
    Engine e;
    engine_init(&e, &m, &eo);
    Request *r = request_new(ids, (size_t)n_ids, &gp);
    if (n_img) request_set_images(r, pixels, n_img);
    StreamState ss = { !json, 0 };
    r->cb = stream_cb;
    r->user = &ss;
    int sub = engine_submit(&e, r);
    if (sub == -2) {   /* ids outside the vocabulary, a prompt too long for the context or the cache */
        td_error("generate: %s", r->error);
        rc = 2;
        goto out;
    }
    while (engine_step(&e) > 0) {}
    if (!strcmp(r->finish_reason, "error")) {   /* an expert the cache could not read */
        td_error("generate: %s", r->error);
        rc = 1;
        goto out;
    }
    double ttft = (r->t_first - r->t_submit) * 1e3;
    double tps = r->n_out > 1 ? (double)(r->n_out - 1) / (r->t_last - r->t_first) : 0.0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON *pa = cJSON_AddArrayToObject(o, "prompt_ids"), *ia = cJSON_AddArrayToObject(o, "ids");
        for (long i = 0; i < n_ids; i++) cJSON_AddItemToArray(pa, cJSON_CreateNumber(ids[i]));
        for (size_t i = 0; i < r->n_out; i++) cJSON_AddItemToArray(ia, cJSON_CreateNumber(r->out[i]));
        char *js = td_json_string(r->text.s, r->text.len);   /* a text may hold a NUL */
        cJSON_AddRawToObject(o, "text", js);
        td_free(js);
        cJSON *la = cJSON_AddArrayToObject(o, "logprobs");
        for (size_t i = 0; i < r->n_out; i++) cJSON_AddItemToArray(la, cJSON_CreateNumber(r->out_logp[i]));
        if (gp.n_top > 0) {
            cJSON *ta = cJSON_AddArrayToObject(o, "top_logprobs");
            for (size_t i = 0; i < r->n_out; i++) {
                cJSON *t = cJSON_CreateObject();
                for (int j = 0; j < r->out_top[i].n_top; j++) {
                    char key[16];
                    snprintf(key, sizeof key, "%d", r->out_top[i].top_id[j]);
                    cJSON_AddNumberToObject(t, key, r->out_top[i].top_logp[j]);
                }
                cJSON_AddItemToArray(ta, t);
            }
        }
        cJSON_AddStringToObject(o, "finish_reason", r->finish_reason);
        cJSON_AddNumberToObject(o, "ttft_ms", ttft);
        cJSON_AddNumberToObject(o, "tokens_per_s", tps);
        if (m.ecache) {
            const ExpertCacheStats *x = &m.ecache->st;
            cJSON *c = cJSON_AddObjectToObject(o, "expert_cache");
            cJSON_AddNumberToObject(c, "slots_per_layer", (double)m.ecache->slots);
            cJSON_AddNumberToObject(c, "bytes", (double)model_expert_cache_bytes(&m));
            cJSON_AddNumberToObject(c, "hits", (double)x->hits);
            cJSON_AddNumberToObject(c, "misses", (double)x->misses);
            cJSON_AddNumberToObject(c, "bytes_loaded", (double)x->bytes_loaded);
            cJSON_AddNumberToObject(c, "load_s", x->load_s);
            cJSON_AddNumberToObject(c, "weight_bytes", (double)model_weight_bytes(&m));   /* all resident weights */
        }
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        printf("\n");
        fflush(stdout);   /* the text before the summary, also when both go to one file */
        fprintf(stderr, "tandem: generate: %zu tokens, time to first token %.1f ms, %.1f tokens/s, finish: %s\n",
                r->n_out, ttft, tps, r->finish_reason);
        if (m.ecache) {
            const ExpertCacheStats *x = &m.ecache->st;
            fprintf(stderr,
                    "tandem: generate: expert cache %zu slots per layer (%.1f MiB): %llu hits, %llu misses "
                    "(hit rate %.3f), %.1f MiB loaded in %.3f s\n",
                    m.ecache->slots, (double)model_expert_cache_bytes(&m) / 1048576.0, (unsigned long long)x->hits,
                    (unsigned long long)x->misses,
                    x->hits + x->misses ? (double)x->hits / (double)(x->hits + x->misses) : 0.0,
                    (double)x->bytes_loaded / 1048576.0, x->load_s);
        }
    }
    rc = 0;
out:
    request_free(r);
    engine_free(&e);
    td_free(ids);
    td_free(pixels);
    ckpt_text_free(&tx);
    model_free(&m);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    Args a = { 0 };
    int rc = generate_run(&a, argc, argv);
    args_free(&a);
    return rc;
}
