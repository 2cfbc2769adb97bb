/* core/tok/post.h - tokenizer.json `post_processor` for one sequence (HF
 * tokenizers/src/processors): TemplateProcessing (its `single` template),
 * ByteLevel (offsets only: no ids), RobertaProcessing and BertProcessing
 * (cls ... sep) and Sequence.  Each adds fixed ids before and after the
 * sequence when add_special_tokens is on, so a post-processor is the pair
 * (prefix ids, suffix ids). */
#ifndef TANDEM_CORE_TOK_POST_H
#define TANDEM_CORE_TOK_POST_H

#include "core/tok/tok_util.h"

typedef struct {
    TokIds pre, post;
} PostProc;

/* Reads j at `path` (NULL or JSON null: adds nothing).  0, or -1 with
 * err. */
int post_load(PostProc *p, const cJSON *j, const char *path, char *err, size_t n);
void post_free(PostProc *p);

#endif
