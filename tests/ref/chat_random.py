#!/usr/bin/python3
"""tests/ref/chat_random.py - random templates, rendered by tandem
(chat_render --batch) and by jinja2 in transformers' configuration
(hf_chat.py), compared.

The templates combine what chat templates use: variables like a chat's
(strings with unicode and whitespace, numbers, None, lists, dicts, messages),
literals, every supported filter, test and method, operators, conditionals,
loops with filters, else and loop.*, set, namespace(), macros.  Most
combinations are type errors; those must fail in both.

    chat_random.py --tool BUILD/tests/chat_render [--seed 1] [-n 3000] [--mode language|whitespace]

--mode whitespace generates text and tags with every whitespace-control sign
instead (trim_blocks, lstrip_blocks, -, +, raw, comments).

A rendering that prints an object's address in Python (generators, bound
methods) cannot be compared and is skipped; tandem refusing a dotted filter
name at load (jinja2 only refuses it when it runs) is counted apart.  Any
other difference is printed and fails.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_chat  # noqa: E402

VARS = {"s": "Hello, Wörld! <think>x</think>", "e": "", "n": 7, "m": -3, "f": 2.5, "z": 0, "t": True,
        "no": None, "xs": [3, 1, 2, 2], "ss": ["b", "A", "c", "a"], "d": {"b": 1, "a": [1, 2], "c": None},
        "ms": [{"role": "system", "content": "S"}, {"role": "user", "content": " U1\n"},
               {"role": "assistant", "content": "<think>\nr\n</think>\n\nA1", "w": 1.0},
               {"role": "user", "content": "U2"}],
        "ws": "  a \n b\t ", "uni": "ΣΑΣ straße ǅ é😀 ﬁ", "big": 1e16, "tiny": 1e-05}
ATOMS = ["s", "e", "n", "m", "f", "z", "t", "no", "xs", "ss", "d", "ms", "ws", "uni", "big", "tiny", "u",
         "1", "0", "-2", "2.0", "0.5", "'ab'", "''", "'a b'", "\"q'\"", "[1, 'x']", "{'k': 'v'}", "none",
         "true", "false", "(1, 2)", "ms[0]", "ms[-1].content", "ms[2]['content']", "d.a", "d['b']",
         "xs[1:]", "s[::-1]", "s[2:5]", "uni[1:4]", "loopvar", "ns.v"]
FILTERS = ["trim", "trim('H!')", "length", "count", "list", "first", "last", "join", "join(', ')",
           "upper", "lower", "capitalize", "title", "replace('a', 'b')", "replace('', '.')",
           "default('D')", "d('D', true)", "string", "int", "int(5)", "float", "safe", "tojson",
           "tojson(indent=2)", "tojson(sort_keys=true)", "items|list", "unique|list", "dictsort", "sort",
           "sort(reverse=true)", "sort(attribute='role')", "reverse|list", "indent(2)", "indent(1, true)",
           "abs", "round", "round(1, 'floor')", "sum", "min", "max", "map(attribute='role')|list",
           "map('upper')|list", "selectattr('role', 'equalto', 'user')|list",
           "rejectattr('role', 'eq', 'user')|list", "select('odd')|list", "reject|list", "select|list",
           "center(9)", "wordcount", "format(1)", "length", "escape"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "boolean", "true", "false", "odd", "even", "divisibleby 3", "equalto 2", "eq 'x'",
         "lower", "upper", "in [1, 2]", "sameas none", "callable", "ne 1", "gt 1", "lt 'b'"]
METHODS = ["strip()", "strip('\\n')", "lstrip('H')", "rstrip()", "upper()", "lower()", "title()",
           "capitalize()", "split()", "split(',')", "split('</think>')[-1]", "rsplit(' ', 1)",
           "startswith('He')", "endswith('!')", "find('l')", "rfind('l')", "count('l')",
           "replace('l', 'L')", "splitlines()", "isalpha()", "isdigit()", "get('a')", "get('zz', 1)",
           "keys()|list", "values()|list", "items()|list", "join(ss)", "format(1, 2)", "partition(',')",
           "zfill(8)", "center(12, '*')", "swapcase()", "index('x')", "ljust(5)"]
BIN = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
UNREPRODUCIBLE = ("<generator object", " at 0x", "Markup(", "iterator object", "<built-in method",
                  "range(", "<function ")


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def expr(self, d=0):
        r = self.r
        k = r.random()
        if d > 2 or k < 0.3:
            return r.choice(ATOMS)
        if k < 0.45:
            return f"{self.expr(d + 1)}|{r.choice(FILTERS)}"
        if k < 0.55:
            return f"({self.expr(d + 1)} is {'not ' if r.random() < 0.3 else ''}{r.choice(TESTS)})"
        if k < 0.65:
            return f"{self.expr(d + 1)}.{r.choice(METHODS)}"
        if k < 0.85:
            return f"({self.expr(d + 1)} {r.choice(BIN)} {self.expr(d + 1)})"
        if k < 0.9:
            return f"(not {self.expr(d + 1)})"
        if k < 0.95:
            return f"({self.expr(d + 1)} if {self.expr(d + 1)} else {self.expr(d + 1)})"
        return f"[{self.expr(d + 1)}, {self.expr(d + 1)}]"

    def stmt(self, d=0):
        r = self.r
        k = r.random()
        if d > 1 or k < 0.35:
            return "{{ " + self.expr() + " }}"
        if k < 0.5:
            return ("{% for loopvar in " + self.expr() + (" if " + self.expr() if r.random() < 0.3 else "") +
                    " %}[{{ loopvar }}{{ loop.index }}{{ loop.last }}]" + self.stmt(d + 1) +
                    "{% else %}E{% endfor %}")
        if k < 0.6:
            return "{% set x = " + self.expr() + " %}{{ x }}" + self.stmt(d + 1)
        if k < 0.7:
            return ("{% set ns = namespace(v=0) %}{% for loopvar in xs %}{% set ns.v = ns.v + loopvar %}"
                    "{% endfor %}{{ ns.v }}" + self.stmt(d + 1))
        if k < 0.8:
            return ("{% macro mac(a, b=" + self.expr() + ") %}<{{ a }}|{{ b }}>{% endmacro %}"
                    "{{ mac(" + self.expr() + ") }}{{ mac(1, b=" + self.expr() + ") }}")
        if k < 0.9:
            return ("{%- if " + self.expr() + " %}\n  Y" + self.stmt(d + 1) + "\n{%- elif " + self.expr() +
                    " -%}\n  Z\n{% else %}\n  N\n{% endif %}\n")
        return "  {% for m in ms %}\n    {{- m.role }}: " + self.stmt(d + 1) + "\n  {% endfor %}\n"


# Whitespace control: text with spaces, tabs, newlines (also \r\n and NBSP)
# around tags with every sign (-, +, none), for trim_blocks / lstrip_blocks.
TEXT = ["a", " ", "\n", "\t", "  \n", "\n\n", " b ", "\r\n", "\u00a0", "x\n  ", "{", "}", "%", "#"]


class WsGen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def sign(self):
        return self.r.choice(["", "", "-", "+"])

    def tag(self, d):
        r, sg = self.r, self.sign
        k = r.random()
        if k < 0.25:
            return "{{" + r.choice(["", "-"]) + " 'v' " + r.choice(["", "-"]) + "}}"
        if k < 0.4:
            return "{#" + sg() + " c " + sg() + "#}"
        if k < 0.5:
            return "{%" + sg() + " set q = 1 " + sg() + "%}"
        if k < 0.6 and d < 2:
            return ("{%" + sg() + " if true " + sg() + "%}" + self.body(d + 1) + "{%" + sg() + " else " + sg() +
                    "%}" + self.body(d + 1) + "{%" + sg() + " endif " + sg() + "%}")
        if k < 0.75 and d < 2:
            return ("{%" + sg() + " for i in [1, 2] " + sg() + "%}" + self.body(d + 1) + "{%" + sg() +
                    " endfor " + sg() + "%}")
        if k < 0.8:
            return ("{%" + sg() + " raw " + r.choice(["", "-"]) + "%}" + self.body(2) + "{%" + sg() +
                    " endraw " + sg() + "%}")
        if k < 0.9 and d < 2:
            return ("{%" + sg() + " macro mm() " + sg() + "%}" + self.body(d + 1) + "{%" + sg() +
                    " endmacro " + sg() + "%}{{ mm() }}")
        return r.choice(TEXT)

    def body(self, d=0):
        r = self.r
        return "".join(r.choice(TEXT) if r.random() < 0.5 else self.tag(d) for _ in range(r.randint(0, 5)))

    def stmt(self):
        return self.body() + self.r.choice(["", "\n", "\n\n", " "])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tool", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--mode", choices=["language", "whitespace"], default="language")
    args = p.parse_args()
    g = Gen(args.seed) if args.mode == "language" else WsGen(args.seed)
    variables = json.dumps(VARS, ensure_ascii=False)
    cases = [g.stmt() for _ in range(args.n)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump([[c, variables] for c in cases], f, ensure_ascii=False)
        path = f.name
    try:
        res = json.loads(subprocess.run([args.tool, "--batch", path, "--now", "1700000000"], check=True,
                                        capture_output=True).stdout)
    finally:
        os.unlink(path)
    stats = {"same": 0, "both_fail": 0, "skipped": 0, "refused_early": 0}
    bad = 0
    for c, got in zip(cases, res):
        try:
            # fresh variables each time: jinja2 can mutate them (x|indent on a
            # list extends it in place before it fails)
            want = ("out", hf_chat.compile_template(c, 1700000000).render(**json.loads(variables)))
        except Exception as e:
            want = ("err", f"{type(e).__name__}: {e}")
        if want[0] == "out" and any(u in want[1] for u in UNREPRODUCIBLE):
            stats["skipped"] += 1
        elif want[0] == "out" and got.get("out") == want[1]:
            stats["same"] += 1
        elif want[0] == "err" and "out" not in got:
            stats["both_fail"] += 1
        elif "unsupported filter" in got.get("compile_error", "") and "." in got["compile_error"]:
            stats["refused_early"] += 1
        else:
            bad += 1
            if bad <= 20:
                print(f"chat_random: MISMATCH {c!r}\n  jinja2: {want!r}\n  tandem: {got!r}")
    print(f"chat_random: {args.mode}, seed {args.seed}, {args.n} templates: {stats['same']} identical, "
          f"{stats['both_fail']} failing in both, {stats['skipped']} print addresses (skipped), "
          f"{stats['refused_early']} refused at load, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
