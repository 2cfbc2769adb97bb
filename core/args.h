/* core/args.h - command-line options of the tandem commands.
 *
 * Options are "--name value", "--name=value" or flags "--name".  A command
 * declares what it accepts as a NULL-terminated list: "ckpt=" takes a value,
 * "json" is a flag, "input+" takes one or more values (until the next
 * option; "--input=v" gives one, and the option may be repeated: every
 * value is kept, in order).  Anything not starting with "--" is
 * positional.  An unknown option or a missing value is an error naming it.
 * There is no limit on the number of values or positionals: the tables are
 * sized from argc.
 */
#ifndef TANDEM_CORE_ARGS_H
#define TANDEM_CORE_ARGS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int n_opt;
    const char **name;     /* option names as declared, without "--" and suffix (n_opt) */
    const char **value;    /* last value given, NULL if absent ("" for a given flag) */
    const char ***multi;   /* values of "+" options, in the order given (n_multi[o] each) */
    int *n_multi;
    const char **pos;      /* positional arguments (n_pos) */
    int n_pos;
    bool help;             /* --help or -h seen */
    void *mem;             /* owned: one block holding the tables above */
} Args;

/* Parses argv[first..argc).  Returns 0, or -1 with one line in err (a is
 * then released).  The strings stay argv's; the tables are owned by a:
 * release them with args_free. */
int args_parse(Args *a, int argc, char **argv, int first, const char *const *spec, char *err, size_t n);
/* Releases the tables; safe on a zeroed struct, after a failed parse, and twice. */
void args_free(Args *a);
const char *args_get(const Args *a, const char *name);          /* NULL if absent */
const char *args_str(const Args *a, const char *name, const char *dflt);
bool args_flag(const Args *a, const char *name);
/* Numeric value of an option: 0 and *out set, 1 when absent (out = dflt),
 * -1 with err when not a number within [lo, hi]. */
int args_num(const Args *a, const char *name, double dflt, double lo, double hi, double *out,
             char *err, size_t n);
/* Values of a "+" option (count; *vals untouched when absent). */
int args_multi(const Args *a, const char *name, const char *const **vals);

#endif
