/* core/common.c - checks, allocator, logging, timing (see common.h). */
#include "core/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <stdatomic.h>

void (*td_abort_hook)(void) = NULL;
int td_log_rank = -1;
int td_quiet = 0;
int td_errors_rank0_only = 0;

static _Atomic size_t g_mem_current, g_mem_peak;

/* The whole line, however long (a message may quote long paths). */
static void vprint_line(const char *tag, const char *fmt, va_list ap)
{
    va_list aq;
    va_copy(aq, ap);
    int k = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    char small[512], *buf = small;
    size_t cap = sizeof small;
    if (k >= (int)sizeof small) {
        char *big = malloc((size_t)k + 1);   /* without memory: the line's start */
        if (big) buf = big, cap = (size_t)k + 1;
    }
    small[0] = 0;
    vsnprintf(buf, cap, fmt, ap);
    if (td_log_rank >= 0)
        fprintf(stderr, "[rank %d] tandem: %s%s\n", td_log_rank, tag, buf);
    else
        fprintf(stderr, "tandem: %s%s\n", tag, buf);
    if (buf != small) free(buf);
}

char *td_sprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    TD_CHECK(k >= 0, "td_sprintf: bad format \"%s\"", fmt);
    char *s = td_malloc((size_t)k + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)k + 1, fmt, ap);
    va_end(ap);
    return s;
}

char *td_json_string(const char *s, size_t len)
{
    char *o = td_malloc(6 * len + 3);
    size_t k = 0;
    o[k++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            o[k++] = '\\';
            o[k++] = (char)c;
        } else if (c == '\n' || c == '\t' || c == '\r') {
            o[k++] = '\\';
            o[k++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20 || c == 0x7f) {
            k += (size_t)snprintf(o + k, 7, "\\u%04x", c);
        } else {
            o[k++] = (char)c;
        }
    }
    o[k++] = '"';
    o[k] = 0;
    return o;
}

int td_snprintf(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return k >= 0 && (size_t)k < n ? 0 : -1;
}

void td_fatal(const char *file, int line, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (td_log_rank >= 0)
        fprintf(stderr, "[rank %d] tandem: fatal: %s:%d: %s\n", td_log_rank, file, line, msg);
    else
        fprintf(stderr, "tandem: fatal: %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    if (td_abort_hook) td_abort_hook();
    abort();
}

void td_error(const char *fmt, ...)
{
    if (td_errors_rank0_only && td_log_rank > 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprint_line("error: ", fmt, ap);
    va_end(ap);
}

void td_info(const char *fmt, ...)
{
    if (td_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    vprint_line("", fmt, ap);
    va_end(ap);
}

/* Each block carries a 64-byte header so td_free can account for it and
 * the user pointer stays 64-byte aligned: the size, then the pointer the C
 * library gave. */
static void *account(void *raw, char *user, size_t n)
{
    char *h = user - TD_ALIGN;
    memcpy(h, &n, sizeof n);
    memcpy(h + sizeof n, &raw, sizeof raw);
    size_t cur = atomic_fetch_add(&g_mem_current, n) + n;
    size_t peak = atomic_load(&g_mem_peak);
    while (cur > peak && !atomic_compare_exchange_weak(&g_mem_peak, &peak, cur)) {}
    return user;
}

void *td_malloc_(size_t n, const char *file, int line)
{
    void *p = NULL;
    size_t total = n + TD_ALIGN;
    if (total < n || posix_memalign(&p, TD_ALIGN, total) != 0 || !p)
        td_fatal(file, line, "out of memory allocating %zu bytes", n);
    return account(p, (char *)p + TD_ALIGN, n);
}

/* Large blocks come zeroed from calloc, which maps fresh pages without
 * writing them: a page becomes resident when it is first written (a
 * server's KV cache holds only the blocks it has used; an arena the
 * layers it has reached), instead of all at once here. */
#define CALLOC_LAZY ((size_t)1 << 20)

void *td_calloc_(size_t n, const char *file, int line)
{
    if (n < CALLOC_LAZY) {
        void *p = td_malloc_(n, file, line);
        memset(p, 0, n);
        return p;
    }
    size_t total = n + 2 * TD_ALIGN;
    void *raw = total < n ? NULL : calloc(1, total);
    if (!raw) td_fatal(file, line, "out of memory allocating %zu bytes", n);
    uintptr_t u = ((uintptr_t)raw + 2 * TD_ALIGN - 1) & ~(uintptr_t)(TD_ALIGN - 1);   /* >= raw + TD_ALIGN */
    return account(raw, (char *)u, n);
}

char *td_strdup_(const char *s, const char *file, int line)
{
    size_t n = strlen(s) + 1;
    char *p = td_malloc_(n, file, line);
    memcpy(p, s, n);
    return p;
}

void td_free(void *p)
{
    if (!p) return;
    const char *h = (const char *)p - TD_ALIGN;
    size_t n;
    void *raw;
    memcpy(&n, h, sizeof n);
    memcpy(&raw, h + sizeof n, sizeof raw);
    atomic_fetch_sub(&g_mem_current, n);
    free(raw);
}

size_t td_mem_current(void) { return atomic_load(&g_mem_current); }
size_t td_mem_peak(void) { return atomic_load(&g_mem_peak); }

void td_rss(size_t *cur, size_t *peak)
{
    size_t c = 0, p = 0, kb;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) p = kb * 1024;
            if (sscanf(line, "VmRSS: %zu kB", &kb) == 1) c = kb * 1024;
        }
        fclose(f);
    }
    if (cur) *cur = c;
    if (peak) *peak = p;
}

size_t td_rss_peak(void)
{
    size_t p;
    td_rss(NULL, &p);
    return p;
}

double td_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int td_read_file(const char *path, size_t max, char **out, size_t *len, char *err, size_t err_len)
{
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 1;
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = td_malloc(cap + 1);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (max && n > max) break;
        if (n < cap) break;
        char *b2 = td_malloc(2 * cap + 1);
        memcpy(b2, buf, n);
        td_free(buf);
        buf = b2;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad || (max && n > max)) {
        if (bad)
            snprintf(err, err_len, "%s: read error", path);
        else
            snprintf(err, err_len, "%s: larger than %zu bytes", path, max);
        td_free(buf);
        return -1;
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int td_mkdir_p(const char *path)
{
    char buf[4096];
    if (td_snprintf(buf, sizeof buf, "%s", path)) return errno = ENAMETOOLONG, -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) return -1;
    struct stat st;
    if (stat(buf, &st) || !S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
    return 0;
}
