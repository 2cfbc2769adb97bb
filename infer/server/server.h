/* infer/server/server.h - the HTTP side of `tandem serve`: an OpenAI-compatible
 * server (POST /v1/completions and /v1/chat/completions with
 * server-sent-event streaming, POST /tokenize and /detokenize, GET
 * /v1/models, /health, /metrics) on libmicrohttpd over the inference
 * engine (engine.h), whose tokenizer (Engine.tok) it encodes and decodes
 * with; the chat template is that tokenizer's.  API details:
 * docs/serving.md.
 *
 * Threads.  The thread that calls server_run is the engine thread: it alone
 * calls engine_step (and so owns the thread pool).  libmicrohttpd runs one
 * thread per connection; those threads only parse, validate, engine_submit
 * and wait on the request's own mutex and condition variable, which the
 * engine's callback signals after copying each new token (the engine's
 * arrays may be reallocated between tokens, so nothing else reads them).
 * The engine thread never waits for HTTP I/O.
 *
 * Lifetime of one completion: one reference for the HTTP side and one per
 * choice still in the engine; it is freed when the last is dropped (by the
 * engine thread after engine_step returns, or by the HTTP thread).  A client
 * that disconnects cancels its choices (engine_cancel), which frees their
 * cache blocks at the next step.
 */
#ifndef TANDEM_INFER_SERVER_SERVER_H
#define TANDEM_INFER_SERVER_SERVER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/image/image.h"
#include "infer/engine.h"

typedef struct {
    const char *host;        /* address to bind (numeric or a name), default 127.0.0.1 */
    int port;                /* 0: any free port (server_port tells which) */
    size_t max_body;         /* request bodies above this get 400 (default 1 MiB) */
    int max_n;               /* choices per request (n x prompts), default 16 */
    int max_connections;     /* concurrent connections (threads), default 512 */
    unsigned idle_timeout;   /* seconds a connection may stay silent (0: forever), default 60 */
    double drain_timeout;    /* seconds running requests get after SIGTERM, default 30 */
    const char *model_name;  /* "model" in responses and /v1/models (borrowed) */
    bool quiet;              /* no per-request log lines */
    const char *const *api_keys; /* when n_api_keys > 0: every /v1/ path, /tokenize and /detokenize
                                  * need "Authorization: Bearer KEY" with one of them (borrowed) */
    size_t n_api_keys;
    /* hot weight reload (docs/serving.md): between engine steps, once no
     * admitted request is left (admission held meanwhile), reload(user,
     * file, &step, err) replaces the weights (0; -1 with the old weights
     * still in place and err; -2: no usable weights, the server stops).
     * POST /v1/admin/reload {"checkpoint": FILE} with "Authorization:
     * Bearer admin_token" (403 without an admin_token); follow_dir: each
     * new target of follow_dir/latest. */
    int (*reload)(void *user, const char *file, int64_t *step, char *err, size_t n);
    void *reload_user;
    const char *admin_token;  /* borrowed; NULL: no admin endpoint */
    const char *follow_dir;   /* borrowed; NULL: no following */
    int64_t weights_step;     /* the step of the weights served at start */
    /* images in chat content parts (docs/vision.md): limits of one encoded
     * image (0 fields: core/image's defaults, 16 MiB and 4096 x 4096
     * pixels) and images per request (0: API_DEFAULT_MAX_IMAGES, 16) */
    ImageLimits image_limits;
    int max_images;
} ServerOpts;

typedef struct Server Server;

void server_opts_default(ServerOpts *o);

/* Starts listening (libmicrohttpd threads) over e, which must be
 * initialised and is borrowed until server_free (its tokenizer too).
 * Returns 0 with *out set, or -1 with one line in err (address in use, bad
 * host).  A chat template that cannot be compiled is not an error: chat
 * requests are answered 400 with why (server_chat_error). */
int server_start(Server **out, Engine *e, const ServerOpts *o, char *err, size_t n);
/* The port actually bound (useful with port 0). */
int server_port(const Server *s);
/* NULL when chat completions can be served, else why not (one line). */
const char *server_chat_error(const Server *s);

/* The engine loop, on the calling thread: steps the engine while there is
 * work and waits for submissions otherwise.  Once *stop becomes non-zero
 * (a signal handler sets it) the server drains: new completions get 503,
 * running ones finish (up to drain_timeout, then they are cancelled), then
 * the listener stops and every request is released.  Returns when done. */
void server_run(Server *s, volatile sig_atomic_t *stop);

/* Stops the listener if still running and frees the server (not the engine). */
void server_free(Server *s);

#endif
