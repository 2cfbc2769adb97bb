/* core/common.h - checks, the one allocator, logging and timing used by every
 * module of tandem.
 *
 * Two kinds of failure (STYLE section 5):
 *   - bugs (bad shape, NULL, impossible state): TD_CHECK prints rank, file,
 *     line and message, then calls the abort hook (MPI_Abort once comm/ has
 *     installed it, abort() otherwise) so that no rank hangs;
 *   - environment failures (files, configs, sockets): functions return a
 *     negative int and report with td_error(); only the command layer exits.
 */
#ifndef TANDEM_CORE_COMMON_H
#define TANDEM_CORE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define TD_ALIGN 64  /* bytes: every slab is aligned for AVX-512 and BLAS */

/* Always-on invariant check. */
#define TD_CHECK(cond, ...)                                                   \
    do {                                                                      \
        if (!(cond)) td_fatal(__FILE__, __LINE__, __VA_ARGS__);               \
    } while (0)

void td_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* Called by td_fatal before it exits; comm/ sets it to an MPI_Abort. */
extern void (*td_abort_hook)(void);

/* Rank prefix for messages; -1 (default) prints none. */
extern int td_log_rank;
/* Minimum level printed by td_info (0 = everything, 1 = quiet). */
extern int td_quiet;
/* While set, ranks other than 0 print no td_error lines: for phases where
 * every rank detects the same problem (a bad config or topology), so the
 * job reports it once. */
extern int td_errors_rank0_only;

/* One line on stderr, "tandem: error: ..." (prefixed with the rank when set). */
void td_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One informational line on stderr unless td_quiet. */
void td_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checked, 64-byte aligned allocation; aborts with file, line and size on
 * failure.  Memory from td_malloc is released with td_free (NULL is fine). */
#define td_malloc(n) td_malloc_((n), __FILE__, __LINE__)
#define td_calloc(n) td_calloc_((n), __FILE__, __LINE__)
#define td_strdup(s) td_strdup_((s), __FILE__, __LINE__)
void *td_malloc_(size_t n, const char *file, int line);
void *td_calloc_(size_t n, const char *file, int line);
char *td_strdup_(const char *s, const char *file, int line);
void td_free(void *p);
/* Bytes currently allocated through td_malloc and the peak since start. */
size_t td_mem_current(void);
size_t td_mem_peak(void);
/* Resident set size high-water mark of the process, bytes (from /proc). */
size_t td_rss_peak(void);
/* The resident set size now and its high-water mark, bytes (either may be
 * NULL; 0 where /proc/self/status cannot be read). */
void td_rss(size_t *cur, size_t *peak);

/* snprintf that says whether the whole result fitted: 0, or -1 when out
 * (n bytes) holds only a prefix.  For paths and names built from input:
 * a cut path names another file, so the caller refuses it instead. */
int td_snprintf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The formatted string in memory of its own size (td_malloc'd: td_free). */
char *td_sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* s[0..len) (valid UTF-8; NUL bytes allowed) as a JSON string literal
 * with its quotes: '"', '\\' and control characters escaped (\n, \t, \r,
 * else \u00XX).  td_malloc'd; for text fields that may hold a NUL, which
 * cJSON strings cannot (add it with cJSON_AddRawToObject). */
char *td_json_string(const char *s, size_t len);

/* Reads the file at path whole into *out, NUL-terminated (td_malloc'd:
 * td_free), its length in *len (may be NULL).  0 when read; 1 when it does
 * not exist (ENOENT; *out NULL, err untouched); -1 with one line in err
 * ("PATH: cannot open: why", "PATH: read error", "PATH: larger than MAX
 * bytes") otherwise.  max bounds the size (0: no bound).  Pipes and other
 * files whose size is not known beforehand are read too. */
int td_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t err_len);

/* mkdir -p PATH (mode 0755): 0 when PATH is a directory afterwards, else -1
 * with errno (ENOTDIR when it names a file, ENAMETOOLONG past 4095 bytes). */
int td_mkdir_p(const char *path);

/* Monotonic seconds. */
double td_now(void);

static inline size_t td_round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
static inline size_t td_min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t td_max(size_t a, size_t b) { return a > b ? a : b; }

#endif
