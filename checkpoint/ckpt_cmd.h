/* checkpoint/ckpt_cmd.h - `tandem ckpt`: inspect, verify, reshard, export and
 * diff checkpoints (docs/checkpoint.md). */
#ifndef TANDEM_CHECKPOINT_CKPT_CMD_H
#define TANDEM_CHECKPOINT_CKPT_CMD_H

/* argv[0] is "ckpt", argv[1] the subcommand.  Runs in one process.
 * Returns the exit code: 0 success, 1 failure (one line on stderr), 2 usage. */
int cmd_ckpt(int argc, char **argv);

#endif
