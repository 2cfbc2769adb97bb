/* tests/test_longctx.c - long contexts are exact at every length
 * (issue 19, item 2; docs/long-context.md).
 *
 * A tiny model whose context is stretched by YaRN RoPE scaling (factor 8
 * over 4160 positions: 33280) scores a 32768-token sequence
 *   - in one forward, the training forward (`tandem score`'s path), and
 *   - over the paged KV cache, as the engine runs it, in chunks of sizes
 *     that change every step (1, 7, 16, 100, 1000, 4096, 333 tokens: at every
 *     alignment to the 16-position tiles and blocks), the last 256 tokens
 *     decoded one at a time, and
 *   - batched with a second long sequence of another length (20000 tokens)
 *     whose chunks are of other sizes,
 * and every one of the 32768 (and 20000) log-probabilities must be the
 * same float in every path.  Then the engine itself: a long prompt
 * prefilled in chunks and decoded, alone and beside another long request,
 * and prompts of bs k - 1, bs k and bs k + 1 tokens, against the training
 * forward of the same tokens.  One layer, one kv head of 8 dims, shaped as
 * Qwen3-MoE (per-head q/k RMSNorm, renormalised top-k): the smallest shape
 * whose 32k forward still walks every kernel (GQA, the online softmax over
 * 2048 tiles, the experts), so the suite stays fast.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/model/backprop.h"
#include "core/ops/softmax.h"
#include "core/pool.h"
#include "infer/engine.h"
#include "infer/kvcache.h"
#include "tests/fixture.h"

static void setup(void) { pool_init(1); }

TestSuite(longctx, .init = setup);

#define CTX 33280
#define LONG_T 32768
#define OTHER_T 20000
#define TAIL 256   /* decoded one token at a time */

static void tiny_long(Model *m)
{
    static const char *js = "{\"vocab_size\": 64, \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                            " \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                            " \"moe_intermediate_size\": 16, \"num_local_experts\": 4,"
                            " \"num_experts_per_tok\": 2, \"max_position_embeddings\": 33280,"
                            " \"head_dim\": 8, \"qk_norm\": \"head\", \"norm_topk_prob\": true,"
                            " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8.0,"
                            " \"original_max_position_embeddings\": 4160}}";
    fixture_model(m, js, 11);
}

/* Tokens of a sequence: a generator's, so that attention sees varied keys. */
static int32_t *tokens_of(size_t n, uint64_t seed)
{
    int32_t *t = td_malloc(n * sizeof(int32_t));
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(rng_next(&r) % 64);
    return t;
}

/* logp[t] = log p(tok[t + 1] | tok[0..t]) for t < T, by the training forward. */
static float *score_forward(const Model *m, const int32_t *tok, size_t T)
{
    TrainActs a;
    model_train_acts_init(&a, m, 1, T, RECOMPUTE_NONE);
    model_train_forward(m, &a, tok, tok + 1, T, NULL);
    float *lp = td_malloc(T * sizeof(float));
    memcpy(lp, a.logp, T * sizeof(float));
    model_train_acts_free(&a);
    return lp;
}

/* ---------------------------------------------------------------- the cached forward
 * What engine_forward does (infer/engine.c), with the head on every row: the
 * model's embedding, layers over the paged cache, head and log-softmax. */

typedef struct {
    const Model *m;
    KvCache kv;
    Arena ar;
    LayerActs la;
    float *x, *logits, *rstd, *lse, *lp;
    int32_t *ids, *pos, *tg;
    AttnSeq seqs[2];
    size_t N;
} Cached;

typedef struct {
    const int32_t *tok;
    size_t T, fed;
    KvSeq kv;
    float *logp;   /* (T) */
    const size_t *chunks;   /* chunk sizes, cycled */
    size_t n_chunks, ci;
} Stream;

static void cached_open(Cached *c, const Model *m, size_t N, size_t positions)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->N = N;
    const size_t blocks = positions / m->attn.bs + 4;
    kvcache_init(&c->kv, m, blocks * (size_t)m->cfg.num_hidden_layers * attn_block_bytes(&m->attn));
    Arena dry;
    arena_init_dry(&dry);
    layer_acts_carve(&c->la, &dry, m, N);
    arena_init(&c->ar, dry.used + (N * m->d + N * m->V + 3 * N) * sizeof(float) + 4096);
    layer_acts_carve(&c->la, &c->ar, m, N);
    c->x = arena_floats(&c->ar, N * m->d);
    c->logits = arena_floats(&c->ar, N * m->V);
    c->rstd = arena_floats(&c->ar, N);
    c->lse = arena_floats(&c->ar, N);
    c->lp = arena_floats(&c->ar, N);
    c->ids = td_malloc(N * sizeof(int32_t));
    c->pos = td_malloc(N * sizeof(int32_t));
    c->tg = td_malloc(N * sizeof(int32_t));
}

static void cached_close(Cached *c)
{
    kvcache_free(&c->kv);
    arena_free(&c->ar);
    td_free(c->ids);
    td_free(c->pos);
    td_free(c->tg);
}

/* Next step's rows of s: its next chunk size, the last TAIL one by one. */
static size_t next_take(const Stream *s)
{
    size_t left = s->T - s->fed;
    if (left <= TAIL) return 1;
    return td_min(s->chunks[s->ci % s->n_chunks], left - TAIL);
}

/* One step over the streams that are not done; false when all are. */
static bool cached_step(Cached *c, Stream *const *ss, size_t n)
{
    const Model *m = c->m;
    size_t rows = 0, n_seq = 0;
    Stream *in[2];
    for (size_t i = 0; i < n; i++) {
        Stream *s = ss[i];
        if (s->fed == s->T) continue;
        size_t t = next_take(s);
        cr_assert(rows + t <= c->N, "step of %zu rows, room for %zu", rows + t, c->N);
        cr_assert(kvcache_reserve(&c->kv, &s->kv, s->fed + t), "cache blocks for %zu positions", s->fed + t);
        for (size_t j = 0; j < t; j++) {
            c->ids[rows + j] = s->tok[s->fed + j];
            c->tg[rows + j] = s->tok[s->fed + j + 1];
            c->pos[rows + j] = (int32_t)(s->fed + j);
        }
        c->seqs[n_seq] = (AttnSeq){ rows, t, s->fed, s->kv.blocks };
        in[n_seq++] = s;
        rows += t;
    }
    if (!rows) return false;
    ModelBatch b = { rows, c->ids, c->pos, c->seqs, n_seq, rows, NULL };
    model_embed(m, c->x, c->ids, rows);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        c->la.kv = kvcache_layer(&c->kv, l);
        model_layer_forward(m, l, &b, c->x, c->x, &c->la);
    }
    model_head(m, c->logits, c->la.h1, c->rstd, c->x, rows);
    float *lp = c->lp;
    logsoftmax_xent_forward(lp, c->lse, c->logits, c->tg, rows, m->V);
    for (size_t i = 0; i < n_seq; i++) {
        Stream *s = in[i];
        memcpy(s->logp + s->fed, lp + c->seqs[i].row, c->seqs[i].n * sizeof(float));
        s->fed += c->seqs[i].n;
        s->ci++;
    }
    return true;
}

static void stream_init(Stream *s, const int32_t *tok, size_t T, const size_t *chunks, size_t n_chunks)
{
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->T = T;
    s->logp = td_malloc(T * sizeof(float));
    s->chunks = chunks;
    s->n_chunks = n_chunks;
}

static void expect_bits(const float *got, const float *want, size_t T, const char *what)
{
    size_t bad = 0, first = T;
    for (size_t t = 0; t < T; t++)
        if (memcmp(&got[t], &want[t], sizeof(float))) {
            if (first == T) first = t;
            bad++;
        }
    cr_expect_eq(bad, 0, "%s: %zu of %zu log-probabilities differ from the one forward, first at position %zu "
                 "(%.9g vs %.9g)", what, bad, T, first, first < T ? (double)got[first] : 0.0,
                 first < T ? (double)want[first] : 0.0);
}

Test(longctx, logprobs_of_32k_tokens_are_the_same_bits_in_every_path, .timeout = 600)
{
    Model m;
    tiny_long(&m);
    int32_t *a = tokens_of(LONG_T + 1, 1), *o = tokens_of(OTHER_T + 1, 2);
    float *ref_a = score_forward(&m, a, LONG_T), *ref_o = score_forward(&m, o, OTHER_T);
    for (size_t t = 0; t < LONG_T; t++) cr_assert(isfinite(ref_a[t]), "logp[%zu] = %g", t, (double)ref_a[t]);

    static const size_t cyc_a[] = { 1, 7, 16, 100, 1000, 4096, 333 }, cyc_b[] = { 4096, 15, 1000, 17, 2048 },
                        cyc_o[] = { 1000, 3, 512, 33 };
    Cached c;
    cached_open(&c, &m, 8192, LONG_T + OTHER_T);
    /* alone: chunks of changing sizes, then decode */
    Stream s;
    stream_init(&s, a, LONG_T, cyc_a, 7);
    Stream *one[1] = { &s };
    while (cached_step(&c, one, 1)) {}
    expect_bits(s.logp, ref_a, LONG_T, "chunked prefill (1, 7, 16, 100, 1000, 4096, 333) + 256 decode steps");
    kvcache_release(&c.kv, &s.kv);
    /* batched with a request of another length, chunks of other sizes */
    Stream s2, so;
    stream_init(&s2, a, LONG_T, cyc_b, 5);
    stream_init(&so, o, OTHER_T, cyc_o, 4);
    Stream *two[2] = { &so, &s2 };
    while (cached_step(&c, two, 2)) {}
    expect_bits(s2.logp, ref_a, LONG_T, "32768 tokens batched with 20000 others");
    expect_bits(so.logp, ref_o, OTHER_T, "20000 tokens batched with 32768 others");
    kvcache_release(&c.kv, &s2.kv);
    kvcache_release(&c.kv, &so.kv);
    cached_close(&c);
    td_free(s.logp);
    td_free(s2.logp);
    td_free(so.logp);
    td_free(ref_a);
    td_free(ref_o);
    td_free(a);
    td_free(o);
    model_free(&m);
}

/* ---------------------------------------------------------------- the engine */

static GenParams greedy(int max_tokens)
{
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = max_tokens;
    gp.sp.temperature = 0;
    gp.sp.top_p = 1;
    gp.ignore_eos = true;
    return gp;
}

static void engine_open(Engine *e, const Model *m, size_t chunk, size_t positions, size_t max_context)
{
    EngineOpts o;
    engine_opts_default(&o);
    o.max_running = 4;
    o.max_batch_tokens = 4096;
    o.prefill_chunk = chunk;
    o.prefix_cache = false;
    o.max_context = max_context;
    o.kv_budget_bytes = (positions / m->attn.bs + 1) * (size_t)m->cfg.num_hidden_layers * attn_block_bytes(&m->attn);
    engine_init(e, m, &o);
}

static void run_engine(Engine *e)
{
    for (int s = 0; s < 100000; s++)
        if (engine_step(e) == 0) return;
    cr_assert_fail("the engine did not finish its requests in 100000 steps");
}

/* The engine's tokens and log-probabilities for prompt p of n tokens equal
 * the training forward's over the prompt and what it generated. */
static void expect_engine_is_score(const Model *m, const Request *r, const char *what)
{
    size_t n = r->n_prompt, T = n + r->n_out - 1;
    cr_assert_eq(r->n_out, (size_t)r->gp.max_tokens, "%s: %zu tokens out of %d (%s)", what, r->n_out,
                 r->gp.max_tokens, r->finish_reason);
    int32_t *seq = td_malloc((T + 1) * sizeof(int32_t));
    memcpy(seq, r->prompt, n * sizeof(int32_t));
    memcpy(seq + n, r->out, r->n_out * sizeof(int32_t));
    float *lp = score_forward(m, seq, T);
    expect_bits(r->out_logp, lp + n - 1, r->n_out, what);
    td_free(lp);
    td_free(seq);
}

Test(longctx, engine_long_prompts_alone_and_batched_give_score_bits, .timeout = 600)
{
    Model m;
    tiny_long(&m);
    const size_t LA = 12000, LB = 7001;
    int32_t *pa = tokens_of(LA, 3), *pb = tokens_of(LB, 4);
    GenParams gp = greedy(24);
    Engine e;
    /* alone, chunks of 1000 */
    engine_open(&e, &m, 1000, LA + LB + 64, 0);
    Request *ra = request_new(pa, LA, &gp);
    cr_assert_eq(engine_submit(&e, ra), 0, "%s", ra->error);
    run_engine(&e);
    expect_engine_is_score(&m, ra, "12000-token prompt alone, chunks of 1000");
    engine_free(&e);
    /* together with another long request, chunks of 333 */
    engine_open(&e, &m, 333, LA + LB + 64, 0);
    Request *rb = request_new(pb, LB, &gp), *ra2 = request_new(pa, LA, &gp);
    cr_assert_eq(engine_submit(&e, rb), 0, "%s", rb->error);
    cr_assert_eq(engine_submit(&e, ra2), 0, "%s", ra2->error);
    run_engine(&e);
    EngineStats st;
    engine_stats(&e, &st);
    cr_expect_eq(st.preemptions, 0, "%ld preemptions with room for both", st.preemptions);
    expect_engine_is_score(&m, rb, "7001-token prompt beside a 12000-token one");
    cr_expect(!memcmp(ra->out, ra2->out, ra->n_out * sizeof(int32_t)) &&
                  !memcmp(ra->out_logp, ra2->out_logp, ra->n_out * sizeof(float)),
              "the 12000-token prompt's tokens and log-probabilities change beside another request");
    engine_free(&e);
    request_free(ra);
    request_free(ra2);
    request_free(rb);
    td_free(pa);
    td_free(pb);
    model_free(&m);
}

Test(longctx, kv_block_boundaries_at_every_alignment)
{
    Model m;
    tiny_long(&m);
    const size_t bs = m.attn.bs;
    cr_assert_eq(bs, 16);
    int32_t *p = tokens_of(2 * 1024, 5);
    /* prompts of bs k - 1, bs k, bs k + 1 tokens, prefilled in chunks of
     * bs - 1, bs and bs + 1, each decoding across the next boundaries */
    for (size_t chunk = bs - 1; chunk <= bs + 1; chunk++)
        for (size_t k = 63; k <= 64; k++)
            for (int dl = -1; dl <= 1; dl++) {
                Engine e;
                engine_open(&e, &m, chunk, 2 * 1024, 0);
                size_t n = bs * k + (size_t)(ptrdiff_t)dl;
                GenParams gp = greedy(2 * (int)bs + 3);
                Request *r = request_new(p, n, &gp);
                cr_assert_eq(engine_submit(&e, r), 0, "%s", r->error);
                run_engine(&e);
                char what[96];
                snprintf(what, sizeof what, "prompt of %zu tokens (16 x %zu %+d), chunks of %zu", n, k, dl, chunk);
                expect_engine_is_score(&m, r, what);
                request_free(r);
                engine_free(&e);
            }
    td_free(p);
    model_free(&m);
}

/* A prompt beyond --max-context, or beyond the whole cache, is refused
 * with both numbers; positions past max_position_embeddings are never
 * reached; a request never outgrows the context. */
Test(longctx, refusals_name_the_length_and_the_limit)
{
    Model m;
    tiny_long(&m);
    int32_t *p = tokens_of(CTX + 1, 6);
    char err[256];
    Engine e;
    engine_open(&e, &m, 256, 40000, 0);
    cr_expect_eq(engine_context(&e), (size_t)CTX, "context %zu", engine_context(&e));
    cr_expect_eq(engine_check(&e, p, CTX, 1, err, sizeof err), ENGINE_PROMPT_TOO_LONG);
    cr_expect(strstr(err, "33280 tokens") && strstr(err, "the model's context of 33280"), "%s", err);
    engine_free(&e);
    /* a --max-context above the model's is capped there */
    engine_open(&e, &m, 256, 40000, 1 << 20);
    cr_expect_eq(engine_context(&e), (size_t)CTX, "context %zu under max_context 2^20", engine_context(&e));
    engine_free(&e);
    /* --max-context 1000 */
    engine_open(&e, &m, 256, 40000, 1000);
    cr_expect_eq(engine_check(&e, p, 1000, 1, err, sizeof err), ENGINE_PROMPT_TOO_LONG);
    cr_expect(strstr(err, "1000 tokens") && strstr(err, "--max-context of 1000 positions"), "%s", err);
    cr_expect_eq(engine_check(&e, p, 999, 1, err, sizeof err), ENGINE_OK, "%s", err);
    GenParams gp = greedy(50);
    Request *r = request_new(p, 990, &gp);
    cr_assert_eq(engine_submit(&e, r), 0, "%s", r->error);
    run_engine(&e);
    cr_expect_eq(r->n_out, 10, "%zu tokens out: a request ends at --max-context", r->n_out);
    cr_expect_str_eq(r->finish_reason, "length");
    request_free(r);
    engine_free(&e);
    /* a cache of 1024 positions: a longer prompt is refused naming both */
    engine_open(&e, &m, 256, 1024, 0);
    cr_expect_eq(engine_check(&e, p, 2000, 1, err, sizeof err), ENGINE_PROMPT_NO_ROOM);
    cr_expect(strstr(err, "2000 tokens") && strstr(err, "holds 1040 positions"), "%s", err);
    engine_free(&e);
    td_free(p);
    model_free(&m);
}

/* A long prompt that fits the cache alone but not beside a request admitted
 * before it never takes that request's blocks: the older one runs to its
 * end without being preempted, with the bits it gives alone; the long one
 * waits (preempted, its own blocks freed) and then gives the training
 * forward's bits. */
Test(longctx, a_long_prompt_never_evicts_an_older_request)
{
    Model m;
    tiny_long(&m);
    int32_t *pa = tokens_of(100, 7), *pb = tokens_of(2000, 8);
    GenParams ga = greedy(200), gb = greedy(8);
    Engine e;
    engine_open(&e, &m, 256, 2100, 0);   /* 132 blocks: 299 + 2007 positions do not fit together */
    Request *alone = request_new(pa, 100, &ga);
    cr_assert_eq(engine_submit(&e, alone), 0, "%s", alone->error);
    run_engine(&e);
    Request *ra = request_new(pa, 100, &ga), *rb = request_new(pb, 2000, &gb);
    cr_assert_eq(engine_submit(&e, ra), 0, "%s", ra->error);
    cr_assert_eq(engine_submit(&e, rb), 0, "%s", rb->error);
    run_engine(&e);
    EngineStats st;
    engine_stats(&e, &st);
    cr_expect_gt(st.preemptions, 0, "the cache was meant to be too small for both (no preemption happened)");
    cr_expect_eq(ra->admit_order, alone->admit_order + 1, "the older request was preempted and readmitted");
    cr_expect(ra->n_out == alone->n_out && !memcmp(ra->out, alone->out, ra->n_out * sizeof(int32_t)) &&
                  !memcmp(ra->out_logp, alone->out_logp, ra->n_out * sizeof(float)),
              "the older request's tokens or log-probabilities changed beside the long prompt");
    expect_engine_is_score(&m, rb, "2000-token prompt that waited for the cache");
    request_free(alone);
    request_free(ra);
    request_free(rb);
    engine_free(&e);
    td_free(pa);
    td_free(pb);
    model_free(&m);
}
