/* infer/infer_cmd.h - the command layer of infer/: `tandem generate`,
 * `tandem serve` and `tandem rollout`.  argv[0] is the command name; each
 * returns the process exit code. */
#ifndef TANDEM_INFER_INFER_CMD_H
#define TANDEM_INFER_INFER_CMD_H

#include <stddef.h>

#include "core/args.h"
#include "infer/engine.h"

int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* `tandem eval-vision`: a VLM answers image questions (infer/eval_vision_cmd.c). */
int cmd_eval_vision(int argc, char **argv);
/* `tandem rollout`: the RL rollout worker (infer/rollout_cmd.c). */
int cmd_rollout(int argc, char **argv);

/* Sampling options shared by the commands (--max-tokens --temperature
 * --top-k --top-p --seed --stop --logprobs).  0 or -1 with err. */
int infer_gen_params(GenParams *gp, const Args *a, char *err, size_t n);

#endif
