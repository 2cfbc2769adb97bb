/* core/tok/tok_cmd.h - `tandem tokenize` (SPEC section 10):
 *   tandem tokenize --tokenizer T (--text STR | --input FILE [--jsonl]) [--no-special]
 *   tandem tokenize --tokenizer T --chat MESSAGES.json [--add-generation-prompt]
 *   tandem tokenize --tokenizer T --decode --ids 1,2,3 [--skip-special]
 * Prints {"ids": [...]} (one line per input line with --jsonl),
 * {"text": ..., "ids": [...]} for --chat, {"text": ...} for --decode. */
#ifndef TANDEM_CORE_TOK_TOK_CMD_H
#define TANDEM_CORE_TOK_TOK_CMD_H

int cmd_tokenize(int argc, char **argv);

#endif
