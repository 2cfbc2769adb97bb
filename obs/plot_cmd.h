/* obs/plot_cmd.h - `tandem plot RUN_DIR [RUN_DIR ...] [--out DIR]`: the
 * figures of one or several runs' metrics.jsonl as PNG and SVG
 * (docs/observability.md).  Exits 0, 1 when a figure could not be written,
 * 2 on bad input (one line naming the directory, or the file and line). */
#ifndef TANDEM_OBS_PLOT_CMD_H
#define TANDEM_OBS_PLOT_CMD_H

int cmd_plot(int argc, char **argv);

#endif
