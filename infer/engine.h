/* infer/engine.h - the inference engine: continuous batching over a paged
 * KV cache, with the model forward of core/model/layer.h (the trainer's own).
 *
 * Each engine_step builds one batch of token rows: one row for every
 * request that is decoding, then chunks of prompts being prefilled, up to
 * max_batch_tokens; new requests join between steps and finished ones
 * leave.  A request's prompt is prefilled in chunks of at most
 * prefill_chunk tokens, so a long prompt never starves the decoders.  When
 * the cache runs out of blocks the most recently admitted request is
 * preempted: its blocks are freed and it is recomputed later (prompt plus
 * what it generated); since every op is row-invariant the recomputation
 * gives the same bits, so preemption never changes a request's output.
 *
 * Prefix caching (EngineOpts.prefix_cache, kvcache.h): before a request's
 * prompt rows are planned, every full block of its known tokens that is
 * registered is taken from the cache instead of computed (never the block
 * of its last known token: that row must run to give logits).  Blocks are
 * registered as soon as a step fills them, prompt or output.  A request
 * whose next block another request earlier in this step computes from the
 * same prefix waits a step and then takes it, so the n samples of one
 * prompt compute it once.  Keys and values depend only on the tokens
 * before them (row-invariant kernels), so outputs are bit-identical with
 * and without the cache; the decisions are rank 0's, from token ids only
 * (followers get the block tables).
 * Preemption only ever waits for older requests to finish: a request that
 * could not fit the whole cache alone would wait forever, so engine_submit
 * refuses it (engine_check is the one place that says what can run).
 *
 * Text.  The engine decodes what each request generates with the model's
 * tokenizer (EngineOpts.tok), as HF's decode(ids, skip_special_tokens=True)
 * does, one id at a time (TokStream: whole UTF-8 characters only).  Stop
 * strings are matched against the generated tokens' bytes
 * (tok_token_bytes joined: for a byte-level vocabulary the ids themselves),
 * so a stop string is found wherever its bytes are, also across tokens and
 * inside one.  The model's stop ids (EngineOpts.stop_ids: end of turn, end
 * of text) end a request too, unless GenParams.ignore_eos.
 *
 * Threads: engine_step runs on one thread (it owns the thread pool);
 * engine_submit and engine_cancel may be called from any thread.
 */
#ifndef TANDEM_INFER_ENGINE_H
#define TANDEM_INFER_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model/expert_cache.h"
#include "core/model/layer.h"
#include "core/tok/tokenizer.h"
#include "infer/kvcache.h"
#include "infer/sampler.h"

#define ENGINE_MAX_STOP 4
#define ENGINE_STOP_LEN 64

typedef enum { REQ_WAITING, REQ_RUNNING, REQ_DONE } ReqState;

/* What makes a request impossible to run (engine_check). */
typedef enum {
    ENGINE_OK = 0,
    ENGINE_BAD_TOKEN,       /* a prompt id outside [0, vocab_size) */
    ENGINE_EMPTY_PROMPT,
    ENGINE_PROMPT_TOO_LONG, /* the prompt leaves no room in the context */
    ENGINE_NO_ROOM,         /* prompt + max_tokens cannot fit the whole KV cache */
    ENGINE_BAD_IMAGE,       /* images and image placeholders do not match, or the model has no vision tower */
    ENGINE_PROMPT_NO_ROOM,  /* the prompt alone is longer than the whole KV cache */
} EngineRefusal;

typedef struct Request Request;
/* Called on the engine thread after each new token (out[n_out-1]) and once
 * when the request finishes (done = true).  Must not block for long. */
typedef void (*RequestCb)(Request *r, bool done, void *user);

typedef struct {
    int max_tokens;
    SamplingParams sp;
    uint64_t seed;
    int n_top;                            /* alternatives per token (0..20) */
    int n_stop;
    char stop[ENGINE_MAX_STOP][ENGINE_STOP_LEN];
    bool want_routes;                     /* record experts per token per MoE layer */
    bool keep_stop;                       /* keep the stop string / stop id in out (RL: every sampled token) */
    bool ignore_eos;                      /* the engine's stop ids do not end this request */
} GenParams;

struct Request {
    /* input (owned by the request; set before submit) */
    int32_t *prompt;
    size_t n_prompt;
    GenParams gp;
    RequestCb cb;
    void *user;
    uint64_t id;
    /* images (docs/vision.md; request_set_images): pixels (n_img, 3, S, S),
     * their vectors (n_img P, d) encoded at admission and put in the rows
     * of the prompt's image_token_index placeholders, in order */
    const float *pixels_in;               /* borrowed from request_set_images until engine_submit */
    float *pixels, *img;                  /* owned: engine_submit's copy, the encoded vectors */
    size_t n_img;
    int32_t *img_row;                     /* (n_prompt) image row of a placeholder position, -1 elsewhere */
    uint64_t img_seed;                    /* prefix cache chain seed: a hash of the pixels */
    /* output, written by the engine thread */
    int32_t *out;
    float *out_logp;
    Sampled *out_top;                     /* when gp.n_top > 0 */
    int32_t *routes;                      /* (n_out, n_moe_layers, k) when want_routes */
    size_t n_out, cap;
    /* out as text (skip special tokens): whole characters while running,
     * all of it once done (a stop string cut off unless keep_stop).
     * out_off[i] is where token i's text begins in it.  Tokens [0, n_safe)
     * and text [0, text_safe) are final: no stop string found later can
     * take them back (what a stream may send). */
    TokText text;
    size_t *out_off;                      /* (cap) */
    size_t n_safe, text_safe;
    char finish_reason[16];               /* "length", "stop", "cancelled", "error" */
    EngineRefusal refusal;                /* why engine_submit returned -2 */
    char error[256];                      /* one line: why it was refused or ended with "error" */
    double t_submit, t_first, t_last;     /* seconds (td_now) */
    double t_admit;                       /* first admission (td_now; 0: never admitted) */
    double itl_sum;                       /* sum of inter-token gaps */
    /* engine state */
    _Atomic ReqState state;
    atomic_bool cancel;
    KvSeq kv;
    size_t n_fed;                         /* tokens of prompt+out whose KV is cached */
    bool pc_seen;                         /* counted in prefix_query_tokens since admitted */
    Rng rng;
    Request *next;                        /* queue link */
    uint64_t admit_order;
    TokStream *ts;                        /* decodes out into text */
    TokText raw;                          /* the bytes of out (tok_token_bytes), for stop strings */
    size_t *raw_end;                      /* (cap) raw.len after token i */
};

typedef struct {
    size_t kv_budget_bytes;   /* KV cache memory (default 256 MiB) */
    size_t max_batch_tokens;  /* rows per step (default 512) */
    size_t prefill_chunk;     /* prompt tokens per request per step (default 256) */
    size_t max_running;       /* requests in the batch at once (default 64) */
    size_t max_queue;         /* waiting requests before submit refuses (default 256) */
    const Tokenizer *tok;     /* borrowed for the engine's life: decodes outputs; NULL = byte-level */
    const int32_t *stop_ids;  /* ids that end a generation with "stop" (copied at init); may be NULL */
    size_t n_stop_ids;
    bool prefix_cache;        /* share full KV blocks of equal prefixes (default on; kvcache.h) */
    uint64_t weights_version; /* seeds the blocks' hash chain: other weights, other keys */
    size_t max_context;       /* positions a request may reach (prompt + max_tokens); 0 = the model's
                               * max_position_embeddings, never more (`serve --max-context`) */
} EngineOpts;

typedef struct {
    long steps, tokens_generated, prompt_tokens, requests_done, preemptions;
    /* generated tokens fed again after a preemption (the prompt's part of a
     * recomputation is in prompt_tokens) */
    long recomputed_tokens;
    /* prefix cache: tokens known at each admission (a prompt; a preempted
     * request's prompt and output when it comes back) and those of them
     * found cached instead of computed */
    long prefix_query_tokens, prefix_hit_tokens;
    size_t running, waiting;
    int32_t kv_used, kv_total;  /* blocks held by requests; all blocks */
    int32_t kv_cached;          /* blocks only the prefix cache holds (evicted on demand) */
    int32_t prefix_blocks;      /* blocks registered in the prefix cache, held by requests or not */
    size_t kv_token_bytes;    /* one cached position, all local layers (the KV dtype's) */
    size_t weight_bytes;      /* the model's weights as held (model_weight_bytes) */
    /* routed-expert cache (--expert-cache-mb; core/model/expert_cache.h):
     * slots per MoE layer (0: experts resident), its bytes, its counters
     * as of the last step */
    size_t expert_slots, expert_cache_bytes;
    ExpertCacheStats experts;
} EngineStats;

typedef struct {
    const Model *m;           /* borrowed */
    EngineOpts o;
    KvCache kv;
    Arena arena;              /* owned scratch */
    LayerActs la;
    float *x, *hn, *rstd, *logits;
    int32_t *ids, *pos, *sel_rows;
    int32_t *routes;          /* (max_running, n_moe, k): experts of the rows that get logits */
    AttnSeq *seqs;
    Request **batch;          /* requests in the current batch */
    void *sample_scratch;
    int n_moe;                /* MoE layers (routes) */
    /* rows routed to each expert, (n_moe, E_global), over every forward
     * the leader ran: written and read on the engine thread only
     * (engine_expert_tokens) */
    int64_t *expert_tok;
    int *moe_layer;           /* (n_moe) the model layer index of each */
    pthread_mutex_t mu;       /* guards the queue and stats */
    pthread_cond_t cv;        /* signalled on submit */
    Request *q_head, *q_tail; /* waiting (FIFO, preempted go to the front) */
    Request **running;
    size_t n_running;
    uint64_t admit_counter;
    EngineStats st;
    bool distributed;         /* rank 0 of a tp/ep job: broadcast every step */
    /* rows this rank's routed experts computed, and token rows forwarded,
     * summed over MoE layers and steps: under ep (Topology.ep_shared_rows)
     * the ranks' expert_rows sum to token_rows x top-k (serve prints them
     * at exit) */
    long expert_rows, token_rows;
    bool hold;                /* admission held (engine_hold), guarded by mu */
    const Tokenizer *tok;     /* o.tok, or own_tok */
    Tokenizer *own_tok;       /* the byte-level tokenizer when o.tok is NULL */
    int32_t *stop_ids;        /* (n_stop_ids) owned, ascending */
    size_t n_stop_ids;
    uint64_t prefix_seed;     /* the parent hash of every first block (weights_version) */
    int32_t *blk_tok;         /* (2 bs) scratch: the tokens of a block */
    size_t ring;              /* W when every local layer has the sliding window W: each request's
                               * blocks are a ring (kvcache_trim, infer/kvcache.h); 0: none */
} Engine;

void engine_opts_default(EngineOpts *o);
void engine_init(Engine *e, const Model *m, const EngineOpts *o);
void engine_free(Engine *e);

/* Bytes engine_init(e, m, o) allocates through td_malloc, by what they
 * hold: the paged KV cache (kvcache_bytes of o->kv_budget_bytes, and the
 * blocks it makes), the activation arena of a batch of max_batch_tokens
 * rows (layer_acts_carve on a dry arena, as engine_init sizes it) and the
 * batch tables.  m may be a shape (model_init_shape).  Requests add their
 * own buffers (prompt and outputs) while they run. */
typedef struct {
    size_t kv_cache, activations, workspace, kv_blocks;
} EngineMem;
void engine_mem(const Model *m, const EngineOpts *o, EngineMem *out);

/* The positions a request may come to hold: EngineOpts.max_context, or
 * the model's max_position_embeddings when that is 0 or larger (positions
 * past it have no RoPE angle the model was given: they are refused, never
 * computed). */
size_t engine_context(const Engine *e);

/* Allocates a request for the given prompt (copied). */
Request *request_new(const int32_t *prompt, size_t n_prompt, const GenParams *gp);
void request_free(Request *r);
/* Attaches n_img images to r (before engine_submit): pixels (n_img, 3, S,
 * S) as image_to_pixels (core/image/image.h) makes them with the model's
 * image_size S, image_mean and image_std.  Copied by engine_submit (which
 * knows S): they must stay valid until it returns.  The prompt must hold
 * vision_tokens_per_image copies of image_token_index per image (engine_submit
 * refuses it otherwise, ENGINE_BAD_IMAGE).  The engine encodes them once, at
 * admission (model_vision_encode); the prefix cache shares blocks only
 * between requests with the same images.  Returns 0. */
int request_set_images(Request *r, const float *pixels, size_t n_img);

/* Whether a request for prompt[0..n_prompt) generating up to max_tokens
 * can ever run on e: every id in [0, vocab_size), a prompt that is not
 * empty and shorter than the context (engine_context), a prompt that
 * the whole KV cache can hold (ENGINE_PROMPT_NO_ROOM: the prompt's length
 * and the cache's positions), and the positions it can
 * come to hold in the KV cache (prompt + max_tokens - 1, at most the
 * context less one: the last token is never fed) within the whole cache.
 * A request that passes never needs another's blocks to finish: it runs
 * alone if it must (older requests keep theirs; a newer one is the one
 * preempted, see above).
 * Returns ENGINE_OK, or the first problem with one line in err naming it
 * (the token and the vocabulary size; the sizes and the cache).  Reads
 * only sizes fixed at engine_init: any thread. */
EngineRefusal engine_check(const Engine *e, const int32_t *prompt, size_t n_prompt, int max_tokens, char *err,
                           size_t err_len);
/* Queues r; returns 0, -1 when the queue is full (the caller answers 429),
 * -2 when engine_check refuses it (r->refusal and the line in r->error; a
 * caller answers 400 with it).  Every request passes here, so no id outside
 * the vocabulary ever reaches the embedding and no request can wait
 * forever for cache blocks.  Any thread. */
int engine_submit(Engine *e, Request *r);
/* Asks for r to stop; it finishes with "cancelled" at the start of the
 * next step, running (its blocks return at once) or still queued (it is
 * never admitted). */
void engine_cancel(Request *r);
/* One scheduling iteration.  Returns the number of requests still waiting
 * or running. */
size_t engine_step(Engine *e);
/* Blocks until a request is queued or timeout_ms passes (for the serving
 * thread when idle). */
void engine_wait(Engine *e, int timeout_ms);
void engine_stats(Engine *e, EngineStats *out);
/* Tokens (batch rows) the router sent to each expert, (n_moe, E_global)
 * row-major, summed over every forward of this engine since engine_init:
 * k per row per MoE layer, the rows being each step's prompt tokens
 * computed (not found in the prefix cache), generated tokens fed back and
 * recomputed ones (EngineStats prompt_tokens, recomputed_tokens).
 * *layers (if not NULL) gets the model layer index of each of the n_moe
 * rows.  Read-only of what engine_forward counted: the routing and every
 * output bit are the same with or without it.  Engine thread only (the one
 * that runs engine_step), between steps; NULL without MoE layers. */
const int64_t *engine_expert_tokens(const Engine *e, const int **layers);

/* Admission hold, for swapping the weights between steps (tandem rollout
 * --follow).  While held, engine_step admits no new request; requests that
 * were admitted before and then preempted are still readmitted, so every
 * admitted request runs to its end under the weights it started with.
 * Any thread. */
void engine_hold(Engine *e, bool hold);
/* New weights: cached prefix blocks are dropped and later blocks hash with
 * the new version.  Engine thread, between steps. */
void engine_set_weights_version(Engine *e, uint64_t version);
/* Requests admitted at least once that have not finished (running, or
 * preempted and waiting to be readmitted).  0 while held means no request
 * depends on the current weights or KV cache: the weights may be replaced
 * (then call engine_hold(e, false)).  Any thread. */
size_t engine_admitted_live(Engine *e);

/* Tensor / expert parallel serving (all ranks of the world hold a shard of
 * the model, m->topo).  Rank 0 sets e->distributed = true and drives the
 * engine as usual: each step's batch is broadcast.  Every other rank calls
 * engine_follow, which runs the same forwards on its shards until rank 0
 * calls engine_release_followers (collective with the followers). */
void engine_follow(Engine *e);
void engine_release_followers(Engine *e);

#endif
