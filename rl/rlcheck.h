/* rl/rlcheck.h - `tandem score --rollout OUT.jsonl --ckpt CKPT`: the
 * trainer's check of a rollout (what the RL loop relies on).
 *
 * Every sample of a `tandem rollout` output (infer/rollout_cmd.c) is run
 * through the TRAINING forward (model_train_forward, the one the gradient
 * comes from) on the sequence prompt_ids + ids, and the log-probability of
 * each generated token and the experts of each MoE layer at the position
 * that predicted it are compared with what the rollout recorded.  Prints
 * one JSON object:
 *   {"samples", "tokens", "routes" (token x layer pairs compared),
 *    "logprob_diff_max": max |rollout - trainer| over tokens (float32),
 *    "routing_mismatch": share of (token, layer) whose k experts differ
 *                        (as ordered lists),
 *    "versions": [policy versions checked]}
 * Both are exactly 0 when the engine and the trainer agree bit for bit.
 */
#ifndef TANDEM_RL_RLCHECK_H
#define TANDEM_RL_RLCHECK_H

/* The command (argv[0] is "score"; called by cmd_score when --rollout is
 * given).  Exit code: 0 after printing the measurement, whatever it is; 2
 * for bad options or a malformed rollout file (one line naming the line);
 * 1 when a checkpoint is missing or unreadable. */
int rlcheck_cmd(int argc, char **argv);

#endif
