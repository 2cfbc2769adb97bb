/* obs/runlog.h - a run's metrics.jsonl read back into columns, for
 * `tandem plot` (obs/plot_cmd.c).
 *
 * Every numeric top-level key of any row becomes a series of n_rows values
 * (NAN in the rows that lack it: val_loss appears at evaluations only);
 * each number of an array becomes "key[i]" (fwd_s[1], act_rms[3]; nulls
 * skipped) and of an object's arrays "key.sub[i]" (mem_rank_mb.rss[0]);
 * "expert_load" (an array over layers of per-expert token counts, null for
 * dense layers; docs/config.md) becomes one (n_rows, L, E) block.  Nothing
 * here knows the trainer: the file is the contract.
 */
#ifndef TANDEM_OBS_RUNLOG_H
#define TANDEM_OBS_RUNLOG_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *key;           /* owned */
    double *v;           /* owned (n_rows), NAN where the row lacks the key */
} RunSeries;

typedef struct {
    char *dir;           /* owned: the run directory as given */
    char *path;          /* owned: dir/metrics.jsonl */
    size_t n_rows;
    RunSeries *series;   /* owned (n_series), in order of first appearance */
    size_t n_series;
    size_t n_layers, n_expert;   /* shape of expert_load; 0 when no row has it */
    double *load;        /* owned (n_rows, n_layers, n_expert), NAN for dense layers and rows without it */
    long cut_line;       /* > 0: that last line was cut short (a run still writing) and skipped */
} RunLog;

/* Reads dir/metrics.jsonl into r.  Returns 0, or -1 with one line in err
 * naming the directory, or the file and line (r is then released).  A last
 * line without its newline that does not parse is skipped (r->cut_line);
 * any other line that is not a JSON object with a numeric "step" is an error. */
int runlog_read(RunLog *r, const char *dir, char *err, size_t n);
/* Releases r; safe on a zeroed struct and twice. */
void runlog_free(RunLog *r);
/* The values of key (n_rows), or NULL when no row has it. */
const double *runlog_get(const RunLog *r, const char *key);

#endif
