/* core/chat/jinja/jinja.h - a Jinja template engine for chat templates: compile a
 * template once, render it with JSON variables.
 *
 * The language is the subset of jinja2 that chat templates use (docs/chat.md
 * lists it), in the environment transformers builds for
 * apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols, generation]), the default
 * Undefined, keep_trailing_newline=False, and the globals raise_exception
 * and strftime_now and the tojson override that transformers installs.
 * Output equals jinja2's byte for byte for every construct it accepts
 * (tests/test_chat.c and tests/cli/chat.sh check this against Python's
 * jinja2).
 *
 * Refused when the template compiles, with "line L: ..." naming it: an
 * unknown tag, filter, test, method or function, and syntax errors.
 * Refused while rendering, with a message and no partial output: what
 * jinja2 raises (raise_exception's message verbatim, type errors, using an
 * undefined value), and the limits below, so a hostile template can neither
 * hang nor exhaust memory.
 *
 * Thread safety: a compiled template is read-only; any number of threads may
 * render it at once (each render has its own arena).
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_H

#include "core/chat/jinja/jinja_value.h"

#include <stddef.h>
#include <stdint.h>

struct cJSON;

typedef struct JinjaTemplate JinjaTemplate;

/* Hard limits of one render. */
typedef struct JinjaLimits {
    size_t max_output;   /* bytes of output, also of any captured block */
    size_t max_memory;   /* bytes the render may allocate */
    uint64_t max_steps;  /* work: loop iterations + calls + bytes scanned / 64 */
    int max_depth;       /* nested evaluation frames (C stack guard) */
    int max_calls;       /* nested macro calls */
    int64_t now;         /* strftime_now's clock in seconds since the epoch
                          * (local time zone); -1: the real clock */
} JinjaLimits;

/* 32 MiB output, 256 MiB memory, 50M steps, 2000 frames, 40 nested
 * macro calls, the real clock. */
void jinja_limits_default(JinjaLimits *lim);

/* Compiles src (n bytes of UTF-8).  Returns 0 and *out (owned by the
 * caller: jinja_free), or -1 with one line in err ("line 3: unsupported
 * filter 'wordwrap'"). */
int jinja_compile(JinjaTemplate **out, const char *src, size_t n, char *err, size_t errlen);
void jinja_free(JinjaTemplate *t);

/* Renders t.  vars is a cJSON object whose members are the template's
 * variables (cJSON does not tell 2.0 from 2: see jv_from_cjson); lim NULL =
 * defaults.  Returns 0 with *out a td_malloc'd NUL-terminated string of
 * *out_len bytes (the caller td_frees it; out_len may be NULL), or -1 with
 * the message in err and *out NULL. */
int jinja_render(const JinjaTemplate *t, const struct cJSON *vars, const JinjaLimits *lim, char **out,
                 size_t *out_len, char *err, size_t errlen);
/* The same with the variables as JSON text of an object (numbers keep
 * Python's int/float distinction). */
int jinja_render_json(const JinjaTemplate *t, const char *vars_json, size_t n, const JinjaLimits *lim, char **out,
                      size_t *out_len, char *err, size_t errlen);
/* The same with the variables as a JV_DICT (values borrowed: their arena
 * must outlive the call). */
int jinja_render_values(const JinjaTemplate *t, Jv vars, const JinjaLimits *lim, char **out, size_t *out_len,
                        char *err, size_t errlen);

#endif
