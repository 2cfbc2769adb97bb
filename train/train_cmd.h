/* train/train_cmd.h - the command layer of train/: `tandem train`, `data`,
 * `eval` and `score`.  Each takes argv with argv[0] the command name and
 * returns the process exit code. */
#ifndef TANDEM_TRAIN_TRAIN_CMD_H
#define TANDEM_TRAIN_TRAIN_CMD_H

int cmd_train(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_score(int argc, char **argv);

#endif
