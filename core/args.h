/* core/args.h - command-line options of the tandem commands.
 *
 * Options are "--name value", "--name=value" or flags "--name".  A command
 * declares what it accepts as a NULL-terminated list: "ckpt=" takes a value,
 * "json" is a flag, "input+" takes one or more values (until the next
 * option).  Anything not starting with "--" is positional.  An unknown
 * option or a missing value is an error naming it.
 */
#ifndef TANDEM_CORE_ARGS_H
#define TANDEM_CORE_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#define ARGS_MAX 64

typedef struct {
    int n_opt;
    const char *name[ARGS_MAX];   /* option names as declared, without "--" and suffix */
    const char *value[ARGS_MAX];  /* last value given, NULL if absent ("" for a given flag) */
    const char *multi[ARGS_MAX][ARGS_MAX];  /* values of "+" options */
    int n_multi[ARGS_MAX];
    const char *pos[ARGS_MAX];    /* positional arguments */
    int n_pos;
    bool help;                    /* --help or -h seen */
} Args;

/* Parses argv[first..argc).  Returns 0 or -1 with one line in err. */
int args_parse(Args *a, int argc, char **argv, int first, const char *const *spec, char *err, size_t n);
const char *args_get(const Args *a, const char *name);          /* NULL if absent */
const char *args_str(const Args *a, const char *name, const char *dflt);
bool args_flag(const Args *a, const char *name);
/* Numeric value of an option: 0 and *out set, 1 when absent (out = dflt),
 * -1 with err when not a number within [lo, hi]. */
int args_num(const Args *a, const char *name, double dflt, double lo, double hi, double *out,
             char *err, size_t n);
/* Values of a "+" option. */
int args_multi(const Args *a, const char *name, const char *const **vals);

#endif
