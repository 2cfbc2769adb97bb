/* core/chat/jinja/jinja_value.h - the values a chat template computes with, the
 * arena they live in, and their Python spellings.
 *
 * Jinja2 runs on Python objects; a chat template only ever sees JSON-like
 * data (None, bool, int, float, str, list, dict with insertion order) plus
 * jinja2's own objects (Undefined, namespace(), macros, the loop object) and
 * a few views.  A Jv is a small tagged value; everything it points to lives
 * in a JArena that is freed as a whole when a render ends, so no value is
 * reference counted or freed on its own (a runtime error can unwind from
 * anywhere without leaking).
 *
 * Printing follows Python exactly where a template can observe it:
 *   {{ x }} is str(x): None -> "None", True -> "True", 1.0 -> "1.0",
 *     1e-05, 1e+16, lists and dicts as repr() ("['a', 1]", "{'k': None}");
 *   tojson is transformers' override, json.dumps(x, ensure_ascii=False,
 *     indent=..., separators=..., sort_keys=...): (', ', ': ') separators,
 *     floats as repr, NaN/Infinity, only '"', '\\' and control characters
 *     escaped.
 * Strings are UTF-8 with a length (a NUL byte may occur inside); lengths and
 * indices a template sees are in code points, as in Python.
 * Integers are 64-bit (Python's are unbounded): arithmetic that overflows is
 * a runtime error, never a wrong number.
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_VALUE_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* ---------------------------------------------------------------- arena */

/* Bump allocator in chunks from td_malloc.  budget (bytes, 0 = none) caps
 * the total; going past it calls the fail hook, which must not return (the
 * renderer's hook longjmps out of the render).  Without a hook, exceeding a
 * budget is a bug (TD_CHECK).  Not thread safe: one arena per render. */
typedef struct JArena JArena;
typedef void (*JArenaFail)(void *ctx, const char *msg);

JArena *jarena_new(size_t budget);
void jarena_free(JArena *a);
void jarena_set_fail(JArena *a, JArenaFail fn, void *ctx);
/* Calls the fail hook with msg (formatted); never returns. */
void jarena_fail(JArena *a, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* n bytes, 16-byte aligned, uninitialised / zeroed. */
void *jarena_alloc(JArena *a, size_t n);
void *jarena_zalloc(JArena *a, size_t n);
size_t jarena_used(const JArena *a);

/* ---------------------------------------------------------------- values */

typedef enum {
    JV_UNDEF,   /* jinja2's default Undefined */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,    /* list; tuple, generator and view with flags */
    JV_DICT,
    JV_NS,      /* namespace(): the only mutable object */
    JV_MACRO,   /* a {% macro %} or a call block's caller */
    JV_LOOP,    /* the loop object of a for */
    JV_METHOD,  /* a bound method (x.strip without the call) */
    JV_FUNC,    /* a global function (range, namespace, ...) */
} JvType;

/* Flags of a JV_LIST. */
enum {
    JV_F_TUPLE = 1, /* prints as (a, b), compares unequal to a list */
    JV_F_GEN = 2,   /* a generator / iterator (select, map, reverse, ...):
                     * always true, has no len(), no indexing */
    JV_F_KEYS = 4,  /* dict.keys() / values() / items() views: len() and */
    JV_F_VALUES = 8, /* iteration, no indexing, print as dict_keys([...]) */
    JV_F_ITEMS = 16,
    JV_F_VIEW = JV_F_KEYS | JV_F_VALUES | JV_F_ITEMS,
    JV_F_NOSEQ = JV_F_GEN | JV_F_VIEW, /* not subscriptable, not a list */
};

typedef struct JStr {
    size_t n;        /* bytes, without the terminating NUL */
    char s[];        /* NUL-terminated */
} JStr;

typedef struct JList JList;
typedef struct JDict JDict;
typedef struct JUndef JUndef;

typedef struct Jv {
    uint8_t t;       /* JvType */
    uint8_t flags;   /* JV_F_* for lists */
    uint16_t id;     /* JV_METHOD: method id; JV_FUNC: function id */
    union {
        bool b;
        int64_t i;
        double f;
        const JStr *s;
        JList *l;
        JDict *d;               /* JV_DICT, JV_NS */
        const JUndef *u;        /* may be NULL: a plain undefined */
        const void *p;          /* JV_MACRO, JV_LOOP, JV_METHOD: evaluator's */
    } u;
} Jv;

struct JList {
    size_t n;
    Jv *v;
    const char *err;     /* a generator whose iteration raises this (jinja2's
                          * map/select/... fail lazily, when iterated) */
};

typedef struct JEntry {
    Jv k, v;
} JEntry;

struct JDict {
    size_t n, cap;
    JEntry *e;       /* insertion order */
};

/* Why a value is undefined, for the error raised when it is used.  One of:
 * name set: "'name' is undefined"; obj_type and attr set:
 * "'dict object' has no attribute 'x'"; msg set: msg itself. */
struct JUndef {
    const char *name;
    const char *obj_type;
    const char *attr;
    const char *msg;
};

static inline Jv jv_none(void) { Jv v = { .t = JV_NONE }; return v; }
static inline Jv jv_bool(bool b) { Jv v = { .t = JV_BOOL, .u.b = b }; return v; }
static inline Jv jv_int(int64_t i) { Jv v = { .t = JV_INT, .u.i = i }; return v; }
static inline Jv jv_float(double f) { Jv v = { .t = JV_FLOAT, .u.f = f }; return v; }
static inline Jv jv_undef0(void) { Jv v = { .t = JV_UNDEF }; return v; }
/* An undefined with a reason; strings are borrowed (arena or static). */
Jv jv_undef(JArena *a, const char *name, const char *obj_type, const char *attr, const char *msg);
/* The message jinja2 raises when the undefined v is used. */
const char *jv_undef_message(JArena *a, Jv v);

Jv jv_str(JArena *a, const char *s, size_t n);
Jv jv_cstr(JArena *a, const char *s);
Jv jv_strv(const JStr *s);
JStr *jstr_new(JArena *a, const char *s, size_t n);

Jv jv_list(JArena *a, size_t n);          /* n items, all undefined */
Jv jv_dict(JArena *a);
Jv jv_ns(JArena *a);
/* Sets d[k] = v (replacing in place when k exists, as Python does). */
void jdict_set(JArena *a, JDict *d, Jv k, Jv v);
/* Entry with key k (string of n bytes), or NULL. */
JEntry *jdict_get_str(const JDict *d, const char *k, size_t n);
/* Entry whose key equals k (Python ==), or NULL. */
JEntry *jdict_get(const JDict *d, Jv k);

/* Python truth value. */
bool jv_truthy(Jv v);
/* Python ==. */
bool jv_eq(Jv a, Jv b);
/* a < b as Python orders them: numbers with numbers, str with str (code
 * point order), lists and tuples lexicographically.  Returns 0 and *lt, or
 * -1 when Python raises TypeError (err gets its message). */
int jv_lt(Jv a, Jv b, bool *lt, char *err, size_t errlen);
/* Hashable as a dict key / set member (no list, dict, namespace). */
bool jv_hashable(Jv v);
/* Python's type name as jinja2 shows it in messages: "dict object",
 * "None", "str object" ... */
const char *jv_type_name(Jv v);
/* Python's type(x).__name__: "dict", "NoneType", "tuple", "Macro" ...
 * (TypeError messages). */
const char *jv_pytype(Jv v);
/* True for int, float and bool (Python's numbers.Number). */
static inline bool jv_is_num(Jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
/* int or bool (an int to Python), and its value. */
static inline bool jv_is_intlike(Jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static inline int64_t jv_as_int(Jv v) { return v.t == JV_BOOL ? (int64_t)v.u.b : v.u.i; }

/* The evaluator's macro and loop objects start with these, so that values
 * print as Python prints them (<Macro 'name'>, <LoopContext 1/3>). */
typedef struct JMacroHead { const char *name; } JMacroHead;
typedef struct JLoopHead { int64_t index0, length; } JLoopHead;

/* ---------------------------------------------------------------- buffers */

/* Growable byte string in an arena.  limit (0 = none) caps its length: an
 * append past it calls the arena's fail hook with "output exceeds N bytes". */
typedef struct JBuf {
    JArena *a;
    char *p;
    size_t n, cap, limit;
} JBuf;

void jbuf_init(JBuf *b, JArena *a, size_t limit);
void jbuf_put(JBuf *b, const char *s, size_t n);
void jbuf_puts(JBuf *b, const char *s);
void jbuf_putc(JBuf *b, char c);
void jbuf_printf(JBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The contents as a string value (copied). */
Jv jbuf_value(const JBuf *b);

/* str(v) and repr(v), appended.  Undefined prints as ''. */
void jv_write_str(JBuf *b, Jv v);
void jv_write_repr(JBuf *b, Jv v);
/* str(v) as a string (v itself when it is one). */
const JStr *jv_to_jstr(JArena *a, Jv v);
/* Python's repr(float): shortest round trip, '1.0', '1e-05', 'inf'. */
void jv_write_float(JBuf *b, double f);
/* Python repr of a string, quotes chosen as Python chooses them. */
void jv_write_str_repr(JBuf *b, const char *s, size_t n);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys).  indent NULL
 * = one line; otherwise the string put per level ("  " for indent=2).
 * item_sep/key_sep NULL = Python's defaults for the indent.  Returns 0, or
 * -1 with Python's TypeError message ("Object of type Undefined is not JSON
 * serializable"). */
int jv_write_json(JBuf *b, Jv v, bool ensure_ascii, const char *indent, const char *item_sep,
                  const char *key_sep, bool sort_keys, char *err, size_t errlen);

/* ---------------------------------------------------------------- JSON in */

/* Parses JSON text (RFC 8259, as Python's json.loads reads it: ints stay
 * ints, numbers with '.' or an exponent become floats, duplicate keys keep
 * the last value at the first position, NaN/Infinity accepted) into arena
 * values.  Returns 0, or -1 with "JSON line L column C: what" in err.  An
 * integer beyond 64 bits is refused (Python would keep it exact). */
int jv_parse_json(JArena *a, const char *text, size_t n, Jv *out, char *err, size_t errlen);
/* The same from a cJSON tree.  cJSON keeps no int/float distinction: a
 * number whose value is integral and within +-2^53 becomes an int (so a
 * JSON 2.0 prints as 2; jv_parse_json keeps it a float). */
Jv jv_from_cjson(JArena *a, const struct cJSON *j);

/* ---------------------------------------------------------------- UTF-8 */

/* Decodes one code point at s (n > 0 bytes left); returns its byte length.
 * Strings reaching here are valid UTF-8 (the JSON reader and the lexer
 * check); an invalid byte decodes as itself, length 1. */
size_t jutf8_decode(const char *s, size_t n, uint32_t *cp);
/* Appends the UTF-8 encoding of cp. */
void jbuf_put_cp(JBuf *b, uint32_t cp);
/* Number of code points in s. */
size_t jutf8_len(const char *s, size_t n);
/* Byte offset of code point i (i <= jutf8_len). */
size_t jutf8_offset(const char *s, size_t n, size_t i);
/* str.isspace() of a code point (Python's definition). */
bool jpy_isspace(uint32_t cp);
/* Unicode categories L*, Nd and N* (utf8proc's tables): str.isalpha,
 * isdigit and isnumeric for one code point (Python's own tables may be a
 * Unicode version apart). */
bool jpy_isalpha(uint32_t cp);
bool jpy_isdigit(uint32_t cp);
bool jpy_isnumeric(uint32_t cp);

#endif
