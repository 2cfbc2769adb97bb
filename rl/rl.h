/* rl/rl.h - `tandem rl`: GRPO post-training with rollouts and training
 * in one MPI job, and the exactness of their log-probabilities measured on
 * every step (docs/rl.md).
 *
 * A step: prompts (a JSONL file or a built-in task) -> group_size samples
 * each from the inference engine (continuous batching, per-sample seeds)
 * -> rewards (vowels, target_length, or reward_cmd) -> advantages
 * normalised within each group -> ppo_epochs AdamW updates of the
 * clipped-ratio objective (optional k3 KL to the frozen initial model),
 * the trainer recomputing each token's log-probability with its own
 * batching -> the new weights to the rollout side.
 *
 * Placement: colocated (rollout_ranks=0: every rank generates its share of
 * the prompts with the model it trains, so no copy is needed) or split
 * (rollout_ranks=R: the first world-R ranks train, the last R generate; the
 * weights go to them after every update by an MPI broadcast, never through
 * disk).  Colocated runs and the trainers of split runs are data-parallel
 * only (tp = pp = ep = 1).
 */
#ifndef TANDEM_RL_RL_H
#define TANDEM_RL_RL_H

#include "train/runcfg.h"

/* `tandem rl RUN.json [key=value ...]`. */
int cmd_rl(int argc, char **argv);

/* Built-in rewards.  vowels: the share of a completion's bytes (its
 * tokens' bytes, tok_token_bytes: for a byte-level vocabulary the tokens)
 * that are a, e, i, o or u. */
double rl_reward_vowels(const char *bytes, size_t n);
/* n: the completion's tokens; target: the number the prompt asks for (the
 * first integer written in it). */
double rl_reward_target_length(size_t n, int target);

#endif
