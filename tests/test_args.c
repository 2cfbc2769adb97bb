/* tests/test_args.c - the command-line parser (core/args.h): every value
 * is kept, in order, however many there are. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/common.h"

static const char *const g_spec[] = { "ckpt=", "json", "stop+", "input+", NULL };

/* argv of n strings made by fmt(i), owned: free with free_argv. */
typedef struct {
    char **v;
    int n;
} Argv;

static void argv_add(Argv *a, const char *s)
{
    char **v = td_malloc((size_t)(a->n + 1) * sizeof(char *));
    if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof(char *));
    td_free(a->v);
    a->v = v;
    a->v[a->n++] = td_strdup(s);
}

static void argv_free(Argv *a)
{
    for (int i = 0; i < a->n; i++) td_free(a->v[i]);
    td_free(a->v);
    memset(a, 0, sizeof *a);
}

/* "--input=v<i>" repeated n times between two other options; before the
 * tables grew with argc, more than 64 of them wrote past multi[o][63]. */
static void repeated_eq(int n)
{
    Argv v = { 0 };
    argv_add(&v, "tandem");
    argv_add(&v, "--stop=first");
    char s[32];
    for (int i = 0; i < n; i++) {
        snprintf(s, sizeof s, "--input=v%d", i);
        argv_add(&v, s);
    }
    argv_add(&v, "--stop");
    argv_add(&v, "second");
    Args a;
    char err[256];
    cr_assert_eq(args_parse(&a, v.n, v.v, 1, g_spec, err, sizeof err), 0, "%s", err);
    const char *const *in = NULL, *const *st = NULL;
    cr_assert_eq(args_multi(&a, "input", &in), n, "%d --input values, want %d", args_multi(&a, "input", &in), n);
    for (int i = 0; i < n; i++) {
        snprintf(s, sizeof s, "v%d", i);
        cr_assert_str_eq(in[i], s, "value %d", i);
    }
    cr_assert_eq(args_multi(&a, "stop", &st), 2);
    cr_assert_str_eq(st[0], "first");
    cr_assert_str_eq(st[1], "second");
    cr_assert_str_eq(args_get(&a, "input"), "v0", "args_get gives the first value");
    args_free(&a);
    argv_free(&v);
}

Test(args, a_thousand_repeats_of_an_option_are_all_kept) { repeated_eq(1000); }
Test(args, five_thousand_repeats_of_an_option_are_all_kept) { repeated_eq(5000); }

/* "--input a b c ..." once: the old parser dropped every value past the
 * 64th without a word. */
Test(args, a_thousand_values_after_one_option_are_all_kept)
{
    Argv v = { 0 };
    argv_add(&v, "tandem");
    argv_add(&v, "--input");
    char s[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(s, sizeof s, "f%d", i);
        argv_add(&v, s);
    }
    argv_add(&v, "--json");
    Args a;
    char err[256];
    cr_assert_eq(args_parse(&a, v.n, v.v, 1, g_spec, err, sizeof err), 0, "%s", err);
    const char *const *in = NULL;
    cr_assert_eq(args_multi(&a, "input", &in), 1000);
    for (int i = 0; i < 1000; i++) {
        snprintf(s, sizeof s, "f%d", i);
        cr_assert_str_eq(in[i], s, "value %d", i);
    }
    cr_assert(args_flag(&a, "json"));
    cr_assert_eq(a.n_pos, 0);
    args_free(&a);
    args_free(&a);   /* safe twice */
    argv_free(&v);
}

Test(args, a_thousand_positionals_are_all_kept)
{
    Argv v = { 0 };
    argv_add(&v, "tandem");
    char s[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(s, sizeof s, "key%d=%d", i, i);
        argv_add(&v, s);
        if (i == 500) argv_add(&v, "--ckpt=c.h5");
    }
    Args a;
    char err[256];
    cr_assert_eq(args_parse(&a, v.n, v.v, 1, g_spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.n_pos, 1000);
    for (int i = 0; i < 1000; i++) {
        snprintf(s, sizeof s, "key%d=%d", i, i);
        cr_assert_str_eq(a.pos[i], s, "positional %d", i);
    }
    cr_assert_str_eq(args_get(&a, "ckpt"), "c.h5");
    args_free(&a);
    argv_free(&v);
}

Test(args, values_of_interleaved_options_keep_their_order)
{
    char *argv[] = { "tandem", "--input", "a", "--stop", "x", "--input=b", "c", "pos", "--json",
                     "--stop=y", "--ckpt", "k1", "--ckpt=k2", NULL };
    /* "pos" follows --input's values: it is one of them (values run to the next option) */
    Args a;
    char err[256];
    cr_assert_eq(args_parse(&a, 13, argv, 1, g_spec, err, sizeof err), 0, "%s", err);
    const char *const *in = NULL, *const *st = NULL;
    cr_assert_eq(args_multi(&a, "input", &in), 4);
    const char *want[] = { "a", "b", "c", "pos" };
    for (int i = 0; i < 4; i++) cr_assert_str_eq(in[i], want[i]);
    cr_assert_eq(args_multi(&a, "stop", &st), 2);
    cr_assert_str_eq(st[0], "x");
    cr_assert_str_eq(st[1], "y");
    cr_assert_str_eq(args_get(&a, "ckpt"), "k2", "the last value of a \"=\" option wins");
    cr_assert(args_flag(&a, "json"));
    cr_assert_eq(a.n_pos, 0);
    args_free(&a);
}

Test(args, errors_name_the_option)
{
    struct {
        char *argv[4];
        int argc;
        const char *want;
    } cases[] = {
        { { "t", "--nope", NULL }, 2, "unknown option --nope" },
        { { "t", "--json=1", NULL }, 2, "option --json takes no value" },
        { { "t", "--ckpt", NULL }, 2, "option --ckpt needs a value" },
        { { "t", "--input", "--json", NULL }, 3, "option --input needs at least one value" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Args a;
        char err[256] = "";
        cr_assert_eq(args_parse(&a, cases[i].argc, cases[i].argv, 1, g_spec, err, sizeof err), -1, "case %zu", i);
        cr_assert_str_eq(err, cases[i].want, "case %zu", i);
        args_free(&a);   /* released already: safe */
    }
}
