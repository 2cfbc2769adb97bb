/* core/chat/jinja/jinja_lex.h - the Jinja lexer, configured as transformers
 * configures jinja2 for chat templates.
 *
 * jinja2 (lexer.py, 3.1) with trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False and the default delimiters:
 *   - "\r\n" and "\r" become "\n"; one final "\n" of the source is dropped;
 *   - {% ... %}, {{ ... }}, {# ... #}; {%- / -%} (and {{-, -}}, {#-, -#})
 *     strip all whitespace before / after the tag;
 *   - trim_blocks: the first "\n" after %} or #} is removed (not after }},
 *     and not after +%});
 *   - lstrip_blocks: spaces and tabs from the start of a line up to {% or {#
 *     are removed (not before {{, and not for {%+);
 *   - a tag ends only when its brackets balance ({{ {'a': 1}}} is fine);
 *   - {% raw %}...{% endraw %} is data, taken literally;
 *   - string literals decode as Python's "unicode-escape" codec does.
 * "Whitespace" is Python's str.isspace().
 */
#ifndef TANDEM_CORE_CHAT_JINJA_JINJA_LEX_H
#define TANDEM_CORE_CHAT_JINJA_JINJA_LEX_H

#include "core/chat/jinja/jinja_value.h"

typedef enum {
    JT_EOF,
    JT_DATA,         /* template text: s, n */
    JT_VAR_BEGIN,    /* {{ */
    JT_VAR_END,      /* }} */
    JT_BLOCK_BEGIN,  /* {% */
    JT_BLOCK_END,    /* %} */
    JT_NAME,         /* s, n */
    JT_STRING,       /* s, n: decoded */
    JT_INT,          /* i */
    JT_FLOAT,        /* f */
    JT_OP,           /* op */
} JTokType;

typedef enum {
    JOP_ADD, JOP_SUB, JOP_DIV, JOP_FLOORDIV, JOP_MUL, JOP_MOD, JOP_POW, JOP_TILDE,
    JOP_LBRACKET, JOP_RBRACKET, JOP_LPAREN, JOP_RPAREN, JOP_LBRACE, JOP_RBRACE,
    JOP_EQ, JOP_NE, JOP_GT, JOP_GTEQ, JOP_LT, JOP_LTEQ, JOP_ASSIGN, JOP_DOT,
    JOP_COLON, JOP_PIPE, JOP_COMMA, JOP_SEMICOLON,
} JOp;

typedef struct JTok {
    uint8_t type;    /* JTokType */
    uint8_t op;      /* JOp for JT_OP */
    int line;        /* 1-based line in the template */
    const char *s;   /* JT_DATA, JT_NAME, JT_STRING: bytes in the arena */
    size_t n;
    int64_t i;
    double f;
} JTok;

/* Splits src (n bytes of UTF-8) into tokens allocated in a, ending with
 * JT_EOF.  Returns 0, or -1 with "line L: what" in err. */
int jlex(JArena *a, const char *src, size_t n, JTok **toks, size_t *ntoks, char *err, size_t errlen);

#endif
