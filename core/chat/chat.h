/* core/chat/chat.h - a model's chat template, rendered as transformers'
 * apply_chat_template renders it.
 *
 * From tokenizer_config.json:
 *   - chat_template: a string, or a list of {"name", "template"}; then the
 *     one named "tool_use" is used when tools are given (even an empty
 *     list), else "default" (transformers' get_chat_template);
 *   - the special tokens bos_token, eos_token, unk_token, sep_token,
 *     pad_token, cls_token, mask_token (a string, or an AddedToken object
 *     {"content": ...}) and additional_special_tokens; those set and
 *     non-empty become template variables (transformers passes
 *     special_tokens_map).  Defaults a tokenizer class would add are not
 *     invented: only what the file states.
 * Render variables: messages (as given), tools (None when absent), documents
 * (None), add_generation_prompt, the special tokens, then any extra
 * variables (chat_template_kwargs: they override the special tokens, as
 * transformers' **kwargs do).
 *
 * Messages are checked before rendering, each error one line naming the
 * message: an object, with a string "role", and a "content" that is absent,
 * null, a string, or a list of parts (objects with a string "type"; a
 * "text" part has a string "text").  tools must be a list of objects.
 *
 * Thread safety: a loaded ChatTemplate is read-only; renders may run
 * concurrently.
 */
#ifndef TANDEM_CORE_CHAT_CHAT_H
#define TANDEM_CORE_CHAT_CHAT_H

#include "core/chat/jinja/jinja.h"

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

typedef struct ChatTemplate ChatTemplate;

/* Reads tokenizer_config.json text and compiles its template(s).  Returns
 * 0 and *out (chat_template_free), or -1 with one line in err (no template,
 * a malformed field, or the template's compile error naming its line). */
int chat_template_load(ChatTemplate **out, const char *config_json, size_t n, char *err, size_t errlen);
void chat_template_free(ChatTemplate *ct);

/* The bos / eos token text, or NULL when the config sets none (borrowed). */
const char *chat_template_bos(const ChatTemplate *ct);
const char *chat_template_eos(const ChatTemplate *ct);

/* Renders a request given as JSON text: either an OpenAI messages array,
 * or an object {"messages": [...], "tools": [...], "chat_template_kwargs":
 * {...}, "add_generation_prompt": bool} (all but messages optional; other
 * keys are ignored, so a /v1/chat/completions body works as it is).  The
 * object's add_generation_prompt, when present, wins over the argument.
 * lim NULL = jinja's defaults.  Returns 0 with *out td_malloc'd (caller
 * td_frees) of *out_len bytes, or -1 with one line in err: a bad message
 * ("messages[1]: 'content' must be a string, null or a list of parts"),
 * or the template's own error ("chat template: After the optional system
 * message, conversation roles must alternate ..."). */
int chat_template_render_json(const ChatTemplate *ct, const char *json, size_t n, bool add_generation_prompt,
                              const JinjaLimits *lim, char **out, size_t *out_len, char *err, size_t errlen);

/* The same from cJSON trees (tools and kwargs may be NULL; cJSON does not
 * tell 2.0 from 2, see jv_from_cjson). */
int chat_template_render_cjson(const ChatTemplate *ct, const struct cJSON *messages, const struct cJSON *tools,
                               const struct cJSON *kwargs, bool add_generation_prompt, const JinjaLimits *lim,
                               char **out, size_t *out_len, char *err, size_t errlen);

#endif
