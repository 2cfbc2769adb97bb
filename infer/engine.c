/* infer/engine.c - continuous batching over the paged KV cache (engine.h). */
#include "infer/engine.h"
#include "comm/comm.h"
#include "core/common.h"
#include "core/model/vision.h"
#include "core/rng.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void engine_opts_default(EngineOpts *o)
{
    memset(o, 0, sizeof *o);   /* no tokenizer (byte-level), no stop ids */
    o->kv_budget_bytes = (size_t)256 << 20;
    o->max_batch_tokens = 512;
    o->prefill_chunk = 256;
    o->max_running = 64;
    o->max_queue = 256;
    o->prefix_cache = true;
}

static uint64_t version_seed(uint64_t v)
{
    uint64_t z = v + 0x9e3779b97f4a7c15ULL;   /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void opts_fix(EngineOpts *o)
{
    if (o->max_batch_tokens < o->max_running) o->max_batch_tokens = o->max_running;
    if (o->prefill_chunk < 1) o->prefill_chunk = 1;
}

size_t engine_context(const Engine *e)
{
    const size_t model = (size_t)e->m->cfg.max_position_embeddings;
    return e->o.max_context && e->o.max_context < model ? e->o.max_context : model;
}

/* The activation arena of a batch of max_batch_tokens rows (o fixed). */
static size_t arena_need(const Model *m, const EngineOpts *o)
{
    const size_t N = o->max_batch_tokens;
    LayerActs la;
    Arena dry;
    arena_init_dry(&dry);
    layer_acts_carve(&la, &dry, m, N);
    return dry.used + 4 * N * m->d * sizeof(float) + o->max_running * m->V * sizeof(float) + 4096;
}

void engine_mem(const Model *m, const EngineOpts *opts, EngineMem *out)
{
    EngineOpts o = *opts;
    opts_fix(&o);
    memset(out, 0, sizeof *out);
    size_t n_moe = 0;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) n_moe += m->layers[l].moe;
    const size_t N = o.max_batch_tokens, R = o.max_running;
    out->kv_cache = kvcache_bytes(m, o.kv_budget_bytes, &out->kv_blocks);
    out->activations = td_round_up(arena_need(m, &o), 64);
    /* engine_init's tables, in its order */
    out->workspace = 2 * N * sizeof(int32_t) + R * sizeof(int32_t) + (R * n_moe * m->k + 1) * sizeof(int32_t) +
                     (n_moe * m->E_global + 1) * sizeof(int64_t) + (n_moe + 1) * sizeof(int) /* expert load */ +
                     R * sizeof(AttnSeq) + 2 * R * sizeof(Request *) + sampler_scratch_bytes(m->V) +
                     (o.n_stop_ids + 1) * sizeof(int32_t) + 2 * (size_t)m->attn.bs * sizeof(int32_t) /* blk_tok */;
}

void engine_init(Engine *e, const Model *m, const EngineOpts *o)
{
    memset(e, 0, sizeof *e);
    e->m = m;
    e->o = *o;
    opts_fix(&e->o);
    kvcache_init(&e->kv, m, o->kv_budget_bytes);
    const size_t N = e->o.max_batch_tokens, d = m->d, V = m->V;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) e->n_moe += m->layers[l].moe;
    arena_init(&e->arena, arena_need(m, &e->o));
    layer_acts_carve(&e->la, &e->arena, m, N);
    e->x = arena_floats(&e->arena, N * d);
    e->hn = arena_floats(&e->arena, N * d);
    e->rstd = arena_floats(&e->arena, N);
    e->logits = arena_floats(&e->arena, e->o.max_running * V);
    e->ids = td_malloc(N * sizeof(int32_t));
    e->pos = td_malloc(N * sizeof(int32_t));
    e->sel_rows = td_malloc(e->o.max_running * sizeof(int32_t));
    e->routes = td_malloc((e->o.max_running * (size_t)e->n_moe * m->k + 1) * sizeof(int32_t));
    e->expert_tok = td_calloc(((size_t)e->n_moe * m->E_global + 1) * sizeof(int64_t));
    e->moe_layer = td_malloc(((size_t)e->n_moe + 1) * sizeof(int));
    for (int l = m->topo.layer_begin, mi = 0; l < m->topo.layer_end; l++)
        if (m->layers[l].moe) e->moe_layer[mi++] = l;
    e->seqs = td_malloc(e->o.max_running * sizeof(AttnSeq));
    e->batch = td_malloc(e->o.max_running * sizeof(Request *));
    e->running = td_malloc(e->o.max_running * sizeof(Request *));
    e->sample_scratch = td_malloc(sampler_scratch_bytes(V));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->st.kv_total = e->kv.n_blocks;
    e->tok = o->tok;
    if (!e->tok) e->tok = e->own_tok = tok_byte_level();
    e->stop_ids = td_malloc((o->n_stop_ids + 1) * sizeof(int32_t));
    for (size_t i = 0; i < o->n_stop_ids; i++) {
        size_t j = 0;
        while (j < e->n_stop_ids && e->stop_ids[j] != o->stop_ids[i]) j++;
        if (j == e->n_stop_ids) e->stop_ids[e->n_stop_ids++] = o->stop_ids[i];
    }
    qsort(e->stop_ids, e->n_stop_ids, sizeof(int32_t), cmp_i32);
    e->st.kv_token_bytes = kvcache_token_bytes(&e->kv);
    e->st.weight_bytes = model_weight_bytes(m);
    e->st.expert_slots = m->ecache ? m->ecache->slots : 0;
    e->st.expert_cache_bytes = model_expert_cache_bytes(m);
    e->prefix_seed = version_seed(o->weights_version);
    e->blk_tok = td_malloc(2 * e->kv.bs * sizeof(int32_t));
    /* a ring only when no local layer needs the keys below the window (a
     * block id indexes every layer's pool); mixed layers keep every block
     * and get the window's compute saving only */
    e->ring = m->layers[m->topo.layer_begin].window;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++)
        if (m->layers[l].window != e->ring) e->ring = 0;
}

void engine_set_weights_version(Engine *e, uint64_t version)
{
    e->o.weights_version = version;
    e->prefix_seed = version_seed(version);
    kvcache_drop_cached(&e->kv);
}

void engine_free(Engine *e)
{
    if (!e->m) return;
    kvcache_free(&e->kv);
    arena_free(&e->arena);
    td_free(e->ids);
    td_free(e->pos);
    td_free(e->sel_rows);
    td_free(e->routes);
    td_free(e->expert_tok);
    td_free(e->moe_layer);
    td_free(e->seqs);
    td_free(e->batch);
    td_free(e->running);
    td_free(e->sample_scratch);
    td_free(e->stop_ids);
    td_free(e->blk_tok);
    tok_free(e->own_tok);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    memset(e, 0, sizeof *e);
}

Request *request_new(const int32_t *prompt, size_t n_prompt, const GenParams *gp)
{
    Request *r = td_calloc(sizeof *r);
    r->prompt = td_malloc((n_prompt ? n_prompt : 1) * sizeof(int32_t));
    memcpy(r->prompt, prompt, n_prompt * sizeof(int32_t));
    r->n_prompt = n_prompt;
    r->gp = *gp;
    if (r->gp.n_top > SAMPLER_TOP_MAX) r->gp.n_top = SAMPLER_TOP_MAX;
    rng_seed(&r->rng, gp->seed);
    atomic_store(&r->state, REQ_WAITING);
    return r;
}

void request_free(Request *r)
{
    if (!r) return;
    td_free(r->prompt);
    td_free(r->pixels);
    td_free(r->img);
    td_free(r->img_row);
    td_free(r->out);
    td_free(r->out_logp);
    td_free(r->out_top);
    td_free(r->routes);
    td_free(r->kv.blocks);
    td_free(r->out_off);
    td_free(r->raw_end);
    tok_text_free(&r->text);
    tok_text_free(&r->raw);
    tok_stream_free(r->ts);
    td_free(r);
}

/* FNV-1a over bytes, then mixed: the prefix-cache seed of a request's images. */
static uint64_t bytes_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return rng_mix64(h);
}

int request_set_images(Request *r, const float *pixels, size_t n_img)
{
    r->pixels_in = pixels;
    r->n_img = n_img;
    return 0;
}

/* engine_submit: r's own copy of its images, and their hash. */
static void copy_images(const Engine *e, Request *r)
{
    const size_t S = e->m->vis.S, n = r->n_img * 3 * S * S;
    td_free(r->pixels);
    r->pixels = td_malloc((n ? n : 1) * sizeof(float));
    memcpy(r->pixels, r->pixels_in, n * sizeof(float));
    r->pixels_in = NULL;
    r->img_seed = bytes_hash(0xcbf29ce484222325ULL ^ r->n_img, r->pixels, n * sizeof(float));
}

/* The images of r against its prompt and the model (engine_submit). */
static EngineRefusal image_check(const Engine *e, const Request *r, char *err, size_t err_len)
{
    const ModelConfig *c = &e->m->cfg;
    const size_t P = vision_tokens_per_image(c);
    size_t n_ph = 0;
    for (size_t i = 0; i < r->n_prompt && P; i++) n_ph += r->prompt[i] == c->image_token_index;
    if (r->n_img && !P) {
        snprintf(err, err_len, "the request has %zu image(s); the model has no vision tower", r->n_img);
        return ENGINE_BAD_IMAGE;
    }
    if (n_ph != r->n_img * P) {
        snprintf(err, err_len,
                 "the prompt has %zu image placeholder tokens (id %d); %zu image(s) need %zu (%zu each)", n_ph,
                 c->image_token_index, r->n_img, r->n_img * P, P);
        return ENGINE_BAD_IMAGE;
    }
    if (r->n_img && e->distributed) {
        snprintf(err, err_len, "images are not served under tensor or expert parallelism yet");
        return ENGINE_BAD_IMAGE;
    }
    return ENGINE_OK;
}

EngineRefusal engine_check(const Engine *e, const int32_t *prompt, size_t n_prompt, int max_tokens, char *err,
                           size_t err_len)
{
    const int V = e->m->cfg.vocab_size;
    const size_t ctx = engine_context(e);
    const bool own = ctx < (size_t)e->m->cfg.max_position_embeddings;   /* --max-context binds */
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            snprintf(err, err_len, "prompt token id %d at position %zu is outside the vocabulary (vocab_size %d)",
                     (int)prompt[i], i, V);
            return ENGINE_BAD_TOKEN;
        }
    if (n_prompt == 0) {
        snprintf(err, err_len, "the prompt is empty");
        return ENGINE_EMPTY_PROMPT;
    }
    if (n_prompt >= ctx) {
        snprintf(err, err_len, "the prompt has %zu tokens; %s of %zu positions leaves room for at most %zu",
                 n_prompt, own ? "the server's --max-context" : "the model's context", ctx, ctx - 1);
        return ENGINE_PROMPT_TOO_LONG;
    }
    /* positions whose keys and values are cached at most: every token but
     * the last one sampled (a request ends at max_tokens or at the context) */
    size_t gen = max_tokens > 0 ? (size_t)max_tokens : 1;
    size_t held = td_min(n_prompt + gen, ctx) - 1;
    size_t whole = (size_t)e->kv.n_blocks * e->kv.bs;
    if (!e->ring && n_prompt > whole) {   /* (a windowed model keeps a ring: its prompt may be longer) */
        snprintf(err, err_len, "the prompt has %zu tokens; the whole KV cache holds %zu positions (%d blocks of %zu)",
                 n_prompt, whole, (int)e->kv.n_blocks, e->kv.bs);
        return ENGINE_PROMPT_NO_ROOM;
    }
    if (kvcache_ring_blocks(&e->kv, e->ring, e->o.prefill_chunk, held) > e->kv.n_blocks) {
        snprintf(err, err_len,
                 "the prompt (%zu tokens) plus max_tokens (%d) needs %zu positions of KV cache; the whole cache "
                 "holds %zu (%d blocks of %zu)",
                 n_prompt, max_tokens, held, whole, (int)e->kv.n_blocks, e->kv.bs);
        return ENGINE_NO_ROOM;
    }
    return ENGINE_OK;
}

int engine_submit(Engine *e, Request *r)
{
    r->refusal = engine_check(e, r->prompt, r->n_prompt, r->gp.max_tokens, r->error, sizeof r->error);
    if (r->refusal == ENGINE_OK) r->refusal = image_check(e, r, r->error, sizeof r->error);
    if (r->refusal != ENGINE_OK) return -2;
    if (r->n_img && r->pixels_in) copy_images(e, r);
    r->t_submit = td_now();
    pthread_mutex_lock(&e->mu);
    if (e->st.waiting >= e->o.max_queue) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    r->next = NULL;
    if (e->q_tail) e->q_tail->next = r;
    else e->q_head = r;
    e->q_tail = r;
    e->st.waiting++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_cancel(Request *r) { atomic_store(&r->cancel, true); }

void engine_wait(Engine *e, int timeout_ms)
{
    pthread_mutex_lock(&e->mu);
    if (!e->q_head && !e->n_running) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
}

const int64_t *engine_expert_tokens(const Engine *e, const int **layers)
{
    if (layers) *layers = e->moe_layer;
    return e->n_moe ? e->expert_tok : NULL;
}

void engine_stats(Engine *e, EngineStats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->kv_used = kvcache_used(&e->kv);
    out->kv_cached = e->kv.n_cached;
    out->prefix_blocks = e->kv.n_reg;
    out->running = e->n_running;
    pthread_mutex_unlock(&e->mu);
}

/* ---------------------------------------------------------------- helpers */

static inline int32_t token_at(const Request *r, size_t i)
{
    return i < r->n_prompt ? r->prompt[i] : r->out[i - r->n_prompt];
}

/* ---------------------------------------------------------------- prefix cache */

/* Copies the tokens of r's block j into out (bs of them, all known). */
static const int32_t *block_tokens(const Engine *e, const Request *r, int32_t j, int32_t *out)
{
    const size_t bs = e->kv.bs, p0 = (size_t)j * bs;
    for (size_t i = 0; i < bs; i++) out[i] = token_at(r, p0 + i);
    return out;
}

/* A chain starts at the engine's seed (its weights), mixed with the
 * request's images when it has any: blocks are shared only between
 * requests with the same tokens and the same images. */
static uint64_t chain_parent(const Engine *e, const Request *r)
{
    const KvSeq *s = &r->kv;
    if (s->n_chained) return s->h_last;
    return r->n_img ? rng_mix64(e->prefix_seed ^ r->img_seed) : e->prefix_seed;
}

/* Whether r stands at a block boundary with its next block matchable: all
 * its positions in full chained blocks and a whole block of known tokens
 * beyond them that is not the one holding its last known token. */
static bool at_boundary(const Engine *e, const Request *r)
{
    const KvSeq *s = &r->kv;
    const size_t bs = e->kv.bs;
    return r->n_fed == (size_t)s->n_blocks * bs && s->n_chained == s->n_blocks &&
           r->n_fed + bs + 1 <= r->n_prompt + r->n_out;
}

/* Takes r's next blocks from the cache while they are registered; counts
 * the hits.  The first time after admission also counts the query. */
static void prefix_extend(Engine *e, Request *r, long *query, long *hit)
{
    if (!r->pc_seen) {
        r->pc_seen = true;
        *query += (long)(r->n_prompt + r->n_out);
    }
    while (at_boundary(e, r)) {
        KvSeq *s = &r->kv;
        uint64_t parent = chain_parent(e, r);
        const int32_t *t = block_tokens(e, r, s->n_blocks, e->blk_tok);
        uint64_t h = kvcache_block_hash(parent, t, e->kv.bs);
        int32_t b = kvcache_lookup(&e->kv, h, parent, t);
        if (b < 0) break;
        kvcache_attach(&e->kv, s, b);
        s->n_chained++;
        s->h_last = h;
        r->n_fed += e->kv.bs;
        *hit += (long)e->kv.bs;
    }
}

/* Whether r's next block is computed this step by a request earlier in the
 * batch (running[0..i), rows take[]) from the same prefix: then r waits a
 * step and takes it from the cache. */
static bool prefix_wait(const Engine *e, size_t i, const size_t *take)
{
    const Request *r = e->running[i];
    if (!at_boundary(e, r)) return false;
    const size_t bs = e->kv.bs;
    const int32_t *t = block_tokens(e, r, r->kv.n_blocks, e->blk_tok);
    for (size_t j = 0; j < i; j++) {
        const Request *a = e->running[j];
        if (take[j] < bs || a->n_fed != r->n_fed || a->kv.n_chained != r->kv.n_chained ||
            chain_parent(e, a) != chain_parent(e, r) || a->n_fed % bs != 0)
            continue;
        const int32_t *u = block_tokens(e, a, (int32_t)(a->n_fed / bs), e->blk_tok + bs);
        if (!memcmp(t, u, bs * sizeof(int32_t))) return true;
    }
    return false;
}

/* Registers the blocks of r that its fed positions now fill. */
static void prefix_register(Engine *e, Request *r)
{
    KvSeq *s = &r->kv;
    const size_t bs = e->kv.bs;
    while ((size_t)(s->n_chained + 1) * bs <= r->n_fed && s->n_chained < s->n_blocks) {
        uint64_t parent = chain_parent(e, r);
        const int32_t *t = block_tokens(e, r, s->n_chained, e->blk_tok);
        uint64_t h = kvcache_block_hash(parent, t, bs);
        kvcache_register(&e->kv, s->blocks[s->n_chained], h, parent, t);
        s->n_chained++;
        s->h_last = h;
    }
}

/* A ring (e->ring): drops r's blocks below the first key its next query
 * (position n_fed) sees.  After prefix_register: every dropped block is
 * full and already registered. */
static void ring_trim(Engine *e, Request *r)
{
    if (!e->ring) return;
    const size_t p = r->n_fed;
    kvcache_trim(&e->kv, &r->kv, p + 1 > e->ring ? p + 1 - e->ring : 0);
}

static void finish(Engine *e, Request *r, const char *reason)
{
    snprintf(r->finish_reason, sizeof r->finish_reason, "%s", reason);
    if (!r->ts) r->ts = tok_stream_new(e->tok, true);
    tok_stream_finish(r->ts, &r->text);   /* NUL-terminates an empty text too */
    r->n_safe = r->n_out;
    r->text_safe = r->text.len;
    kvcache_release(&e->kv, &r->kv);
    /* remove from running, keeping admission order */
    size_t j = 0;
    for (size_t i = 0; i < e->n_running; i++)
        if (e->running[i] != r) e->running[j++] = e->running[i];
    pthread_mutex_lock(&e->mu);
    e->n_running = j;
    e->st.requests_done++;
    pthread_mutex_unlock(&e->mu);
    atomic_store(&r->state, REQ_DONE);
    if (r->cb) r->cb(r, true, r->user);
}

/* Frees the youngest running request's blocks and puts it back at the
 * front of the queue; it will be recomputed (same bits). */
static Request *preempt_youngest(Engine *e)
{
    if (!e->n_running) return NULL;
    Request *r = e->running[e->n_running - 1];   /* admission order: the youngest */
    kvcache_release(&e->kv, &r->kv);
    r->n_fed = 0;
    r->pc_seen = false;
    pthread_mutex_lock(&e->mu);
    e->n_running--;
    r->next = e->q_head;
    e->q_head = r;
    if (!e->q_tail) e->q_tail = r;
    e->st.waiting++;
    e->st.preemptions++;
    pthread_mutex_unlock(&e->mu);
    atomic_store(&r->state, REQ_WAITING);
    return r;
}

void engine_hold(Engine *e, bool hold)
{
    pthread_mutex_lock(&e->mu);
    e->hold = hold;
    pthread_mutex_unlock(&e->mu);
}

size_t engine_admitted_live(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    size_t n = e->n_running;
    for (const Request *r = e->q_head; r; r = r->next) n += r->admit_order != 0;
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* Cancelled requests still in the queue (never admitted, or preempted)
 * finish now, in queue order, before anything is admitted: a request whose
 * client left never takes a slot or computes a row. */
static void drop_cancelled_waiting(Engine *e)
{
    Request *gone = NULL, **tail = &gone, *last = NULL;
    pthread_mutex_lock(&e->mu);
    for (Request **at = &e->q_head; *at;) {
        Request *r = *at;
        if (atomic_load(&r->cancel)) {
            *at = r->next;
            e->st.waiting--;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
        } else {
            last = r;
            at = &r->next;
        }
    }
    e->q_tail = last;
    pthread_mutex_unlock(&e->mu);
    while (gone) {
        Request *r = gone;
        gone = r->next;
        r->next = NULL;
        finish(e, r, "cancelled");
    }
}

/* Encodes r's images (once: a preempted request keeps them) and maps its
 * placeholder positions to their rows. */
static void admit_images(Engine *e, Request *r)
{
    const Model *m = e->m;
    r->img = td_malloc(r->n_img * m->vis.P * m->d * sizeof(float));
    model_vision_encode(m, r->pixels, r->n_img, r->img);
    r->img_row = td_malloc(r->n_prompt * sizeof(int32_t));
    int32_t j = 0;
    for (size_t i = 0; i < r->n_prompt; i++) r->img_row[i] = r->prompt[i] == m->cfg.image_token_index ? j++ : -1;
}

static void admit(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    while (e->q_head && e->n_running < e->o.max_running) {
        Request *r = e->q_head;
        /* held: only preempted requests (admitted before) come back; they
         * sit at the front of the queue */
        if (e->hold && r->admit_order == 0) break;
        e->q_head = r->next;
        if (!e->q_head) e->q_tail = NULL;
        e->st.waiting--;
        r->next = NULL;
        r->admit_order = ++e->admit_counter;
        if (r->t_admit == 0) r->t_admit = td_now();
        e->running[e->n_running++] = r;
        if (r->n_img && !r->img) admit_images(e, r);
        atomic_store(&r->state, REQ_RUNNING);
    }
    pthread_mutex_unlock(&e->mu);
}

static void append_token(Engine *e, Request *r, const Sampled *s, const int32_t *route)
{
    if (r->n_out == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        int32_t *o = td_malloc(cap * sizeof(int32_t));
        float *lp = td_malloc(cap * sizeof(float));
        if (r->n_out) {
            memcpy(o, r->out, r->n_out * sizeof(int32_t));
            memcpy(lp, r->out_logp, r->n_out * sizeof(float));
        }
        size_t *off = td_malloc(cap * sizeof(size_t)), *re = td_malloc(cap * sizeof(size_t));
        if (r->n_out) {
            memcpy(off, r->out_off, r->n_out * sizeof(size_t));
            memcpy(re, r->raw_end, r->n_out * sizeof(size_t));
        }
        td_free(r->out);
        td_free(r->out_logp);
        td_free(r->out_off);
        td_free(r->raw_end);
        r->out = o;
        r->out_logp = lp;
        r->out_off = off;
        r->raw_end = re;
        if (r->gp.n_top > 0) {
            Sampled *t = td_malloc(cap * sizeof(Sampled));
            if (r->n_out) memcpy(t, r->out_top, r->n_out * sizeof(Sampled));
            td_free(r->out_top);
            r->out_top = t;
        }
        if (r->gp.want_routes && e->n_moe) {
            size_t per = (size_t)e->n_moe * e->m->k;
            int32_t *rt = td_malloc(cap * per * sizeof(int32_t));
            if (r->n_out) memcpy(rt, r->routes, r->n_out * per * sizeof(int32_t));
            td_free(r->routes);
            r->routes = rt;
        }
        r->cap = cap;
    }
    r->out[r->n_out] = s->id;
    r->out_logp[r->n_out] = s->logp;
    if (r->gp.n_top > 0) r->out_top[r->n_out] = *s;
    if (r->gp.want_routes && e->n_moe) {
        size_t per = (size_t)e->n_moe * e->m->k;
        memcpy(r->routes + r->n_out * per, route, per * sizeof(int32_t));
    }
    /* the text and the bytes: ids the model has beyond the tokenizer's
     * vocabulary (a padded embedding) have neither, and special tokens no
     * text (skip_special_tokens) and no bytes (stop strings never match
     * them, as in vLLM, which matches the text) */
    if (!r->ts) r->ts = tok_stream_new(e->tok, true);
    r->out_off[r->n_out] = r->text.len;
    char err[64];
    if (s->id < tok_vocab_size(e->tok) && !tok_is_special(e->tok, s->id)) {
        tok_stream_push(r->ts, s->id, &r->text, err, sizeof err);
        tok_token_bytes(e->tok, s->id, &r->raw, err, sizeof err);
    }
    r->raw_end[r->n_out] = r->raw.len;
    r->n_out++;
}

/* The first stop string whose bytes end in the token just appended:
 * 1 with *at = the byte offset in r->raw where it starts, 0 if none. */
static int stop_hit(const Request *r, size_t *at)
{
    const size_t n = r->raw.len, prev = r->n_out > 1 ? r->raw_end[r->n_out - 2] : 0;
    bool hit = false;
    for (int i = 0; i < r->gp.n_stop; i++) {
        size_t L = strlen(r->gp.stop[i]);
        if (!L || L > n) continue;
        /* occurrences that end after prev: they start at or after prev - L + 1 */
        for (size_t q = prev + 1 > L ? prev + 1 - L : 0; q + L <= n; q++)
            if (!memcmp(r->raw.s + q, r->gp.stop[i], L)) {
                if (!hit || q < *at) *at = q;
                hit = true;
                break;
            }
    }
    return hit;
}

/* Tokens and text that no later stop string can take back (n_safe,
 * text_safe): the tokens whose bytes all lie before the longest tail of
 * r->raw that begins a stop string. */
static void update_safe(Request *r)
{
    size_t hold = 0, n = r->raw.len;
    for (int i = 0; i < r->gp.n_stop; i++) {
        size_t L = strlen(r->gp.stop[i]);
        for (size_t k = td_min(L ? L - 1 : 0, n); k > hold; k--)
            if (!memcmp(r->raw.s + n - k, r->gp.stop[i], k)) {
                hold = k;
                break;
            }
    }
    size_t k = r->n_out;
    while (k > 0 && r->raw_end[k - 1] > n - hold) k--;
    r->n_safe = k;
    r->text_safe = k == 0 ? 0 : k < r->n_out ? r->out_off[k] : r->text.len;
}

/* A stop string that starts at byte `at` of r->raw ends r: tokens from the
 * first whose bytes start at or after it are dropped and the text is that
 * of the rest, without the bytes of the last one from `at` on (when the
 * stop string begins inside it). */
static void cut_at_stop(Engine *e, Request *r, size_t at)
{
    size_t k = 0;
    while (k < r->n_out && (k ? r->raw_end[k - 1] : 0) < at) k++;
    r->n_out = k;
    /* the running stream may hold bytes of the dropped tokens: discard them
     * (finish then appends nothing to the text rebuilt here) */
    TokText gone = { 0 };
    tok_stream_finish(r->ts, &gone);
    tok_text_free(&gone);
    r->text.len = 0;
    char err[64];
    /* ids beyond the tokenizer's vocabulary have no text (append_token) */
    TokStream *ts = tok_stream_new(e->tok, true);
    for (size_t i = 0; i < k; i++) {
        r->out_off[i] = r->text.len;
        if (r->out[i] < tok_vocab_size(e->tok)) tok_stream_push(ts, r->out[i], &r->text, err, sizeof err);
    }
    tok_stream_finish(ts, &r->text);
    tok_stream_free(ts);
    if (k > 0 && r->raw_end[k - 1] > at) {
        size_t cut = r->raw_end[k - 1] - at;
        if (r->text.len >= cut && !memcmp(r->text.s + r->text.len - cut, r->raw.s + at, cut)) {
            r->text.len -= cut;
            r->text.s[r->text.len] = 0;
        }
    }
    r->raw.len = at;
}

static bool is_stop_id(const Engine *e, int32_t id)
{
    return bsearch(&id, e->stop_ids, e->n_stop_ids, sizeof(int32_t), cmp_i32) != NULL;
}

/* The batch's forward: the model's own layers over the cache, then the
 * head on the rows that predict a new token (logits (n_sel, V)); routes
 * receives the experts of those rows in every MoE layer. */
static void engine_forward(Engine *e, size_t rows, size_t n_seq, size_t n_sel, int32_t *routes, bool leader)
{
    const Model *m = e->m;
    const size_t d = m->d, per = (size_t)e->n_moe * m->k;
    ModelBatch b = { rows, e->ids, e->pos, e->seqs, n_seq, rows, NULL };
    model_embed(m, e->x, e->ids, rows);
    /* the image vectors take their placeholders' rows (prompt positions only) */
    for (size_t s = 0; s < n_seq && leader; s++) {   /* e->batch is the leader's */
        const Request *r = e->batch[s];
        const AttnSeq *q = &e->seqs[s];
        for (size_t j = 0; r->img && j < q->n; j++) {
            const size_t p = q->pos + j;
            if (p < r->n_prompt && r->img_row[p] >= 0)
                memcpy(e->x + (q->row + j) * d, r->img + (size_t)r->img_row[p] * d, d * sizeof(float));
        }
    }
    int mi = 0;
    for (int l = m->topo.layer_begin; l < m->topo.layer_end; l++) {
        e->la.kv = kvcache_layer(&e->kv, l - m->topo.layer_begin);
        model_layer_forward(m, l, &b, e->x, e->x, &e->la);
        if (m->layers[l].moe) {
            e->expert_rows += (long)e->la.n_recv;   /* this rank's experts' rows (la.n_recv) */
            e->token_rows += (long)rows;
            if (leader) {   /* expert load: reads the router's choice, changes nothing */
                int64_t *cnt = e->expert_tok + (size_t)mi * m->E_global;
                const int32_t *ti = e->la.topk_idx;
                for (size_t i = 0; i < rows * m->k; i++) cnt[ti[i]]++;
            }
            for (size_t s = 0; s < n_sel; s++)
                memcpy(routes + s * per + (size_t)mi * m->k, e->la.topk_idx + (size_t)e->sel_rows[s] * m->k,
                       m->k * sizeof(int32_t));
            mi++;
        }
    }
    for (size_t s = 0; s < n_sel; s++)
        memcpy(e->hn + s * d, e->x + (size_t)e->sel_rows[s] * d, d * sizeof(float));
    model_head(m, e->logits, e->la.h1, e->rstd, e->hn, n_sel);
}

/* ---------------------------------------------------------------- followers
 * Under tensor or expert parallelism every rank runs each step's forward
 * on its own shards and its own copy of the KV cache; rank 0 schedules and
 * broadcasts what the step is: rows, positions, sequences with their block
 * tables, and which rows get logits.  Block ids are rank 0's decisions, so
 * every rank's cache has the same layout. */

typedef struct { int64_t rows, n_seq, n_sel, quit, n_blocks; } BatchHeader;

static void engine_bcast_batch(Engine *e, size_t rows, size_t n_seq, size_t n_sel, bool quit)
{
    BatchHeader h = { (int64_t)rows, (int64_t)n_seq, (int64_t)n_sel, quit, 0 };
    for (size_t s = 0; s < n_seq; s++)
        h.n_blocks += kvcache_blocks_for(&e->kv, e->seqs[s].pos + e->seqs[s].n);
    comm_bcast(COMM_WORLD, &h, sizeof h, 0);
    if (quit) return;
    size_t n = 2 * rows + 3 * n_seq + (size_t)h.n_blocks + n_sel, o = 0;
    int64_t *buf = td_malloc((n + 1) * sizeof(int64_t));
    for (size_t i = 0; i < rows; i++) {
        buf[o++] = e->ids[i];
        buf[o++] = e->pos[i];
    }
    for (size_t s = 0; s < n_seq; s++) {
        const AttnSeq *q = &e->seqs[s];
        buf[o++] = (int64_t)q->row;
        buf[o++] = (int64_t)q->n;
        buf[o++] = (int64_t)q->pos;
        for (int32_t j = 0; j < kvcache_blocks_for(&e->kv, q->pos + q->n); j++) buf[o++] = q->blocks[j];
    }
    for (size_t s = 0; s < n_sel; s++) buf[o++] = e->sel_rows[s];
    comm_bcast(COMM_WORLD, buf, n * sizeof(int64_t), 0);
    td_free(buf);
}

/* Under tp / ep every rank's expert cache loads its own slices: a failed
 * load on any rank fails the step on all (rank 0 then ends its requests).
 * Collective over the world; a no-op without a cache or in one process. */
static void experts_agree(Engine *e)
{
    ExpertCache *c = e->m->ecache;
    if (!c || e->m->topo.world <= 1 || !comm_active()) return;
    int32_t v = expert_cache_error(c)[0] ? -1 : 0;
    comm_allreduce_min_i32(COMM_WORLD, &v, 1);
    if (v < 0 && !expert_cache_error(c)[0])
        snprintf(c->err, sizeof c->err, "another rank could not read its experts (see its log)");
    if (v < 0 && comm_rank() != 0) {
        td_error("serve: rank %d: expert weights unreadable: %s", comm_rank(), expert_cache_error(c));
        expert_cache_clear_error(c);
    }
}

void engine_follow(Engine *e)
{
    int32_t *tables = NULL;
    size_t cap = 0;
    for (;;) {
        BatchHeader h;
        comm_bcast(COMM_WORLD, &h, sizeof h, 0);
        if (h.quit) break;
        size_t rows = (size_t)h.rows, n_seq = (size_t)h.n_seq, n_sel = (size_t)h.n_sel;
        size_t n = 2 * rows + 3 * n_seq + (size_t)h.n_blocks + n_sel, o = 0;
        int64_t *buf = td_malloc((n + 1) * sizeof(int64_t));
        comm_bcast(COMM_WORLD, buf, n * sizeof(int64_t), 0);
        if ((size_t)h.n_blocks > cap) {
            td_free(tables);
            cap = (size_t)h.n_blocks * 2;
            tables = td_malloc(cap * sizeof(int32_t));
        }
        for (size_t i = 0; i < rows; i++) {
            e->ids[i] = (int32_t)buf[o++];
            e->pos[i] = (int32_t)buf[o++];
        }
        size_t tb = 0;
        for (size_t s = 0; s < n_seq; s++) {
            AttnSeq *q = &e->seqs[s];
            q->row = (size_t)buf[o++];
            q->n = (size_t)buf[o++];
            q->pos = (size_t)buf[o++];
            q->blocks = tables + tb;
            for (int32_t j = 0; j < kvcache_blocks_for(&e->kv, q->pos + q->n); j++) tables[tb++] = (int32_t)buf[o++];
        }
        for (size_t s = 0; s < n_sel; s++) e->sel_rows[s] = (int32_t)buf[o++];
        td_free(buf);
        engine_forward(e, rows, n_seq, n_sel, e->routes, false);
        experts_agree(e);
    }
    td_free(tables);
}

void engine_release_followers(Engine *e)
{
    if (e->distributed) engine_bcast_batch(e, 0, 0, 0, true);
    e->distributed = false;
}

/* ---------------------------------------------------------------- the step */

size_t engine_step(Engine *e)
{
    const Model *m = e->m;
    const size_t N_max = e->o.max_batch_tokens, V = m->V;

    /* cancellations */
    for (size_t i = 0; i < e->n_running;) {
        Request *r = e->running[i];
        if (atomic_load(&r->cancel)) finish(e, r, "cancelled");
        else i++;
    }
    drop_cancelled_waiting(e);
    admit(e);
    if (e->o.prefix_cache) {
        long query = 0, hit = 0;
        for (size_t i = 0; i < e->n_running; i++) {
            prefix_extend(e, e->running[i], &query, &hit);
            ring_trim(e, e->running[i]);   /* an attached chain may be longer than the ring */
        }
        pthread_mutex_lock(&e->mu);
        e->st.prefix_query_tokens += query;
        e->st.prefix_hit_tokens += hit;
        pthread_mutex_unlock(&e->mu);
    }

    /* 1. how many rows each running request gets: decoders one, then
     *    prompt chunks while the batch has room */
    size_t nr = e->n_running, budget = N_max;
    size_t take[nr + 1];
    for (size_t i = 0; i < nr; i++) {
        Request *r = e->running[i];
        size_t left = r->n_prompt + r->n_out - r->n_fed;
        take[i] = (left == 1 && r->n_out > 0 && budget > 0) ? 1 : 0;
        budget -= take[i];
    }
    for (size_t i = 0; i < nr; i++) {
        Request *r = e->running[i];
        size_t left = r->n_prompt + r->n_out - r->n_fed;
        if (take[i] || left == 0) continue;
        if (e->o.prefix_cache && prefix_wait(e, i, take)) continue;
        take[i] = td_min(td_min(left, e->o.prefill_chunk), budget);
        budget -= take[i];
    }
    /* 2. cache blocks, oldest first; when they run out the youngest request
     *    is preempted (it is later in admission order, so not yet served) */
    for (size_t i = 0; i < e->n_running; i++) {
        Request *r = e->running[i];
        if (!take[i]) continue;
        bool ok = kvcache_reserve(&e->kv, &r->kv, r->n_fed + take[i]);
        while (!ok) {
            if (e->n_running == 1) {
                /* alone, and the whole cache is still too small: preempting
                 * it would readmit it to the same end forever.  engine_check
                 * refuses such requests at submit; this ends any that slips
                 * through (a bug) instead of looping. */
                snprintf(r->error, sizeof r->error,
                         "the request needs %d KV blocks for %zu positions; the whole cache has %d",
                         (int)kvcache_blocks_for(&e->kv, r->n_fed + take[i]), r->n_fed + take[i],
                         (int)e->kv.n_blocks);
                finish(e, r, "error");
                break;
            }
            /* running[] is in admission order: the youngest is the last, so
             * take[] stays aligned with what remains */
            if (preempt_youngest(e) == r) break;
            ok = kvcache_reserve(&e->kv, &r->kv, r->n_fed + take[i]);
        }
        if (!ok) break;   /* r itself was preempted (the youngest) or ended */
    }
    /* 3. rows, in admission order */
    size_t rows = 0, n_seq = 0, n_sel = 0, seq_take[nr + 1];
    for (size_t i = 0; i < e->n_running; i++) {
        Request *r = e->running[i];
        size_t left = r->n_prompt + r->n_out - r->n_fed;
        size_t t = td_min(take[i], left);
        if (!t || kvcache_blocks_for(&e->kv, r->n_fed + t) > r->kv.n_blocks) continue;
        for (size_t j = 0; j < t; j++) {
            e->ids[rows + j] = token_at(r, r->n_fed + j);
            e->pos[rows + j] = (int32_t)(r->n_fed + j);
        }
        e->seqs[n_seq] = (AttnSeq){ rows, t, r->n_fed, r->kv.blocks };
        e->batch[n_seq] = r;
        seq_take[n_seq] = t;
        if (r->n_fed + t == r->n_prompt + r->n_out) e->sel_rows[n_sel++] = (int32_t)(rows + t - 1);
        n_seq++;
        rows += t;
    }
    if (rows == 0) {
        pthread_mutex_lock(&e->mu);
        size_t left = e->n_running + e->st.waiting;
        pthread_mutex_unlock(&e->mu);
        return left;
    }

    if (e->distributed) engine_bcast_batch(e, rows, n_seq, n_sel, false);
    const size_t per = (size_t)e->n_moe * m->k;
    int32_t *routes = e->routes;   /* (n_sel, per) */
    engine_forward(e, rows, n_seq, n_sel, routes, true);
    if (e->distributed) experts_agree(e);
    if (m->ecache && expert_cache_error(m->ecache)[0]) {
        /* an expert could not be read: this step's outputs are not the
         * model's; its requests end with the error, the others go on */
        for (size_t s = 0; s < n_seq; s++) {
            snprintf(e->batch[s]->error, sizeof e->batch[s]->error, "expert weights unreadable: %s",
                     expert_cache_error(m->ecache));
            finish(e, e->batch[s], "error");
        }
        expert_cache_clear_error(m->ecache);
        n_seq = 0;
    }

    /* sample, append, finish */
    double now = td_now();
    size_t si = 0, new_tokens = 0, prompt_tokens = 0, recomputed = 0;
    for (size_t s = 0; s < n_seq; s++) {
        Request *r = e->batch[s];
        size_t total = r->n_prompt + r->n_out;
        size_t in_prompt = r->n_fed < r->n_prompt ? td_min(seq_take[s], r->n_prompt - r->n_fed) : 0;
        prompt_tokens += in_prompt;
        /* generated tokens in the rows, but for the last one (fed for the
         * first time) when the rows reach it: a preempted request's again */
        recomputed += seq_take[s] - in_prompt - (r->n_fed + seq_take[s] == total && r->n_out > 0 ? 1 : 0);
        r->n_fed += seq_take[s];
        if (e->o.prefix_cache) prefix_register(e, r);
        ring_trim(e, r);
        if (r->n_fed != total) continue;
        Sampled smp;
        sampler_pick(&smp, e->logits + si * V, V, &r->gp.sp, &r->rng, r->gp.n_top, e->sample_scratch);
        if (r->t_first == 0) r->t_first = now;
        else r->itl_sum += now - r->t_last;
        r->t_last = now;
        new_tokens++;
        if (!r->gp.ignore_eos && is_stop_id(e, smp.id)) {
            /* an end-of-turn id: kept only when every sampled token is (RL) */
            if (r->gp.keep_stop) append_token(e, r, &smp, routes + si * per);
            si++;
            finish(e, r, "stop");
            continue;
        }
        append_token(e, r, &smp, routes + si * per);
        si++;
        size_t at = 0;
        if (stop_hit(r, &at)) {
            if (!r->gp.keep_stop) cut_at_stop(e, r, at);   /* OpenAI: the stop string is not returned */
            finish(e, r, "stop");
            continue;
        }
        update_safe(r);
        if (r->cb) r->cb(r, false, r->user);
        if ((int)r->n_out >= r->gp.max_tokens || r->n_prompt + r->n_out >= engine_context(e))
            finish(e, r, "length");
    }
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    if (m->ecache) e->st.experts = m->ecache->st;
    e->st.tokens_generated += (long)new_tokens;
    e->st.prompt_tokens += (long)prompt_tokens;
    e->st.recomputed_tokens += (long)recomputed;
    size_t left = e->n_running + e->st.waiting;
    pthread_mutex_unlock(&e->mu);
    return left;
}
