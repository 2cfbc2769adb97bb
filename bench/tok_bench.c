/* bench/tok_bench.c - tokenizer load time and encode throughput on one core.
 *
 *   tok_bench DIR TEXT.txt SECONDS
 *
 * Loads DIR (tokenizer.json + tokenizer_config.json), then encodes the
 * lines of TEXT.txt (split on \n, without special tokens) over and over for
 * about SECONDS, as tests/ref/tok_ref.js bench does for the reference, and
 * prints {"load_s", "bytes", "seconds", "mb_per_s", "tokens"}, in CPU
 * seconds of the one thread.  Used by bench/tokenize.sh. */
#include "core/common.h"
#include "core/tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU seconds of this thread: the machine is shared, wall time is not
 * what one core did. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: tok_bench DIR TEXT.txt SECONDS\n");
        return 2;
    }
    char err[512];
    double t0 = cpu_now();
    Tokenizer *t;
    if (tok_load_dir(&t, argv[1], err, sizeof err)) {
        fprintf(stderr, "tok_bench: %s\n", err);
        return 1;
    }
    double load_s = cpu_now() - t0;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "tok_bench: cannot open %s\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "tok_bench: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    double secs = atof(argv[3]), el = 0;
    size_t bytes = 0, tokens = 0;
    TokIds ids = { 0 };
    t0 = cpu_now();
    do {
        size_t at = 0;
        while (at < (size_t)n) {
            const char *nl = memchr(text + at, '\n', (size_t)n - at);
            size_t e = nl ? (size_t)(nl - text) : (size_t)n;
            ids.n = 0;
            if (tok_encode(t, text + at, e - at, false, &ids, err, sizeof err)) {
                fprintf(stderr, "tok_bench: %s\n", err);
                return 1;
            }
            tokens += ids.n;
            at = e + 1;
        }
        bytes += (size_t)n;
        el = cpu_now() - t0;
    } while (el < secs);
    printf("{\"load_s\": %.3f, \"bytes\": %zu, \"seconds\": %.3f, \"mb_per_s\": %.3f, \"tokens\": %zu}\n", load_s,
           bytes, el, (double)bytes / el / 1e6, tokens);
    tok_ids_free(&ids);
    tok_free(t);
    free(text);
    return 0;
}
