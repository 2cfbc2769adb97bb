/* core/chat/jinja/jinja_builtins.h - jinja2's filters and tests, Python's string,
 * dict and list methods, and the global functions a chat template can call.
 *
 * Filters: abs, capitalize, center, count, d, default, dictsort, e, escape,
 * first, float, format, indent, int, items, join, last, length, list, lower,
 * map, max, min, reject, rejectattr, replace, reverse, round, safe, select,
 * selectattr, sort, string, sum, title, tojson (transformers' override),
 * trim, unique, upper, wordcount.
 * Tests: boolean, callable, defined, divisibleby, eq, equalto, ==, escaped,
 * even, false, filter, float, ge, >=, gt, >, greaterthan, in, integer,
 * iterable, le, <=, lower, lessthan, lt, <, mapping, ne, !=, none, number,
 * odd, sameas, sequence, string, test, true, undefined, upper.
 * Methods: str capitalize center count endswith find format index isalnum
 * isalpha isdigit islower isspace isupper join ljust lower lstrip partition
 * removeprefix removesuffix replace rfind rindex rjust rpartition rsplit
 * rstrip split splitlines startswith strip swapcase title upper zfill;
 * dict copy get items keys values; list and tuple count index; loop cycle
 * changed.
 * Globals: range, namespace, dict, raise_exception and strftime_now
 * (transformers adds the last two).
 *
 * Case mappings (upper, lower, title ...) use Unicode's simple mappings
 * (utf8proc); Python's full mappings differ for a few characters (ß ->
 * 'SS', ligatures, final sigma).  safe returns its string unchanged (no
 * Markup type: concatenating a safe string does not escape the other
 * operand as markupsafe would).
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_BUILTINS_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_BUILTINS_H

#include "core/chat/jinja/jinja_eval.h"

/* Ids by name (-1 when unsupported), used while parsing. */
int jbi_filter_id(const char *s, size_t n);
const char *jbi_filter_name(int id);
int jbi_test_id(const char *s, size_t n);
int jbi_func_id(const char *s, size_t n);
/* A method name the evaluator implements for some type. */
bool jbi_method_known(const char *s, size_t n);

/* v | filter(args). */
Jv jbi_filter(JRender *r, int id, Jv v, const JArgs *args);
/* v is test(args). */
bool jbi_test(JRender *r, int id, Jv v, const JArgs *args);
/* Id of the method `name` of obj's Python type (implemented or not), or
 * -1 when the type has no such attribute. */
int jbi_method_of(Jv obj, const char *s, size_t n);
Jv jbi_call_method(JRender *r, Jv self, int id, const JArgs *args);
Jv jbi_call_func(JRender *r, int id, const JArgs *args);
/* fmt % args: Python's printf-style formatting (%s %r %d %i %f %x %%, with
 * flags, width and precision); args is a tuple or a single value. */
Jv jbi_str_percent(JRender *r, const JStr *fmt, Jv args);

#endif
