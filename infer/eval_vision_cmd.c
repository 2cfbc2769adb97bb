/* infer/eval_vision_cmd.c - `tandem eval-vision`: a VLM checkpoint answers
 * the questions of an image set (core/image/image_set.h; `tandem data
 * images` output) through the engine, greedy, each answer cut at its first
 * newline; an answer counts when it starts with the expected words (and
 * the next character, if any, is not a letter).  Prints the accuracy per
 * prompt; --min-accuracy fails (exit 1) when a prompt named by --check
 * (every prompt without --check) is below it.  The prompt is laid out as
 * the trainer lays out an image row (train/image_data.h): the image's P
 * placeholders, then tok(prompt + "\n"). */
#include "checkpoint/ckpt_model.h"
#include "checkpoint/ckpt_serve.h"
#include "core/args.h"
#include "core/common.h"
#include "core/image/image_set.h"
#include "core/model/vision.h"
#include "infer/engine.h"
#include "infer/infer_cmd.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char g_help[] =
    "usage: tandem eval-vision --ckpt DIR|FILE --images DIR|FILE.jsonl [--max N] [--batch N]\n"
    "                          [--check PROMPT ...] [--min-accuracy P] [--show N]\n"
    "Answers every question of an image set (`tandem data images` output: DIR/shapes.jsonl)\n"
    "with the checkpoint's VLM through the engine (greedy, up to the answer's first\n"
    "newline) and prints the accuracy per prompt.  An answer counts when it starts with\n"
    "the expected words.  --max N: the first N questions (default all); --batch N:\n"
    "requests in flight (default 32); --min-accuracy P (0..1): exit 1 when a prompt named\n"
    "by --check (default: every prompt) is answered right less often; --show N: print the\n"
    "first N answers.\n";

/* An answer counts when it starts with the expected words. */
static bool answer_ok(const char *got, size_t n, const char *want)
{
    size_t w = strlen(want);
    return n >= w && !memcmp(got, want, w) && (n == w || !isalpha((unsigned char)got[w]));
}

typedef struct {
    const char *prompt;
    size_t right, total;
    bool check;
} PromptTally;

static int eval_vision_run(Args *ap, int argc, char **argv)
{
    static const char *const spec[] = { "ckpt=", "images=", "max=", "batch=", "check+", "min-accuracy=", "show=",
                                        NULL };
    char err[1024];
    if (args_parse(ap, argc, argv, 1, spec, err, sizeof err)) {
        td_error("eval-vision: %s", err);
        return 2;
    }
    if (ap->help) {
        fputs(g_help, stdout);
        return 0;
    }
    const char *ckpt = args_get(ap, "ckpt"), *images = args_get(ap, "images");
    double vmax, vbatch, vmin, vshow;
    if (!ckpt || !images) {
        td_error("eval-vision: --ckpt and --images are required");
        return 2;
    }
    if (args_num(ap, "max", 0, 0, 1e9, &vmax, err, sizeof err) < 0 ||
        args_num(ap, "batch", 32, 1, 4096, &vbatch, err, sizeof err) < 0 ||
        args_num(ap, "min-accuracy", 0, 0, 1, &vmin, err, sizeof err) < 0 ||
        args_num(ap, "show", 0, 0, 1e9, &vshow, err, sizeof err) < 0) {
        td_error("eval-vision: %s", err);
        return 2;
    }
    ServeDtypes sd;
    Model m;
    if (ckpt_serve_dtypes(&sd, NULL, NULL, err, sizeof err) || ckpt_open_serving(ckpt, &m, NULL, &sd, err, sizeof err)) {
        if (err[0]) td_error("eval-vision: %s", err);
        return 1;
    }
    const ModelConfig *c = &m.cfg;
    const size_t P = vision_tokens_per_image(c);
    if (!P) {
        td_error("eval-vision: %s has no vision tower (no vision_config)", ckpt);
        model_free(&m);
        return 2;
    }
    CkptText tx;
    if (ckpt_open_text(ckpt, false, &tx, err, sizeof err)) {
        td_error("eval-vision: %s", err);
        model_free(&m);
        return 1;
    }
    float mean[3], std[3];
    for (int j = 0; j < 3; j++) {
        mean[j] = (float)c->vision_config.image_mean[j];
        std[j] = (float)c->vision_config.image_std[j];
    }
    ImageSet set;
    if (image_set_load(&set, images, (size_t)c->vision_config.image_size, mean, std, err, sizeof err)) {
        td_error("eval-vision: %s", err);
        ckpt_text_free(&tx);
        model_free(&m);
        return 2;
    }
    const size_t n = vmax > 0 && (size_t)vmax < set.n ? (size_t)vmax : set.n;
    PromptTally *pt = td_calloc(set.n * sizeof *pt);
    size_t n_pt = 0;
    size_t *which = td_malloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < n_pt && strcmp(pt[k].prompt, set.ex[i].prompt)) k++;
        if (k == n_pt) pt[n_pt++].prompt = set.ex[i].prompt;
        which[i] = k;
    }
    const char *const *checks = NULL;
    int n_check = args_multi(ap, "check", &checks);
    for (int j = 0; j < n_check; j++) {
        size_t k = 0;
        while (k < n_pt && strcmp(pt[k].prompt, checks[j])) k++;
        if (k == n_pt) {
            td_error("eval-vision: --check \"%s\": no question of %s has that prompt", checks[j], images);
            td_free(which);
            td_free(pt);
            image_set_free(&set);
            ckpt_text_free(&tx);
            model_free(&m);
            return 2;
        }
        pt[k].check = true;
    }
    for (size_t k = 0; k < n_pt && n_check == 0; k++) pt[k].check = true;

    EngineOpts eo;
    engine_opts_default(&eo);
    eo.tok = tx.tok;
    eo.stop_ids = tx.stop_ids;
    eo.n_stop_ids = tx.n_stop_ids;
    eo.max_running = (size_t)vbatch;
    eo.prefix_cache = false;
    Engine e;
    engine_init(&e, &m, &eo);
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.sp.temperature = 0;   /* greedy */
    gp.sp.top_p = 1.0;
    gp.max_tokens = 24;
    gp.n_stop = 1;
    snprintf(gp.stop[0], ENGINE_STOP_LEN, "\n");
    Request **rq = td_calloc(n * sizeof(Request *));
    int rc = 0;
    double t0 = td_now();
    size_t shown = 0;
    for (size_t b0 = 0; b0 < n && rc == 0; b0 += (size_t)vbatch) {
        const size_t b1 = td_min(n, b0 + (size_t)vbatch);
        for (size_t i = b0; i < b1 && rc == 0; i++) {
            char *q = td_sprintf("%s\n", set.ex[i].prompt);
            TokIds ids = { 0 };
            for (size_t t = 0; t < P; t++) tok_ids_push(&ids, c->image_token_index);
            TokIds qi = { 0 };
            if (tok_encode(tx.tok, q, strlen(q), false, &qi, err, sizeof err)) {
                td_error("eval-vision: question %zu: %s", i + 1, err);
                rc = 2;
            }
            for (size_t t = 0; t < qi.n; t++) tok_ids_push(&ids, qi.ids[t]);
            td_free(q);
            tok_ids_free(&qi);
            if (rc) {
                tok_ids_free(&ids);
                break;
            }
            rq[i] = request_new(ids.ids, ids.n, &gp);
            tok_ids_free(&ids);
            request_set_images(rq[i], image_set_pixels(&set, i), 1);
            if (engine_submit(&e, rq[i])) {
                td_error("eval-vision: question %zu: %s", i + 1, rq[i]->error[0] ? rq[i]->error : "refused");
                rc = 2;
            }
        }
        while (rc == 0 && engine_step(&e) > 0) {}
        for (size_t i = b0; i < b1 && rq[i]; i++) {
            const Request *r = rq[i];
            size_t len = r->text.len;
            const char *nl = memchr(r->text.s, '\n', len);
            if (nl) len = (size_t)(nl - r->text.s);
            bool ok = answer_ok(r->text.s, len, set.ex[i].answer);
            pt[which[i]].right += ok;
            pt[which[i]].total++;
            if (shown < (size_t)vshow) {
                printf("%s %s | %s -> \"%.*s\" (want \"%s\")\n", ok ? "ok  " : "MISS", set.ex[i].image,
                       set.ex[i].prompt, (int)len, r->text.s, set.ex[i].answer);
                shown++;
            }
        }
    }
    double el = td_now() - t0;
    if (rc == 0) {
        bool low = false;
        printf("eval-vision: %zu questions about %s in %.1f s\n", n, images, el);
        for (size_t k = 0; k < n_pt; k++) {
            double acc = pt[k].total ? (double)pt[k].right / (double)pt[k].total : 0;
            bool bad = pt[k].check && vmin > 0 && acc < vmin;
            low |= bad;
            printf("  %-28s %5zu / %-5zu %6.1f%%%s\n", pt[k].prompt, pt[k].right, pt[k].total, 100 * acc,
                   bad ? "  BELOW the required" : "");
        }
        if (low) {
            td_error("eval-vision: accuracy below %.1f%% (--min-accuracy)", 100 * vmin);
            rc = 1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (rq[i]) request_free(rq[i]);
    td_free(rq);
    engine_free(&e);
    td_free(which);
    td_free(pt);
    image_set_free(&set);
    ckpt_text_free(&tx);
    model_free(&m);
    return rc;
}

int cmd_eval_vision(int argc, char **argv)
{
    Args a = { 0 };
    int rc = eval_vision_run(&a, argc, argv);
    args_free(&a);
    return rc;
}
