/* infer/serve_cmd.c - `tandem serve`: load a checkpoint, start the engine
 * and the OpenAI-compatible HTTP server (server.h), run until SIGTERM or
 * SIGINT, drain, exit 0 (docs/serving.md). */
#include "infer/infer_cmd.h"
#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/common.h"
#include "comm/comm.h"
#include "core/pool.h"
#include "infer/engine.h"
#include "infer/server/server.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_serve_help =
    "usage: tandem serve (--ckpt CKPT | --follow DIR) --port P [--host 127.0.0.1] [--model-name NAME]\n"
    "                    [--kv-mb 256] [--max-running 64] [--max-queue 256]\n"
    "                    [--max-batch-tokens 512] [--prefill-chunk 256] [--max-context N]\n"
    "                    [--max-body 1048576] [--max-n 16] [--max-connections 512]\n"
    "                    [--idle-timeout 60] [--drain-timeout 30] [--quiet]\n"
    "                    [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8] [--expert-cache-mb N]\n"
    "                    [--api-key KEY ...] [--api-key-file FILE] [--no-prefix-cache]\n"
    "                    [--admin-token TOKEN]\n"
    "       mpirun -np N tandem serve --ckpt CKPT --port P tp=T ep=E    (N = T x E)\n"
    "OpenAI-compatible HTTP server: POST /v1/completions and /v1/chat/completions\n"
    "(\"stream\": true for server-sent events), POST /tokenize and /detokenize,\n"
    "GET /v1/models, /health, /metrics (Prometheus).  Text goes through the\n"
    "checkpoint's tokenizer (byte-level when it holds none), chat through its chat\n"
    "template; generation stops at the model's end-of-turn ids.\n"
    "CKPT is a checkpoint file or a run directory (its latest).  --dtype holds the\n"
    "weights in that dtype and computes from them (default: as stored; f16 is\n"
    "upcast to float32); --kv-dtype the KV cache (default auto: bf16 with --dtype\n"
    "bf16|int8 or a file ckpt quantize wrote, f32 otherwise, or the KV dtype the\n"
    "checkpoint's routers were fitted to); the start-up line and /metrics give the\n"
    "bytes a cached token takes.  --expert-cache-mb N holds the routed experts in a\n"
    "cache of N MiB per rank (LRU per layer, read from the checkpoint when routed\n"
    "to; same outputs; /metrics counts hits and misses).\n"
    "--port 0 picks a free\n"
    "port; the start-up line on stderr names it.  SIGTERM or SIGINT drains: new\n"
    "completions get 503, running ones finish (up to --drain-timeout seconds),\n"
    "then the server exits 0.  With --api-key (repeatable) or --api-key-file (a key\n"
    "a line), /v1/*, /tokenize and /detokenize answer 401 unless the request has\n"
    "\"Authorization: Bearer KEY\" with one of the keys; /health and /metrics stay open.\n"
    "Full KV blocks of a prompt prefix are kept and shared by later requests with\n"
    "that prefix (same output bits; /metrics tandem_prefix_cache_*);\n"
    "--no-prefix-cache computes every prompt anew.\n"
    "--max-context N caps the positions a request may reach (prompt + max_tokens;\n"
    "default and most: the model's max_position_embeddings, RoPE scaling included);\n"
    "a longer prompt, or one the whole KV cache (--kv-mb) cannot hold, gets 400\n"
    "naming its length and the limit.  Long prompts are prefilled --prefill-chunk\n"
    "tokens a step (docs/long-context.md).\n"
    "Hot weight reload: --follow DIR serves DIR/latest and switches to each new\n"
    "latest; with --admin-token, POST /v1/admin/reload {\"checkpoint\": FILE} and\n"
    "\"Authorization: Bearer TOKEN\" switches to FILE.  Admission is held while\n"
    "the admitted requests finish on the old weights, then the weights swap and\n"
    "the old prefix cache is dropped; every choice names its weights_step.\n"
    "(One process only for now: not under mpirun.)\n"
    "Under mpirun the model is split over the ranks (tensor parallel over tp,\n"
    "experts over ep); rank 0 serves HTTP and the others follow its schedule.\n"
    "Details: docs/serving.md\n";

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Hot reload (ServerOpts.reload), on the engine thread with no request
 * admitted: the same config only; after a failed load the previous file
 * is loaded again (-2 if that fails too: nothing usable is left). */
typedef struct {
    Model *m;
    char cur[PATH_MAX * 2 + 2];   /* the file being served */
} ServeReload;

static int serve_reload(void *user, const char *file, int64_t *step, char *err, size_t n)
{
    ServeReload *r = user;
    ModelConfig cfg;
    CkptMeta meta;
    if (ckpt_read_config(file, &cfg, &meta, err, n)) return -1;
    char *a = config_to_json(&cfg), *b = config_to_json(&r->m->cfg);
    bool same = !strcmp(a, b);
    td_free(a);
    td_free(b);
    if (!same) {
        snprintf(err, n, "%s has another model config than the one being served", file);
        return -1;
    }
    if (ckpt_load_serving(file, r->m, err, n)) {
        char e2[256];
        if (ckpt_load_serving(r->cur, r->m, e2, sizeof e2)) {
            size_t l = strlen(err);
            snprintf(err + l, n - l, "; reloading %s failed too: %s", r->cur, e2);
            return -2;
        }
        return -1;
    }
    *step = meta.step;
    snprintf(r->cur, sizeof r->cur, "%s", file);
    return 0;
}

/* Under ep, at exit: the rows this rank's routed experts computed; over
 * the ranks they sum to token rows x top-k, each token's expert work done
 * once (tests/mpi/serve_tp.sh adds them up). */
static void ep_report(const Engine *e)
{
    const Model *m = e->m;
    if (m->topo.ep <= 1) return;
    fprintf(stderr, "tandem: serve: rank %d (ep rank %d of %d): routed experts computed %ld rows for %ld token rows "
            "x top-%zu (over the MoE layers)\n", comm_rank(), m->topo.ep_rank, m->topo.ep, e->expert_rows,
            e->token_rows, m->k);
}

/* Base name of a checkpoint file without ".h5". */
static void model_name_of(char *out, size_t n, const char *file)
{
    const char *b = strrchr(file, '/');
    snprintf(out, n, "%s", b ? b + 1 : file);
    size_t l = strlen(out);
    if (l > 3 && !strcmp(out + l - 3, ".h5")) out[l - 3] = 0;
}

static void serve_tp_sum(void *ctx, float *buf, size_t n)
{
    (void)ctx;
    comm_allreduce_f32(COMM_TP, buf, n);
}

static void serve_ep_a2a(void *ctx, const void *send, const size_t *sc, const size_t *sd, void *recv,
                         const size_t *rc, const size_t *rd)
{
    (void)ctx;
    comm_alltoallv(COMM_EP, send, sc, sd, recv, rc, rd);
}

typedef struct {
    const char *name;
    double dflt, lo, hi;
    double v;
} NumOpt;

/* --api-key KEY (repeatable) and --api-key-file FILE (a key a line; empty
 * lines and lines starting with # skipped). */
typedef struct {
    char **v;
    size_t n;
} ApiKeys;

static void api_keys_free(ApiKeys *k)
{
    for (size_t i = 0; i < k->n; i++) td_free(k->v[i]);
    td_free(k->v);
    k->v = NULL;
    k->n = 0;
}

static int api_key_add(ApiKeys *k, const char *key, size_t len, const char *where, char *err, size_t n)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)key[i] <= ' ' || key[i] == 0x7f) {
            snprintf(err, n, "%s: an API key must be printable characters without spaces", where);
            return -1;
        }
    if (!len) {
        snprintf(err, n, "%s: an empty API key", where);
        return -1;
    }
    char **v = td_malloc((k->n + 1) * sizeof *v);
    if (k->n) memcpy(v, k->v, k->n * sizeof *v);
    td_free(k->v);
    k->v = v;
    k->v[k->n] = td_malloc(len + 1);
    memcpy(k->v[k->n], key, len);
    k->v[k->n++][len] = 0;
    return 0;
}

static int api_keys_read(ApiKeys *k, const Args *ap, char *err, size_t n)
{
    const char *const *vals;
    int nv = args_multi(ap, "api-key", &vals);
    for (int i = 0; i < nv; i++)
        if (api_key_add(k, vals[i], strlen(vals[i]), "--api-key", err, n)) goto bad;
    const char *file = args_get(ap, "api-key-file");
    if (file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            snprintf(err, n, "--api-key-file %s: %s", file, strerror(errno));
            goto bad;
        }
        char line[4096];
        int ln = 0, bad_line = 0;
        while (fgets(line, sizeof line, f)) {
            ln++;
            size_t l = strlen(line);
            if (l == sizeof line - 1 && line[l - 1] != '\n') {
                snprintf(err, n, "--api-key-file %s line %d: longer than %zu bytes", file, ln, sizeof line - 2);
                bad_line = 1;
                break;
            }
            while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = 0;
            if (!l || line[0] == '#') continue;
            char where[64];
            snprintf(where, sizeof where, "--api-key-file line %d", ln);
            if (api_key_add(k, line, l, where, err, n)) {
                bad_line = 1;
                break;
            }
        }
        fclose(f);
        if (bad_line) goto bad;
        if (!k->n) {
            snprintf(err, n, "--api-key-file %s holds no key", file);
            goto bad;
        }
    }
    return 0;
bad:
    api_keys_free(k);
    return -1;
}

static int serve_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "port=", "host=", "model-name=", "kv-mb=", "max-running=",
                                        "max-queue=", "max-batch-tokens=", "prefill-chunk=", "max-body=",
                                        "max-n=", "max-connections=", "idle-timeout=", "drain-timeout=",
                                        "quiet", "tp=", "ep=", "dtype=", "kv-dtype=", "expert-cache-mb=", "api-key+", "api-key-file=",
                                        "no-prefix-cache", "follow=", "admin-token=", "max-context=", NULL };
    char err[512];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("serve: %s", err);
        return 2;
    }
    if (ap->help) {
        fputs(g_serve_help, stdout);
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *follow = args_get(ap, "follow");
    if (follow && ckpt) {
        td_error("serve: give --ckpt or --follow, not both (tandem serve --help)");
        return 2;
    }
    if (follow) ckpt = follow;
    if (!ckpt || !args_get(ap, "port")) {
        td_error("serve: --ckpt (or --follow) and --port are required (tandem serve --help)");
        return 2;
    }
    const char *admin = args_get(ap, "admin-token");
    if (admin && !admin[0]) {
        td_error("serve: --admin-token is empty");
        return 2;
    }
    if ((follow || admin) && comm_size() > 1) {
        td_error("serve: --follow and --admin-token (weight reload) need a single process for now, not mpirun");
        return 2;
    }
    enum { PORT, KV, RUN, QUEUE, BATCH, CHUNK, BODY, MAXN, CONNS, IDLE, DRAIN, MAXCTX, N_NUM };
    NumOpt num[N_NUM] = {
        [PORT] = { "port", 0, 0, 65535, 0 },
        [KV] = { "kv-mb", 256, 1, 1 << 20, 0 },
        [RUN] = { "max-running", 64, 1, 4096, 0 },
        [QUEUE] = { "max-queue", 256, 1, 1 << 20, 0 },
        [BATCH] = { "max-batch-tokens", 512, 1, 1 << 20, 0 },
        [CHUNK] = { "prefill-chunk", 256, 1, 1 << 20, 0 },
        [BODY] = { "max-body", 1 << 20, 64, 1 << 30, 0 },
        [MAXN] = { "max-n", 16, 1, 256, 0 },
        [CONNS] = { "max-connections", 512, 1, 65536, 0 },
        [IDLE] = { "idle-timeout", 60, 0, 1e7, 0 },
        [DRAIN] = { "drain-timeout", 30, 0, 1e7, 0 },
        [MAXCTX] = { "max-context", 0, 2, 1 << 30, 0 },   /* 0: the model's max_position_embeddings */
    };
    for (int i = 0; i < N_NUM; i++)
        if (args_num(ap, num[i].name, num[i].dflt, num[i].lo, num[i].hi, &num[i].v, err, sizeof err) < 0) {
            td_error("serve: %s", err);
            return 2;
        }
    /* tp=T ep=E as key=value (like tandem train) or --tp/--ep */
    int tp = 1, ep = 1;
    for (int i = 0; i < ap->n_pos; i++) {
        if (!strncmp(ap->pos[i], "tp=", 3)) tp = atoi(ap->pos[i] + 3);
        else if (!strncmp(ap->pos[i], "ep=", 3)) ep = atoi(ap->pos[i] + 3);
        else {
            td_error("serve: unexpected argument \"%s\" (tandem serve --help)", ap->pos[i]);
            return 2;
        }
    }
    if (args_get(ap, "tp")) tp = atoi(args_get(ap, "tp"));
    if (args_get(ap, "ep")) ep = atoi(args_get(ap, "ep"));
    td_errors_rank0_only = 1;   /* set-up problems are the same on every rank */
    if (tp < 1 || ep < 1 || tp * ep != comm_size()) {
        td_error("serve: tp=%d x ep=%d must equal the number of ranks (%d)", tp, ep, comm_size());
        return 2;
    }
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err) ||
        ckpt_serve_expert_cache(&sd, args_get(ap, "expert-cache-mb"), err, sizeof err)) {
        td_error("serve: %s", err);
        return 2;
    }
    char file[PATH_MAX], name[PATH_MAX];
    if (ckpt_resolve(ckpt, file, sizeof file)) return 1;   /* printed */
    model_name_of(name, sizeof name, file);

    Model m;
    Topology topo, *tptr = NULL;
    if (comm_size() > 1) {
        /* expert groups are carved from dp: dp = ep ranks hold the same
         * tokens and different experts */
        ModelConfig cfg;
        if (ckpt_read_config(file, &cfg, NULL, err, sizeof err) ||
            topo_init(&topo, &cfg, ep, tp, 1, ep, 1, comm_rank(), NULL, err, sizeof err) || comm_setup(&topo)) {
            td_error("serve: %s", err);
            return 1;
        }
        tptr = &topo;
    }
    if (ckpt_open_serving(ckpt, &m, tptr, &sd, err, sizeof err)) {
        if (err[0]) td_error("serve: %s", err);
        return 1;
    }
    CkptText tx;   /* every rank (only rank 0 uses it), so that a bad tokenizer stops them all */
    if (ckpt_open_text(ckpt, false, &tx, err, sizeof err)) {
        td_error("serve: %s", err);
        model_free(&m);
        return 1;
    }
    if (num[MAXCTX].v > m.cfg.max_position_embeddings) {
        /* positions past max_position_embeddings have no RoPE rule the
         * model was given: refused, never computed */
        td_error("serve: --max-context %.0f exceeds the model's max_position_embeddings %d (a longer context needs "
                 "rope_scaling in the model config and max_position_embeddings raised to match)",
                 num[MAXCTX].v, m.cfg.max_position_embeddings);
        ckpt_text_free(&tx);
        model_free(&m);
        return 2;
    }
    td_errors_rank0_only = 0;
    m.comm.tp_allreduce = serve_tp_sum;
    m.comm.ep_alltoallv = serve_ep_a2a;
    m.topo.ep_shared_rows = m.topo.ep > 1;   /* each rank sends only its share of the rows to the experts */
    EngineOpts eo;
    engine_opts_default(&eo);
    eo.kv_budget_bytes = (size_t)num[KV].v << 20;
    eo.max_running = (size_t)num[RUN].v;
    eo.max_queue = (size_t)num[QUEUE].v;
    eo.max_batch_tokens = (size_t)num[BATCH].v;
    eo.prefill_chunk = (size_t)num[CHUNK].v;
    eo.max_context = (size_t)num[MAXCTX].v;
    eo.tok = tx.tok;
    eo.stop_ids = tx.stop_ids;
    eo.n_stop_ids = tx.n_stop_ids;
    eo.prefix_cache = !args_flag(ap, "no-prefix-cache");
    Engine e;
    engine_init(&e, &m, &eo);
    if (comm_rank() > 0) {   /* followers run rank 0's schedule on their shards */
        /* mpirun passes SIGTERM / SIGINT to every rank: rank 0 drains and
         * then releases the followers, which must live until it does */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        engine_follow(&e);
        ep_report(&e);
        engine_free(&e);
        ckpt_text_free(&tx);
        model_free(&m);
        return 0;
    }
    e.distributed = comm_size() > 1;

    ServerOpts so;
    server_opts_default(&so);
    so.host = args_str(ap, "host", so.host);
    so.port = (int)num[PORT].v;
    so.max_body = (size_t)num[BODY].v;
    so.max_n = (int)num[MAXN].v;
    so.max_connections = (int)num[CONNS].v;
    so.idle_timeout = (unsigned)num[IDLE].v;
    so.drain_timeout = num[DRAIN].v;
    so.model_name = args_str(ap, "model-name", name);
    so.quiet = args_flag(ap, "quiet");
    ApiKeys keys = { 0 };
    if (api_keys_read(&keys, ap, err, sizeof err)) {
        td_error("serve: %s", err);
        engine_release_followers(&e);
        engine_free(&e);
        ckpt_text_free(&tx);
        model_free(&m);
        return 2;
    }
    so.api_keys = (const char *const *)keys.v;
    so.n_api_keys = keys.n;
    ServeReload rl = { &m, { 0 } };
    snprintf(rl.cur, sizeof rl.cur, "%s", file);
    so.reload = serve_reload;
    so.reload_user = &rl;
    so.admin_token = admin;
    so.follow_dir = follow;
    {
        ModelConfig c0;
        CkptMeta meta;
        so.weights_step = ckpt_read_config(file, &c0, &meta, err, sizeof err) ? 0 : meta.step;
    }

    /* The signal handlers only set g_stop; the engine loop polls it.  The
     * HTTP threads start with the signals blocked so that they reach this
     * thread; SIGPIPE from a vanished client is ignored everywhere. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    Server *srv;
    int rc = server_start(&srv, &e, &so, err, sizeof err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        td_error("serve: %s", err);
        engine_release_followers(&e);
        engine_free(&e);
        ckpt_text_free(&tx);
        model_free(&m);
        api_keys_free(&keys);
        return 1;
    }
    bool v6 = strchr(so.host, ':') != NULL;
    char wdt[48];   /* "int8", or "int8 (attention bf16)" for a mixed file */
    if (m.dt.attn == m.dt.mat) (void)td_snprintf(wdt, sizeof wdt, "%s", dtype_name(m.dt.mat));
    else (void)td_snprintf(wdt, sizeof wdt, "%s (attention %s)", dtype_name(m.dt.mat), dtype_name(m.dt.attn));
    fprintf(stderr,
            "tandem: serving %s on http://%s%s%s:%d (model \"%s\", context %d, weights %s %.1f MiB, KV cache %s "
            "%d blocks of %zu positions = %zu MiB, %zu bytes per cached token, max running %zu, %d threads)\n",
            file, v6 ? "[" : "", so.host, v6 ? "]" : "", server_port(srv), so.model_name,
            (int)engine_context(&e), wdt, (double)model_weight_bytes(&m) / 1048576.0,
            dtype_name(m.attn.kv), e.kv.n_blocks, e.kv.bs, (kvcache_block_bytes(&e.kv) * (size_t)e.kv.n_blocks) >> 20,
            kvcache_token_bytes(&e.kv), e.o.max_running, pool_threads());
    Dtype fit_kv;
    if (ckpt_router_fit_kv(file, &fit_kv) && fit_kv != m.attn.kv)
        fprintf(stderr, "tandem: serve: note: the routers were fitted for a KV cache in %s (ckpt quantize "
                "--fit-routers), this server holds it in %s: --kv-dtype %s serves what was fitted\n",
                dtype_name(fit_kv), dtype_name(m.attn.kv), dtype_name(fit_kv));
    if (m.ecache)
        fprintf(stderr, "tandem: serve: routed experts offloaded: a cache of %zu slots per MoE layer (%.1f MiB of "
                "the weights above), least recently used evicted\n", m.ecache->slots,
                (double)model_expert_cache_bytes(&m) / 1048576.0);
    const char *ce = server_chat_error(srv);
    fprintf(stderr, "tandem: serve: tokenizer %s (V = %d, %zu stop ids); %s%s\n",
            tok_is_byte_level(tx.tok) ? "byte-level" : "of the checkpoint", tok_vocab_size(tx.tok), tx.n_stop_ids,
            ce ? "chat completions refused: " : "chat template loaded", ce ? ce : "");
    if (keys.n)
        fprintf(stderr, "tandem: serve: %zu API key%s: /v1/*, /tokenize and /detokenize need \"Authorization: Bearer KEY\"\n",
                keys.n, keys.n > 1 ? "s" : "");
    server_run(srv, &g_stop);
    engine_release_followers(&e);
    ep_report(&e);
    server_free(srv);
    api_keys_free(&keys);
    engine_free(&e);
    ckpt_text_free(&tx);
    model_free(&m);
    fprintf(stderr, "tandem: serve: stopped\n");
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    Args a = { 0 };
    int rc = serve_run(&a, argc, argv);
    args_free(&a);
    return rc;
}
