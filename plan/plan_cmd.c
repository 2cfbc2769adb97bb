/* plan/plan_cmd.c - `tandem plan` (plan_cmd.h): the command line, the
 * config in any of its three forms, the table, the JSON and --best. */
#include "plan/plan_cmd.h"
#include "checkpoint/ckpt_serve.h"
#include "checkpoint/hf/hf_config.h"
#include "checkpoint/hf/hf_load.h"
#include "core/args.h"
#include "core/common.h"
#include "plan/plan.h"
#include "train/runcfg.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const g_help =
    "usage: tandem plan CONFIG --world N --device-mem-gb G [--mode train|serve]\n"
    "                   [key=value ...] [--layout dp=..,tp=..,pp=..,ep=..,cp=..]\n"
    "                   [--json] [--best] [--top K] [--tflops 400] [--hbm-gbs 3000]\n"
    "                   [--intra-gbs 400] [--inter-gbs 50] [--node-size 8]\n"
    "Memory and communication of every parallel layout of N devices, before the\n"
    "weights exist.  CONFIG: a tandem model config, a run config, or a Hugging\n"
    "Face config.json (or its directory).  Training keys are run keys (seq_len,\n"
    "micro_batch, grad_accum, recompute, zero; defaults from the run config, else\n"
    "tandem train's), global_batch=G (sequences per step: every layout then\n"
    "runs one sequence per dp rank, grad_accum = G / dp) and sp=true (sequence\n"
    "parallelism in the layouts with tp > 1); serving keys: context (8192), concurrency (64 sequences per\n"
    "instance), max_batch_tokens (512), prefill_chunk (256), dtype (bf16),\n"
    "kv_dtype (f32 with dtype=f32, else bf16: tandem serve --dtype D's default).\n"
    "Per rank: weights, gradients, optimizer, activations, kv_cache, comm,\n"
    "workspace, total (what tandem's allocator will count);\n"
    "bytes per step of each group (tp, ep, pp, dp, cp) and an estimated step time\n"
    "from --tflops (sustained per device) and the link bandwidths (GB/s per rank,\n"
    "--intra-gbs inside a node of --node-size devices, --inter-gbs between nodes).\n"
    "Ranked by estimated step time; --json prints every layout, --best the winner\n"
    "as overrides for `tandem train` (serving: for `tandem serve`).  Serving with\n"
    "--expert-cache-mb N (per rank): weights are the non-expert ones plus the cache\n"
    "(refused below one token's top-k experts per MoE layer).  Exit 1 when no\n"
    "layout fits.  Details: docs/planning.md\n";

static const char *const g_serve_keys[] = { "context", "concurrency", "max_batch_tokens", "prefill_chunk",
                                            "dtype", "kv_dtype", NULL };

static bool is_serve_key(const char *kv)
{
    for (int i = 0; g_serve_keys[i]; i++) {
        size_t n = strlen(g_serve_keys[i]);
        if (!strncmp(kv, g_serve_keys[i], n) && kv[n] == '=') return true;
    }
    return false;
}

/* The model of CONFIG and the run keys: a run config's own, or tandem
 * train's defaults with a model or HF config; train_over applied. */
static int load_config(const char *path, bool serve, int n_over, char **over, RunConfig *rc, char *err, size_t n)
{
    memset(rc, 0, sizeof *rc);
    struct stat sb;
    char file[1100];
    if (stat(path, &sb) != 0) {
        snprintf(err, n, "plan: %s: no such file", path);
        return -1;
    }
    snprintf(file, sizeof file, "%s%s", path, S_ISDIR(sb.st_mode) ? "/config.json" : "");
    char *text = NULL, why[1200];
    if (td_read_file(file, 0, &text, NULL, why, sizeof why)) {
        snprintf(err, n, "plan: cannot read %s", file);
        return -1;
    }
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        td_free(text);
        snprintf(err, n, "plan: %s is not a JSON object", file);
        return -1;
    }
    bool hf = cJSON_GetObjectItemCaseSensitive(root, "architectures") != NULL;
    bool run = cJSON_GetObjectItemCaseSensitive(root, "model") != NULL;
    cJSON_Delete(root);
    int ret;
    if (run) {
        td_free(text);
        ret = runcfg_load(rc, file, n_over, over, err, n);
        return ret;
    }
    ModelConfig cfg;
    char e2[512];
    if (hf) {
        HfConfig hc;
        ret = hf_config_parse(&hc, text, file, e2, sizeof e2);
        if (!ret) cfg = hc.cfg;
        hf_config_free(&hc);
    } else {
        ret = config_parse(&cfg, text, e2, sizeof e2);
    }
    td_free(text);
    if (ret) {
        snprintf(err, n, "plan: %s: %s", file, e2);
        return -1;
    }
    if (serve) {   /* no run keys: the model alone */
        rc->model = cfg;
        return config_validate(&cfg, err, n);
    }
    /* the model as an inline override, then the run keys: tandem train's parser and defaults */
    char *mj = config_to_json(&cfg);
    char *mo = td_sprintf("model=%s", mj);
    td_free(mj);
    char **ov = td_malloc((size_t)(n_over + 1) * sizeof(char *));
    ov[0] = mo;
    for (int i = 0; i < n_over; i++) ov[i + 1] = over[i];
    ret = runcfg_load(rc, NULL, n_over + 1, ov, err, n);
    td_free(ov);
    td_free(mo);
    return ret;
}

static int parse_int_key(const char *kv, const char *key, int lo, int hi, int *out, char *err, size_t n)
{
    char *end;
    long v = strtol(kv + strlen(key) + 1, &end, 10);
    if (end == kv + strlen(key) + 1 || *end || v < lo || v > hi) {
        snprintf(err, n, "plan: %s must be an integer in [%d, %d] (got \"%s\")", key, lo, hi, kv + strlen(key) + 1);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int serve_key(PlanOpts *o, const char *kv, char *err, size_t n)
{
    const char *v = strchr(kv, '=') + 1;
    if (!strncmp(kv, "context=", 8)) return parse_int_key(kv, "context", 1, 1 << 30, &o->context, err, n);
    if (!strncmp(kv, "concurrency=", 12)) return parse_int_key(kv, "concurrency", 1, 4096, &o->concurrency, err, n);
    if (!strncmp(kv, "max_batch_tokens=", 17))
        return parse_int_key(kv, "max_batch_tokens", 1, 1 << 20, &o->max_batch_tokens, err, n);
    if (!strncmp(kv, "prefill_chunk=", 14))
        return parse_int_key(kv, "prefill_chunk", 1, 1 << 20, &o->prefill_chunk, err, n);
    Dtype *t = !strncmp(kv, "dtype=", 6) ? &o->dtype : &o->kv_dtype;
    if (dtype_parse(v, t) || (*t != DTYPE_F32 && *t != DTYPE_BF16 && *t != DTYPE_INT8)) {
        snprintf(err, n, "plan: %.*s must be f32, bf16 or int8 (got \"%s\")", (int)(v - kv - 1), kv, v);
        return -1;
    }
    return 0;
}

static int parse_layout(const char *s, PlanLayout *l, char *err, size_t n)
{
    *l = (PlanLayout){ 1, 1, 1, 1, 1 };
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        int *dst = NULL;
        if (eq) {
            *eq = 0;
            dst = !strcmp(tok, "dp") ? &l->dp : !strcmp(tok, "tp") ? &l->tp : !strcmp(tok, "pp") ? &l->pp
                : !strcmp(tok, "ep") ? &l->ep : !strcmp(tok, "cp") ? &l->cp : NULL;
        }
        char *end = NULL;
        long v = eq ? strtol(eq + 1, &end, 10) : 0;
        if (!dst || end == eq + 1 || *end || v < 1 || v > (1 << 24)) {
            snprintf(err, n, "plan: --layout \"%s\": want dp=N,tp=N,pp=N,ep=N,cp=N with N >= 1", s);
            return -1;
        }
        *dst = (int)v;
    }
    return 0;
}

static double gib(double b) { return b / 1073741824.0; }

static const char *dominant(const PlanResult *r)
{
    int g = 0;
    for (int i = 1; i < PLAN_N_GROUPS; i++)
        if (r->comm[i] > r->comm[g]) g = i;
    return r->comm[g] > 0 ? plan_group_names[g] : "-";
}

static void print_table(const PlanResult *v, int n, int top, const PlanOpts *o)
{
    int n_ok = 0;
    for (int i = 0; i < n; i++) n_ok += v[i].feasible;
    const int cp = n > 0 ? v[0].l.cp : 1;   /* one cp for all: o->cp, or the --layout's */
    char cps[16] = "";
    if (cp > 1) snprintf(cps, sizeof cps, ", cp=%d", cp);
    printf("%d layouts of %d devices of %.0f GiB (%s%s): %d fit\n", n, o->world, gib(o->device_bytes),
           o->mode == PLAN_TRAIN ? "training" : "serving", cps, n_ok);
    printf("%4s %5s %4s %4s %5s | %8s %8s %8s %8s %8s %7s %7s %8s | %9s %10s %5s\n", "rank", "dp", "tp", "pp", "ep",
           "weights", "grads", "optim", "acts", "kv", "comm", "work", "total", "step_s",
           o->mode == PLAN_TRAIN ? "tokens/s" : "tok/s/inst", "comm");
    int shown = 0;
    for (int i = 0; i < n && shown < top; i++) {
        const PlanResult *r = &v[i];
        if (!r->feasible) continue;
        printf("%4d %5d %4d %4d %5d | %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f %7.2f %8.2f | %9.3g %10.4g %5s\n",
               shown + 1, r->l.dp, r->l.tp, r->l.pp, r->l.ep, gib(r->bytes[PLAN_WEIGHTS]), gib(r->bytes[PLAN_GRADIENTS]),
               gib(r->bytes[PLAN_OPTIMIZER]), gib(r->bytes[PLAN_ACTIVATIONS]), gib(r->bytes[PLAN_KV_CACHE]),
               gib(r->bytes[PLAN_COMM]), gib(r->bytes[PLAN_WORKSPACE]), gib(r->bytes[PLAN_TOTAL]), r->est_step_s,
               r->tokens_per_s, dominant(r));
        shown++;
    }
    if (n_ok > shown) printf("... %d more that fit (--top or --json for all)\n", n_ok - shown);
    printf("(GiB per rank, the pipeline stage that needs the most; comm: the group that sends the most)\n");
    /* the smallest infeasible ones, with their reasons */
    int shown_bad = 0;
    for (int i = 0; i < n && shown_bad < 5; i++) {
        if (v[i].feasible) continue;
        if (!shown_bad) printf("do not fit or are refused (%d):\n", n - n_ok);
        printf("  dp=%d tp=%d pp=%d ep=%d cp=%d: %s\n", v[i].l.dp, v[i].l.tp, v[i].l.pp, v[i].l.ep, v[i].l.cp,
               v[i].reason);
        shown_bad++;
    }
    if (n - n_ok > shown_bad) printf("  ... %d more\n", n - n_ok - shown_bad);
}

static void print_json(const PlanResult *v, int n)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const PlanResult *r = &v[i];
        cJSON *o = cJSON_CreateObject(), *l = cJSON_CreateObject(), *b = cJSON_CreateObject(), *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(l, "dp", r->l.dp);
        cJSON_AddNumberToObject(l, "tp", r->l.tp);
        cJSON_AddNumberToObject(l, "pp", r->l.pp);
        cJSON_AddNumberToObject(l, "ep", r->l.ep);
        cJSON_AddNumberToObject(l, "cp", r->l.cp);
        cJSON_AddItemToObject(o, "layout", l);
        cJSON_AddBoolToObject(o, "feasible", r->feasible);
        if (!r->feasible) cJSON_AddStringToObject(o, "reason", r->reason);
        for (int k = 0; k < PLAN_N_CATS; k++) cJSON_AddNumberToObject(b, plan_cat_names[k], r->bytes[k]);
        cJSON_AddItemToObject(o, "per_rank_bytes", b);
        for (int g = 0; g < PLAN_N_GROUPS; g++) cJSON_AddNumberToObject(c, plan_group_names[g], r->comm[g]);
        cJSON_AddItemToObject(o, "comm_bytes_per_step", c);
        cJSON_AddNumberToObject(o, "est_step_s", r->est_step_s);
        cJSON_AddNumberToObject(o, "stage", r->stage);
        if (r->feasible || r->bytes[PLAN_TOTAL] > 0) {
            cJSON *st = cJSON_CreateArray();
            for (int s = 0; r->stage_total[0] > 0 && s < r->l.pp; s++) cJSON_AddItemToArray(st, cJSON_CreateNumber(r->stage_total[s]));
            cJSON_AddItemToObject(o, "stage_total_bytes", st);
        }
        cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
        if (r->expert_slots) cJSON_AddNumberToObject(o, "expert_cache_slots", (double)r->expert_slots);
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_Print(arr);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(arr);
}

static void print_best(const PlanResult *r, const PlanOpts *o)
{
    if (o->mode == PLAN_TRAIN) {
        char cp[16] = "";
        if (r->l.cp > 1) snprintf(cp, sizeof cp, " cp=%d", r->l.cp);
        printf("dp=%d tp=%d pp=%d ep=%d%s zero=%d recompute=%s seq_len=%d micro_batch=%d grad_accum=%d%s\n", r->l.dp,
               r->l.tp, r->l.pp, r->l.ep, cp, o->zero ? 1 : 0,
               o->recompute == RECOMPUTE_FULL ? "full" : o->recompute == RECOMPUTE_SELECTIVE ? "selective" : "none",
               o->seq_len, r->micro_batch, r->grad_accum, o->sp && r->l.tp > 1 ? " sp=true" : "");
        fprintf(stderr, "plan: mpirun -np %d tandem train RUN.json <the line above>\n", o->world);
    } else {
        /* the KV budget the plan counted, in the whole MiB serve takes */
        printf("tp=%d ep=%d --kv-mb %.0f --max-running %d --max-batch-tokens %d --prefill-chunk %d --dtype %s "
               "--kv-dtype %s",
               r->l.tp, r->l.ep, (double)r->kv_mb,
               o->concurrency, o->max_batch_tokens, o->prefill_chunk, dtype_name(o->dtype), dtype_name(o->kv_dtype));
        if (o->expert_cache_bytes > 0) printf(" --expert-cache-mb %.17g", o->expert_cache_bytes / 1048576.0);
        printf("\n");
        fprintf(stderr, "plan: %d instances of mpirun -np %d tandem serve --ckpt CKPT --port P <the line above>\n",
                r->l.dp / r->l.ep, r->l.tp * r->l.ep);
    }
}

int cmd_plan(int argc, char **argv)
{
    static const char *const spec[] = { "world=", "device-mem-gb=", "mode=", "layout=", "json", "best", "top=",
                                        "tflops=", "hbm-gbs=", "intra-gbs=", "inter-gbs=", "node-size=", "expert-cache-mb=", NULL };
    Args ap;
    char err[4096];
    if (args_parse(&ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("plan: %s", err);
        return 2;
    }
    if (ap.help) {
        printf("%s", g_help);
        args_free(&ap);
        return 0;
    }
    int ret = 2;
    PlanOpts o;
    plan_opts_default(&o);
    double world, mem, top, tflops, hbm, intra, inter, node;
    const char *mode = args_str(&ap, "mode", "train");
    char **train_over = td_malloc((size_t)(ap.n_pos + 1) * sizeof(char *));
    int n_train = 0;
    bool kv_given = false;   /* kv_dtype=: else as tandem serve --dtype D holds it (ckpt_serve_kv_auto) */
    RunConfig rc;
    memset(&rc, 0, sizeof rc);
    PlanResult *v = NULL;
    int n = 0;
    if (ap.n_pos < 1 || !args_get(&ap, "world") || !args_get(&ap, "device-mem-gb")) {
        td_error("plan: CONFIG, --world and --device-mem-gb are required (tandem plan --help)");
        goto out;
    }
    if (strcmp(mode, "train") && strcmp(mode, "serve")) {
        td_error("plan: --mode must be train or serve (got \"%s\")", mode);
        goto out;
    }
    o.mode = !strcmp(mode, "train") ? PLAN_TRAIN : PLAN_SERVE;
    if (args_num(&ap, "world", 1, 1, 1 << 24, &world, err, sizeof err) < 0 ||
        args_num(&ap, "device-mem-gb", 80, 1e-6, 1e9, &mem, err, sizeof err) < 0 ||
        args_num(&ap, "top", 10, 1, 1e9, &top, err, sizeof err) < 0 ||
        args_num(&ap, "tflops", o.flops / 1e12, 1e-9, 1e9, &tflops, err, sizeof err) < 0 ||
        args_num(&ap, "hbm-gbs", o.hbm_bps / 1e9, 1e-9, 1e9, &hbm, err, sizeof err) < 0 ||
        args_num(&ap, "intra-gbs", o.intra_bps / 1e9, 1e-9, 1e9, &intra, err, sizeof err) < 0 ||
        args_num(&ap, "inter-gbs", o.inter_bps / 1e9, 1e-9, 1e9, &inter, err, sizeof err) < 0 ||
        args_num(&ap, "node-size", o.node_size, 1, 1 << 20, &node, err, sizeof err) < 0) {
        td_error("plan: %s", err);
        goto out;
    }
    if (world != floor(world) || node != floor(node)) {
        td_error("plan: --world and --node-size must be integers");
        goto out;
    }
    o.world = (int)world;
    o.device_bytes = mem * 1073741824.0;
    o.flops = tflops * 1e12;
    o.hbm_bps = hbm * 1e9;
    o.intra_bps = intra * 1e9;
    o.inter_bps = inter * 1e9;
    o.node_size = (int)node;
    if (args_get(&ap, "expert-cache-mb")) {
        double ec;
        if (o.mode != PLAN_SERVE) {
            td_error("plan: --expert-cache-mb is a serving option (--mode serve)");
            goto out;
        }
        if (args_num(&ap, "expert-cache-mb", 0, 1e-9, 1e12, &ec, err, sizeof err) < 0) {
            td_error("plan: %s", err);
            goto out;
        }
        o.expert_cache_bytes = ec * 1048576.0;
    }
    for (int i = 1; i < ap.n_pos; i++) {
        const char *kv = ap.pos[i];
        if (!strchr(kv, '=')) {
            td_error("plan: unexpected argument \"%s\" (keys are key=value; tandem plan --help)", kv);
            goto out;
        }
        if (!strcmp(kv, "sp=true") || !strcmp(kv, "sp=false")) {
            /* not through the run config, which refuses sp at its tp = 1:
             * here it applies to the layouts with tp > 1 */
            if (o.mode != PLAN_TRAIN) {
                td_error("plan: sp is a training key");
                goto out;
            }
            o.sp = kv[3] == 't';
        } else if (!strncmp(kv, "sp=", 3)) {
            td_error("plan: sp must be true or false (got \"%s\")", kv + 3);
            goto out;
        } else if (!strncmp(kv, "global_batch=", 13)) {
            if (o.mode != PLAN_TRAIN || parse_int_key(kv, "global_batch", 1, 1 << 30, &o.global_batch, err, sizeof err)) {
                td_error("%s", o.mode != PLAN_TRAIN ? "plan: global_batch is a training key" : err);
                goto out;
            }
        } else if (is_serve_key(kv)) {
            if (o.mode != PLAN_SERVE) {
                td_error("plan: %.*s is a serving key (--mode serve)", (int)(strchr(kv, '=') - kv), kv);
                goto out;
            }
            if (serve_key(&o, kv, err, sizeof err)) {
                td_error("%s", err);
                goto out;
            }
            kv_given |= !strncmp(kv, "kv_dtype=", 9);
        } else if (o.mode == PLAN_SERVE) {
            td_error("plan: unknown serving key \"%.*s\" (context, concurrency, max_batch_tokens, prefill_chunk, "
                     "dtype, kv_dtype)", (int)(strchr(kv, '=') - kv), kv);
            goto out;
        } else {
            train_over[n_train++] = (char *)kv;
        }
    }
    if (!kv_given) o.kv_dtype = ckpt_serve_kv_auto(&(ServeDtypes){ .dtype_set = true, .dtype = o.dtype });
    PlanLayout given;
    if (args_get(&ap, "layout") && parse_layout(args_get(&ap, "layout"), &given, err, sizeof err)) {
        td_error("%s", err);
        goto out;
    }
    if (load_config(ap.pos[0], o.mode == PLAN_SERVE, n_train, train_over, &rc, err, sizeof err)) {
        td_error("%s", err);
        goto out;
    }
    if (o.mode == PLAN_TRAIN) {
        o.seq_len = rc.seq_len;
        o.micro_batch = rc.micro_batch;
        o.grad_accum = rc.grad_accum;
        o.recompute = !strcmp(rc.recompute, "full") ? RECOMPUTE_FULL
                    : !strcmp(rc.recompute, "selective") ? RECOMPUTE_SELECTIVE : RECOMPUTE_NONE;
        o.zero = rc.zero != 0;
        o.cp = rc.cp;
    }
    ret = 1;
    if (args_get(&ap, "layout")) {
        v = td_malloc(sizeof *v);
        plan_layout(&rc.model, &o, given, v);
        n = 1;
    } else {
        n = plan_all(&rc.model, &o, &v);
    }
    if (args_flag(&ap, "json")) print_json(v, n);
    else if (!args_flag(&ap, "best")) print_table(v, n, (int)top, &o);
    if (n < 1 || !v[0].feasible) {
        if (n == 1)
            td_error("plan: dp=%d tp=%d pp=%d ep=%d cp=%d: %s", v[0].l.dp, v[0].l.tp, v[0].l.pp, v[0].l.ep, v[0].l.cp,
                     v[0].reason);
        else if (n == 0)
            td_error("plan: no layout of %d devices passes the model's divisibility rules%s", o.world,
                     o.world % o.cp ? " (cp does not divide the world)" : "");
        else
            td_error("plan: no layout of %d devices fits: the smallest, dp=%d tp=%d pp=%d ep=%d cp=%d, %s", o.world,
                     v[0].l.dp, v[0].l.tp, v[0].l.pp, v[0].l.ep, v[0].l.cp, v[0].reason);
        goto out;
    }
    if (args_flag(&ap, "best")) print_best(&v[0], &o);
    ret = 0;
out:
    td_free(v);
    td_free(train_over);
    runcfg_free(&rc);
    args_free(&ap);
    return ret;
}
