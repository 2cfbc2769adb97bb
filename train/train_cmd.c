/* train/train_cmd.c - `tandem train`, `tandem data prepare`, `tandem eval`
 * and `tandem score` (train_cmd.h). */
#include "train/train_cmd.h"
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "comm/comm.h"
#include "core/args.h"
#include "core/model/backprop.h"
#include "core/common.h"
#include "core/model/expert_cache.h"
#include "core/image/shapes.h"
#include "train/data.h"
#include "train/runcfg.h"
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cmd_train(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: tandem train RUN.json [key=value ...]\n"
               "       mpirun -np N tandem train RUN.json dp=.. tp=.. pp=.. ep=..\n"
               "Trains the model of the run config (keys: docs/config.md); any key can be\n"
               "overridden as key=value.  Writes OUT_DIR/metrics.jsonl and checkpoints\n"
               "OUT_DIR/step_*.h5 with OUT_DIR/latest naming the newest.\n");
        return argc < 2 ? 2 : 0;
    }
    const char *path = strchr(argv[1], '=') ? NULL : argv[1];
    int first = path ? 2 : 1;
    RunConfig rc;
    char err[512];
    td_errors_rank0_only = 1;   /* config problems are the same on every rank */
    if (runcfg_load(&rc, path, argc - first, argv + first, err, sizeof err)) {
        td_error("%s", err);
        runcfg_free(&rc);
        return 2;
    }
    int r = train_run(&rc);
    runcfg_free(&rc);
    return r;
}

static int data_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "input+", "output=", "val-fraction=", "tokenizer=", "no-special", NULL };
    char err[1024];
    if (argc >= 2 && !strcmp(argv[1], "images")) return image_data_cmd(argc, argv);
    if (argc < 2 || strcmp(argv[1], "prepare")) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            printf("usage: tandem data prepare --input PATH... --output DATA.bin [--val-fraction 0.05]\n"
                   "                          [--tokenizer DIR|CKPT [--no-special]]\n"
                   "       tandem data images --output DIR --n N [--seed S]\n");
            return 0;
        }
        td_error("usage: tandem data prepare --input PATH... --output DATA.bin [--val-fraction 0.05] [--tokenizer DIR|CKPT]"
                 " | tandem data images --output DIR --n N [--seed S]");
        return 2;
    }
    if (args_parse(ap, argc, argv, 2, spec, err, sizeof err)) {
        td_error("data prepare: %s", err);
        return 2;
    }
    if (ap->help) {
        printf("usage: tandem data prepare --input PATH... --output DATA.bin [--val-fraction 0.05]\n"
               "                          [--tokenizer DIR|CKPT [--no-special]]\n"
               "Byte-level tokens (V = 256) of the inputs (files; directories: their regular\n"
               "files in name order, skipping *.dat indexes and symlinks), or with --tokenizer\n"
               "(an HF directory, or a checkpoint that holds a tokenizer) the ids of each file\n"
               "as HF's tokenizer(text) gives them (--no-special: add_special_tokens=False);\n"
               "the tokenizer's files are stored in DATA.bin, and a run trained on it uses\n"
               "them.  The last val-fraction of every file forms the validation split.\n"
               "Format: docs/data.md\n");
        return 0;
    }
    const char *const *inputs = NULL;
    int n_in = args_multi(ap, "input", &inputs);
    const char *out = args_get(ap, "output");
    double vf;
    if (!n_in || !out) {
        td_error("data prepare: --input and --output are required");
        return 2;
    }
    if (args_num(ap, "val-fraction", 0.05, 0, 0.99, &vf, err, sizeof err) < 0) {
        td_error("data prepare: %s", err);
        return 2;
    }
    const char *tdir = args_get(ap, "tokenizer");
    Tokenizer *tok = NULL;
    if (tdir && ckpt_open_tokenizer_arg(tdir, &tok, err, sizeof err)) {
        td_error("data prepare: %s", err);
        return 1;
    }
    if (!tdir && args_flag(ap, "no-special")) {
        td_error("data prepare: --no-special needs --tokenizer");
        return 2;
    }
    int rc = data_prepare(inputs, n_in, out, vf, tok, !args_flag(ap, "no-special")) ? 1 : 0;
    tok_free(tok);
    return rc;
}

int cmd_data(int argc, char **argv)
{
    Args a = { 0 };
    int rc = data_run(&a, argc, argv);
    args_free(&a);
    return rc;
}

/* Windows of a token sequence, scored B at a time with the training
 * forward (which is what makes score, eval and training agree), on the
 * model as a serving command holds it: --dtype / --kv-dtype (SPEC section
 * 11) give the weights and the keys and values the bits generate and serve
 * compute with, the KV rounding done where they store it too. */
typedef struct {
    Model m;
    TrainActs acts;
    size_t B, T;
    int32_t *ids, *tg;
} Scorer;

static int scorer_open(Scorer *s, const char *ckpt, const ServeDtypes *sd, size_t B, size_t T, char *err, size_t n)
{
    memset(s, 0, sizeof *s);
    if (ckpt_open_serving(ckpt, &s->m, NULL, sd, err, n)) return -1;
    if (T > (size_t)s->m.cfg.max_position_embeddings) {
        snprintf(err, n, "--seq-len %zu exceeds the model's max_position_embeddings %d", T,
                 s->m.cfg.max_position_embeddings);
        model_free(&s->m);
        return -1;
    }
    s->B = B;
    s->T = T;
    model_train_acts_init(&s->acts, &s->m, B, T, RECOMPUTE_NONE);
    s->ids = td_malloc(B * T * sizeof(int32_t));
    s->tg = td_malloc(B * T * sizeof(int32_t));
    return 0;
}

static void scorer_close(Scorer *s)
{
    model_train_acts_free(&s->acts);
    model_free(&s->m);
    td_free(s->ids);
    td_free(s->tg);
}

/* logp (n_win, T) of windows i = [i T, (i+1) T) of tok (len tokens); a
 * partial last batch is padded with copies of window 0 (rows are
 * independent, so padding changes nothing). */
static int score_windows(Scorer *s, const int32_t *tok, size_t len, size_t n_win, float *logp,
                         bool progress_bar)
{
    const size_t B = s->B, T = s->T;
    for (size_t w0 = 0; w0 < n_win; w0 += B) {
        for (size_t r = 0; r < B; r++) {
            size_t w = w0 + r < n_win ? w0 + r : 0;
            for (size_t t = 0; t < T; t++) {
                s->ids[r * T + t] = tok[w * T + t];
                s->tg[r * T + t] = tok[w * T + t + 1];
            }
        }
        for (size_t i = 0; i < B * T; i++)
            if (s->ids[i] < 0 || s->ids[i] >= s->m.cfg.vocab_size || s->tg[i] >= s->m.cfg.vocab_size) {
                td_error("token %d is outside the model's vocabulary (%d)", s->ids[i], s->m.cfg.vocab_size);
                return -1;
            }
        model_train_forward(&s->m, &s->acts, s->ids, s->tg, B * T, NULL);
        if (s->m.ecache && expert_cache_error(s->m.ecache)[0]) {   /* the rows are not the model's */
            if (progress_bar) fprintf(stderr, "\n");
            td_error("expert weights unreadable: %s", expert_cache_error(s->m.ecache));
            return -1;
        }
        size_t nb = td_min(B, n_win - w0);
        memcpy(logp + w0 * T, s->acts.logp, nb * T * sizeof(float));
        if (progress_bar)
            fprintf(stderr, "\rscoring: %zu/%zu windows", w0 + nb, n_win);
    }
    if (progress_bar) fprintf(stderr, "\n");
    (void)len;
    return 0;
}

/* The tokens to score: a token file's (its split), or a text file's as
 * the checkpoint's tokenizer encodes it (HF's tokenizer(text), special
 * tokens as HF adds them: what `data prepare` makes of that one file). */
static int32_t *read_tokens(const char *ckpt, const char *data, const char *text, size_t *len, const char *split,
                            char *err, size_t n)
{
    if (text) {
        FILE *f = fopen(text, "rb");
        if (!f) {
            snprintf(err, n, "cannot open --text %s", text);
            return NULL;
        }
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = td_malloc((size_t)(sz > 0 ? sz : 1));
        size_t got = sz > 0 ? fread(buf, 1, (size_t)sz, f) : 0;
        fclose(f);
        Tokenizer *tok;
        TokIds v = { 0 };
        char why[256];
        int rc = got != (size_t)(sz > 0 ? sz : 0) ? (snprintf(err, n, "cannot read --text %s", text), -1)
                 : ckpt_open_tokenizer(ckpt, &tok, err, n)            ? -1
                                                                      : 0;
        if (rc == 0) {
            if (tok_encode(tok, buf, got, true, &v, why, sizeof why)) {
                snprintf(err, n, "--text %s: %s", text, why);
                rc = -1;
            }
            tok_free(tok);
        }
        td_free(buf);
        if (rc) {
            tok_ids_free(&v);
            return NULL;
        }
        *len = v.n;
        if (!v.ids) v.ids = td_malloc(sizeof(int32_t));
        return v.ids;
    }
    TokenFile tf;
    if (tokfile_open(&tf, data, err, n)) return NULL;
    TokenStream s = { &tf, 0, tf.count };
    if (split && !strcmp(split, "val")) s = tokfile_val(&tf);
    else if (split && !strcmp(split, "train")) s = tokfile_train(&tf);
    int32_t *t = td_malloc((s.len ? s.len : 1) * sizeof(int32_t));
    for (uint64_t i = 0; i < s.len; i++) t[i] = tokfile_get(&tf, s.begin + i);
    *len = s.len;
    tokfile_close(&tf);
    return t;
}

static int score_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "data=", "text=", "seq-len=", "output=", "batch=", "dtype=",
                                        "kv-dtype=", "expert-cache-mb=", NULL };
    char err[512];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("score: %s", err);
        return 2;
    }
    if (ap->help) {
        printf("usage: tandem score --ckpt CKPT (--data DATA.bin | --text FILE) --seq-len T --output OUT.h5 [--batch 8]\n"
               "                    [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8] [--expert-cache-mb N]\n"
               "Scores consecutive whole windows from the start of the token stream: window i\n"
               "has inputs [iT, (i+1)T) and targets [iT+1, (i+1)T+1).  Writes /logprobs [N, T]\n"
               "float32 and the mean loss as the attribute `loss`.  --text FILE is encoded by\n"
               "the checkpoint's tokenizer (byte-level when it holds none).  --dtype and\n"
               "--kv-dtype score with the weights and KV cache `tandem generate` would hold\n"
               "(default: weights as stored, KV auto, as generate's): the log-probabilities\n"
               "are then generate's, bit for bit.\n"
               "tandem score --rollout OUT.jsonl --ckpt CKPT|RUN_DIR checks a `tandem rollout`\n"
               "output against the training forward (tandem score --rollout --help).\n");
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *data = args_get(ap, "data"), *text = args_get(ap, "text");
    const char *out = args_get(ap, "output");
    double T, B;
    if (!ckpt || !out || !!data == !!text) {
        td_error("score: --ckpt, --output and one of --data / --text are required");
        return 2;
    }
    if (args_num(ap, "seq-len", -1, 1, 1 << 20, &T, err, sizeof err) != 0 ||
        args_num(ap, "batch", 8, 1, 4096, &B, err, sizeof err) < 0) {
        td_error("score: %s", args_get(ap, "seq-len") ? err : "--seq-len is required");
        return 2;
    }
    size_t len;
    int32_t *tok = read_tokens(ckpt, data, text, &len, NULL, err, sizeof err);
    if (!tok) {
        td_error("score: %s", err);
        return 1;
    }
    size_t n_win = len > 0 ? (len - 1) / (size_t)T : 0;
    if (n_win == 0) {
        td_error("score: %zu tokens hold no whole window of %zu (+1 target)", len, (size_t)T);
        td_free(tok);
        return 1;
    }
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err) ||
        ckpt_serve_expert_cache(&sd, args_get(ap, "expert-cache-mb"), err, sizeof err)) {
        td_error("score: %s", err);
        td_free(tok);
        return 2;
    }
    Scorer s;
    if (scorer_open(&s, ckpt, &sd, (size_t)B, (size_t)T, err, sizeof err)) {
        if (err[0]) td_error("score: %s", err);
        td_free(tok);
        return 1;
    }
    float *logp = td_malloc(n_win * (size_t)T * sizeof(float));
    int rc = score_windows(&s, tok, len, n_win, logp, isatty(2));
    if (rc == 0) {
        double sum = 0;
        for (size_t i = 0; i < n_win * (size_t)T; i++) sum -= logp[i];
        double loss = sum / (double)(n_win * (size_t)T);
        rc = h5_write_matrix(out, "logprobs", logp, n_win, (size_t)T, "loss", loss, err, sizeof err);
        if (rc) td_error("score: %s", err);
        else printf("{\"windows\":%zu,\"seq_len\":%zu,\"loss\":%.6f,\"perplexity\":%.4f,\"output\":\"%s\"}\n",
                    n_win, (size_t)T, loss, exp(loss), out);
    }
    td_free(logp);
    td_free(tok);
    scorer_close(&s);
    return rc ? 1 : 0;
}

int cmd_score(int argc, char **argv)
{
    Args a = { 0 };
    int rc = score_run(&a, argc, argv);
    args_free(&a);
    return rc;
}

static int eval_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "data=", "text=", "seq-len=", "batch=", "split=", "max-windows=",
                                        "dtype=", "kv-dtype=", "expert-cache-mb=", NULL };
    char err[512];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("eval: %s", err);
        return 2;
    }
    if (ap->help) {
        printf("usage: tandem eval --ckpt CKPT (--data DATA.bin [--split val|train|all] | --text FILE)\n"
               "                   [--seq-len 256] [--batch 8] [--max-windows N]\n"
               "                   [--dtype f32|bf16|int8] [--kv-dtype auto|f32|bf16|int8] [--expert-cache-mb N]\n"
               "Mean loss and perplexity over consecutive windows of the split (default val),\n"
               "printed as one JSON object.\n");
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *data = args_get(ap, "data"), *text = args_get(ap, "text");
    const char *split = args_str(ap, "split", "val");
    double T, B, maxw;
    if (!ckpt || !!data == !!text) {
        td_error("eval: --ckpt and one of --data / --text are required");
        return 2;
    }
    if (strcmp(split, "val") && strcmp(split, "train") && strcmp(split, "all")) {
        td_error("eval: --split must be val, train or all");
        return 2;
    }
    if (args_num(ap, "seq-len", 256, 1, 1 << 20, &T, err, sizeof err) < 0 ||
        args_num(ap, "batch", 8, 1, 4096, &B, err, sizeof err) < 0 ||
        args_num(ap, "max-windows", 1e12, 1, 1e12, &maxw, err, sizeof err) < 0) {
        td_error("eval: %s", err);
        return 2;
    }
    size_t len;
    int32_t *tok = read_tokens(ckpt, data, text, &len, split, err, sizeof err);
    if (!tok) {
        td_error("eval: %s", err);
        return 1;
    }
    size_t n_win = len > 0 ? (len - 1) / (size_t)T : 0;
    if (n_win > (size_t)maxw) n_win = (size_t)maxw;
    if (n_win == 0) {
        td_error("eval: the %s split (%zu tokens) holds no whole window of %zu", split, len, (size_t)T);
        td_free(tok);
        return 1;
    }
    ServeDtypes sd;
    if (ckpt_serve_dtypes(&sd, args_get(ap, "dtype"), args_get(ap, "kv-dtype"), err, sizeof err) ||
        ckpt_serve_expert_cache(&sd, args_get(ap, "expert-cache-mb"), err, sizeof err)) {
        td_error("eval: %s", err);
        td_free(tok);
        return 2;
    }
    Scorer s;
    if (scorer_open(&s, ckpt, &sd, (size_t)B, (size_t)T, err, sizeof err)) {
        if (err[0]) td_error("eval: %s", err);
        td_free(tok);
        return 1;
    }
    float *logp = td_malloc(n_win * (size_t)T * sizeof(float));
    int rc = score_windows(&s, tok, len, n_win, logp, isatty(2));
    if (rc == 0) {
        double sum = 0;
        for (size_t i = 0; i < n_win * (size_t)T; i++) sum -= logp[i];
        double loss = sum / (double)(n_win * (size_t)T);
        printf("{\"split\":\"%s\",\"windows\":%zu,\"tokens\":%zu,\"loss\":%.6f,\"perplexity\":%.4f}\n", split,
               n_win, n_win * (size_t)T, loss, exp(loss));
    }
    td_free(logp);
    td_free(tok);
    scorer_close(&s);
    return rc ? 1 : 0;
}

int cmd_eval(int argc, char **argv)
{
    Args a = { 0 };
    int rc = eval_run(&a, argc, argv);
    args_free(&a);
    return rc;
}
