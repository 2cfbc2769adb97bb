/* core/tok/tok_cmd.h - `tandem tokenize` (SPEC section 10):
 *   tandem tokenize --tokenizer T (--text STR | --input FILE [--jsonl]) [--no-special]
 *   tandem tokenize --tokenizer T --chat MESSAGES.json [--add-generation-prompt]
 *   tandem tokenize --tokenizer T --decode --ids 1,2,3 [--skip-special]
 * Prints {"ids": [...]} (one line per input line with --jsonl),
 * {"text": ..., "ids": [...]} for --chat, {"text": ...} for --decode.
 * T is an HF directory or a tandem checkpoint: core/ knows nothing of
 * checkpoints, so the caller passes the function that opens T
 * (checkpoint/ckpt_model.h's ckpt_open_tokenizer_arg). */
#ifndef TANDEM_CORE_TOK_TOK_CMD_H
#define TANDEM_CORE_TOK_TOK_CMD_H

#include <stddef.h>

struct Tokenizer;
/* 0 and *out (tok_free), or -1 with one line in err. */
typedef int (*TokOpenFn)(const char *path, struct Tokenizer **out, char *err, size_t err_len);

int cmd_tokenize(int argc, char **argv, TokOpenFn open_tokenizer);

#endif
