/* train/quant_cmd.h - `tandem ckpt quantize` (routed here by main.c: its
 * calibration runs the training forward on token files, which live in
 * train/). */
#ifndef TANDEM_TRAIN_QUANT_CMD_H
#define TANDEM_TRAIN_QUANT_CMD_H

/* argv[0] is "quantize".  Returns the process exit code. */
int cmd_ckpt_quantize(int argc, char **argv);

#endif
