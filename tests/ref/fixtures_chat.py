#!/usr/bin/python3
"""tests/ref/fixtures_chat.py - jinja2's output for each language feature that
core/chat implements, for tests/test_chat.c.

Every case is a template and its variables; the template is rendered by Python's
jinja2 configured as transformers configures it (tests/ref/hf_chat.py), and the
fixture records the output, or that jinja2 refused it (at compile time or while
rendering; for raise_exception, its message).  tests/test_chat.c renders each
case with tandem and compares byte for byte.

Writes OUT/chat_cases.json: {"group": [{"template", "vars" (JSON text),
"out" | "compile_error" | "render_error", "raised"?}, ...], ...}.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_chat  # noqa: E402

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
NESTED = {"a": 1, "b": [1, 2.5, None, True, "x"], "c": {"d": "é\n\"<>&'", "e": []}, "f": {}}

CASES = {
    "whitespace": [
        ("a\n{% if true %}\nb\n{% endif %}\nc\n", {}),
        ("  {% if true %}\n  x\n  {% endif %}\n", {}),
        ("  {%+ if true %}x{% endif %}|", {}),
        ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
        ("x {{- 1 -}} y {{ 2 }} z", {}),
        ("a {# comment #}\nb\n  {# indented comment #}\nc {#- strip -#}  d", {}),
        ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", {}),
        ("{{ 'x' }}\n{{ 'y' }}\n", {}),
        ("line1\r\nline2\rline3\n", {}),
        ("trailing two newlines\n\n", {}),
        ("{% raw %}{{ not evaluated }} {% if %}{% endraw %}after", {}),
        ("  {% raw -%}  keep {{ x }}  {%- endraw %}\n|", {}),
        ("{% if true +%}\nkept newline{% endif %}", {}),
        ("\t{% if true %}\ttab{% endif %}", {}),
        ("{{ {'a': {'b': 1}} }}", {}),
        ("{%- set x = 1 -%}\n\n  {{ x }}  \n\n", {}),
        ("a\n  {%- if true %} b{% endif %}", {}),
        ("{% if true %}   \n x{% endif %}", {}),
        ("x  {#- c #}", {}),
        ("an unterminated comment opener at the very end {#", {}),
        ("{{- 'a' }}   {# c -#}   {{ 'b' }}", {}),
        ("a\u00a0 {%- if true %}b{% endif %}|\n\u3000{% if true %}c{% endif %}|\n \t {%- if true -%} \u2003 d{% endif %}", {}),
        ("{%- for m in messages %}\n    {%- if m.role == 'user' %}\n        {{- 'U:' + m.content }}\n    {%- else %}\n        {{- 'A:' + m.content }}\n    {%- endif %}\n{%- endfor %}\n", {"messages": MSGS}),
        ("{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}\n{% if add_generation_prompt %}\n  assistant:\n{% endif %}\n", {"messages": MSGS, "add_generation_prompt": True}),
    ],
    "literals": [
        ("{{ 'a\\nb\\tc\\\\d\\'e\\\"f' }}", {}),
        ("{{ \"double 'single'\" }}|{{ 'it''s' }}", {}),
        ("{{ '\\x41\\u00e9\\U0001F600\\101' }}", {}),
        ("{{ 'unknown \\q escape' }}|{{ 'é\\é' }}", {}),
        ("{{ 42 }} {{ -7 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }}", {}),
        ("{{ 1.5 }} {{ 1.0 }} {{ 2e3 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1.5e300 * 1e10 }}", {}),
        ("{{ true }} {{ True }} {{ false }} {{ none }} {{ None }}", {}),
        ("{{ [1, 'a', 2.0, none, true, [], {}] }}", {}),
        ("{{ {'k': 'v', 1: 2, 'n': none} }}", {}),
        ("{{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}", {}),
        ("{{ x }} {{ y }} {{ z }}", {"x": NESTED, "y": [1.0, -0.0, 1e-7, 123456789.123], "z": "plain"}),
        ("{{ ['it\\'s', \"q\\\"d\", 'both \\' \"', '\\n\\t\\x01\\x7f\\u00a0\\u200b é'] }}", {}),
        ("{{ 'a' 'b' \"c\" }}", {}),
        ("{{ [1, 2,] }} {{ {'a': 1,} }}", {}),
        ("{{ 9223372036854775807 }} {{ -9223372036854775807 - 1 }}", {}),
    ],
    "operators": [
        ("{{ 1 + 2 }} {{ 5 - 7 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }}", {}),
        ("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ 2.5 ** 2 }} {{ -2 ** 2 }}", {}),
        ("{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1 + 2.0 }} {{ true + 1 }} {{ true * 2.5 }}", {}),
        ("{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] + [2] }} {{ [0] * 3 }} {{ 'x' * 0 }}{{ 'y' * -1 }}|", {}),
        ("{{ 'a' ~ 1 ~ 2.0 ~ none ~ true ~ [1] ~ u }}", {}),
        ("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' == 'a' }} {{ [1,2] == [1,2] }} {{ (1,2) == [1,2] }} {{ {'a':1} == {'a':1.0} }} {{ none == none }} {{ 1 != 2 }}", {}),
        ("{{ 1 < 2 }} {{ 2 <= 2 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1,2] < [1,3] }} {{ 3 > 2.5 }} {{ 2 >= 3 }} {{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }}", {}),
        ("{{ 'b' in 'abc' }} {{ '' in 'x' }} {{ 1 in [1,2] }} {{ 'k' in {'k':1} }} {{ 3 not in [1,2] }} {{ 'x' in u }} {{ 1.0 in [1] }}", {}),
        ("{{ true and 'x' }} {{ false and 1 }} {{ 0 or 'y' }} {{ '' or [] }} {{ not 0 }} {{ not 'a' }} {{ not u }}", {}),
        ("{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ 1 if 0 else 2 if 0 else 3 }}", {}),
        ("{{ not 1 == 2 }} {{ -3|abs }} {{ -(3) }} {{ +4 }} {{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 'a' ~ 1 + 2 }}", {}),
        ("{{ 'a' in 'abc' and 'z' not in 'abc' }} {{ not 'a' in 'b' }}", {}),
        ("{{ 1 + 'a' }}", {}),
        ("{{ 'a' + 1 }}", {}),
        ("{{ 1 / 0 }}", {}),
        ("{{ 1 < 'a' }}", {}),
        ("{{ 1 in 'abc' }}", {}),
        ("{{ 'a' in 5 }}", {}),
        ("{{ u + 1 }}", {}),
        ("{{ u < 1 }}", {}),
        ("{{ -'a' }}", {}),
    ],
    "access": [
        ("{{ m.role }} {{ m['role'] }} {{ m.get('role') }} {{ m.get('x', 'dflt') }} {{ m.get('x') }}", {"m": MSGS[0]}),
        ("{{ ms[0].content }} {{ ms[-1]['content'] }} {{ ms.1.role }} [{{ ms[10] }}] [{{ ms[10] is defined }}]", {"ms": MSGS}),
        ("{{ 'hello'[1] }} {{ 'hello'[-1] }} {{ 'héllo'[1] }} [{{ 'abc'[5] }}]", {}),
        ("{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[::2] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[:-2] }} {{ 'héllo wörld'[1:8:2] }} {{ 'abc'[5:] }}|", {}),
        ("{{ xs[1:] }} {{ xs[::-1] }} {{ xs[-2:] }} {{ xs[:0] }} {{ xs[10:] }} {{ xs[1:-1] }} {{ xs[::-2] }} {{ xs[5:1:-1] }}", {"xs": [1, 2, 3, 4, 5]}),
        ("{{ d.items() }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}", {"d": {"a": 1, "b": [2]}}),
        ("{{ d.items is defined }} {{ d['items'] is defined }} {{ d.nokey is defined }} {{ d.copy() }}", {"d": {"a": 1}}),
        ("{{ d.keys is defined }} {{ d.keys is callable }} {{ d.items()[0] is defined }} {{ d.items()|length }}", {"d": {"a": 1}}),
        ("{{ n.x }}|{{ n.x is defined }}|{{ n['x'] is defined }}", {"n": None}),
        ("{{ u.x }}", {}),
        ("{{ d.a.b }}", {"d": {}}),
        ("{{ u[0] }}", {}),
        ("{{ 'abc'[::0] }}", {}),
        ("{{ [1,2].count(1) }} {{ [1,2,1].index(1) }} {{ (3,4).index(4) }}", {}),
        ("{{ d['x'] }}|{{ d[0] is defined }}", {"d": {"x": {"y": 1}}}),
    ],
    "loops": [
        ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.depth }}|{% endfor %}", {"xs": "abc"}),
        ("{% for x in xs %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') }} {% endfor %}", {"xs": [1, 2, 3]}),
        ("{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in u %}x{% else %}undefined is empty{% endfor %}", {}),
        ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
        ("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}", {"xs": [1, 2, 3, 0, 4]}),
        ("{% for x in xs if x > 9 %}{{ x }}{% else %}none{% endfor %}", {"xs": [1, 2]}),
        ("{% for x in xs|sort %}{{ x }}{% endfor %} {% for x in xs|reverse %}{{ x }}{% endfor %}", {"xs": [3, 1, 2]}),
        ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
        ("{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}", {}),
        ("{% for a, b in [[1, 2], (3, 4), 'ab'] %}{{ a }}{{ b }} {% endfor %}", {}),
        ("{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {"xs": [1, 2, 3]}),
        ("{% for x in xs %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {"xs": [1, 1, 2, 2, 1]}),
        ("{% for m in ms %}{% if not loop.first %},{% endif %}{{ m.role }}{% endfor %}", {"ms": MSGS}),
        ("{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {% for i in range(5, 0, -2) %}{{ i }}{% endfor %}", {}),
        ("{% for x in 1, 2, 3 %}{{ x }}{% endfor %}", {}),
        ("{% for x in 5 %}{% endfor %}", {}),
        ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
        ("{% for x in none %}{% endfor %}", {}),
        ("{{ loop }}", {}),
        ("{% for x in [1] %}{{ loop.nextitem }}|{{ loop.nextitem is defined }}{% endfor %}", {}),
    ],
    "scoping": [
        ("{% for i in range(3) %}{% if i == 0 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}", {}),
        ("{% set x = 'o' %}{% for i in range(2) %}[{{ x }}]{% set x = i %}[{{ x }}]{% endfor %}{{ x }}", {}),
        ("{% set x = 'o' %}{% if true %}{% set x = 'i' %}{% endif %}{{ x }}", {}),
        ("{% set ns = namespace(total=0, names=[]) %}{% for i in [1,2,3] %}{% set ns.total = ns.total + i %}{% set ns.names = ns.names + [i] %}{% endfor %}{{ ns.total }} {{ ns.names }} {{ ns }}", {}),
        ("{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }} {{ ns.b }}|{{ ns.b is defined }}", {}),
        ("{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = 1, 2 %}{{ t }}", {}),
        ("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}] {% set y | upper %}up{% endset %}{{ y }}", {}),
        ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
        ("{% set v = 1 %}{% with v = v + 1 %}{{ v }}{% endwith %}{{ v }}", {}),
        ("{% if not x is defined %}{% set x = 'dflt' %}{% endif %}{{ x }}", {}),
        ("{% if not x is defined %}{% set x = 'dflt' %}{% endif %}{{ x }}", {"x": "given"}),
        ("{% set messages = messages[1:] %}{{ messages|length }}", {"messages": MSGS}),
        ("{% for x in [1] %}{% set inner = 5 %}{% endfor %}[{{ inner }}]", {}),
        ("{% set x = 1 %}{% set x.a = 2 %}", {}),
        ("{% set ns = namespace(d={'a': 1}) %}{{ ns.d.a }} {{ namespace(a=1, b='x') }} {{ namespace({'k': 'v'}).k }}", {}),
        ("{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
        ("{% generation %}gen {{ 1 }}{% set g = 2 %}{% endgeneration %}[{{ g }}]", {}),
        ("{% set range = 5 %}{{ range }}", {}),
        ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<{{ m.content }}>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}", {"messages": MSGS}),
        ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}[{{ p.type }}]{% endif %}{% endfor %}{% endif %}|{% endfor %}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": " ok"}]}, {"role": "assistant", "content": "plain"}]}),
    ],
    "macros": [
        ("{% macro m(a, b='x') %}[{{ a }}{{ b }}{{ g }}]{% endmacro %}{% set g = 'G' %}{{ m(1) }}{{ m(1, b=2) }}{{ m(b=3, a=4) }}", {}),
        ("{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}", {}),
        ("{% macro m(a) %}{{ a }}|{{ a is defined }}{% endmacro %}{{ m() }}", {}),
        ("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", {}),
        ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
        ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}", {}),
        ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}", {}),
        ("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}", {}),
        ("{% macro m() %}{% set local = 1 %}{{ local }}{% endmacro %}{{ m() }}[{{ local }}]", {}),
        ("{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(5) }}", {}),
        ("{% macro m(x) %}{{ x }}{% endmacro %}{{ m }} {{ m is callable }}", {}),
        ("{% macro m() %}a{% endmacro %}{% set ns = namespace(f=m) %}{{ ns.f() }}", {}),
    ],
    "filters": [
        ("{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 5|trim }}|{{ u|trim }}|", {}),
        ("{{ x|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ u|length }} {{ []|length }}", {"x": [1, 2, 3]}),
        ("{{ 5|length }}", {}),
        ("{{ d|items|list }} {{ u|items|list }} {% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
        ("{{ [1,2]|items|list }}", {}),
        ("{{ 'ab'|list }} {{ {'k': 1}|list }} {{ (1, 2)|list }} {{ u|list }}", {}),
        ("{{ [1, 2, 3]|first }} {{ 'xyz'|first }} {{ []|first }}| {{ [1, 2, 3]|last }} {{ 'xyz'|last }} {{ {'a': 1, 'b': 2}|first }}", {}),
        ("{{ [1, 2, 3]|join }} {{ [1, 2, 3]|join(', ') }} {{ ms|join('|', attribute='role') }} {{ 'abc'|join('-') }}", {"ms": MSGS}),
        ("{{ 'Hello'|upper }} {{ 'Hello'|lower }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello world-foo (bar) [baz] <q>'|title }} {{ \"they're bill's\"|title }}", {}),
        ("{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 'abc'|replace('', '-', 2) }}", {}),
        ("{{ u|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ 'x'|d('d') }} {{ 0|default(5, boolean=true) }}", {}),
        ("{{ 1|string }} {{ none|string }} {{ [1]|string }} {{ 1.0|string ~ 'x' }}", {}),
        ("{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '0x1A'|int(base=16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ true|int }} {{ none|int }}", {}),
        ("{{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ 'x'|float(1.5) }} {{ '1e3'|float }} {{ ' inf '|float }} {{ none|float }}", {}),
        ("{{ u|int }}", {}),
        ("{{ 'x'|safe }} {{ '<a>&\"\\''|escape }} {{ '<b>'|e }} {{ 5|e }}", {}),
        ("{{ ms|map(attribute='role')|list }} {{ ms|map(attribute='nope', default='?')|list }} {{ ['a', 'B']|map('upper')|list }} {{ [' a ']|map('trim')|join }}", {"ms": MSGS}),
        ("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ ms|rejectattr('role', 'eq', 'user')|list|length }} {{ ms|selectattr('content')|list|length }}", {"ms": MSGS}),
        ("{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ [1, 5, 9]|select('>', 3)|list }} {{ [1, 5]|select('divisibleby', 5)|list }}", {}),
        ("{{ ['b', 'A', 'a', 'B', 'c']|unique|list }} {{ ['b', 'A', 'a']|unique(case_sensitive=true)|list }} {{ ms|unique(attribute='role')|map(attribute='content')|list }}", {"ms": MSGS}),
        ("{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'A': 2}|dictsort(true) }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}", {}),
        ("{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ms|sort(attribute='role')|map(attribute='content')|join(',') }} {{ ms|sort(attribute='role,content')|map(attribute='content')|join(',') }}", {"ms": MSGS}),
        ("{{ [1, 'a']|sort }}", {}),
        ("{{ 'line1\\nline2\\n\\nline4'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}|{{ ''|indent(first=true) }}|{{ 'x\\r\\ny'|indent(1) }}", {}),
        ("{{ [1, 5, 3]|max }} {{ [1, 5, 3]|min }} {{ ['a', 'B']|max }} {{ ['a', 'B']|max(case_sensitive=true) }} {{ []|max }}| {{ ms|max(attribute='content') }}", {"ms": MSGS}),
        ("{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ ms|map(attribute='content')|map('length')|sum }} {{ [[1], [2]]|sum(start=[]) }} {{ [{'v': 2}, {'v': 3}]|sum(attribute='v') }}", {"ms": MSGS}),
        ("{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} {{ 42.51|round(1, 'ceil') }} {{ 7|round }} {{ 1.5|round|int }}", {}),
        ("{{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ 'héllo'|reverse }} {{ {'a': 1, 'b': 2}|reverse|list }}", {}),
        ("{{ 'hi'|center(10) }}| {{ 'hi'|center(9) }}| {{ 'hello world foo'|wordcount }} {{ '%s and %d'|format('x', 3) }} {{ '%(a)s'|format(a=1) }}", {}),
        ("{{ d|attr('items') is defined }} {{ d|attr('role') is defined }}", {"d": {"role": "x"}}),
        ("{{ xs|map('int')|sum }} {{ xs|map('int', 9)|list }}", {"xs": ["1", "x", "3"]}),
        ("{{ [1,2]|select('nosuchtest')|list }}", {}),
        ("{{ ['a']|map('nosuchfilter')|list }}", {}),
        ("{{ [1,2]|selectattr|list }}", {}),
        ("{{ (ms|selectattr('role', 'equalto', 'nobody')) is defined }} {% if ms|selectattr('role', 'equalto', 'nobody') %}gen-is-true{% endif %} {{ ms|selectattr('role', 'equalto', 'nobody')|list|length }}", {"ms": MSGS}),
        ("{{ ms|selectattr('role', 'equalto', 'user')|length }}", {"ms": MSGS}),
        ("{{ ms|map(attribute='role')|first }} {{ ms|selectattr('role', 'ne', 'system')|join(',', attribute='role') }}", {"ms": MSGS}),
    ],
    "tests": [
        ("{{ x is defined }} {{ u is defined }} {{ u is undefined }} {{ x is undefined }} {{ none is none }} {{ 0 is none }}", {"x": 1}),
        ("{{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 'x' is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is integer }} {{ 1.0 is float }}", {}),
        ("{{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ u is iterable }} {{ [] is sequence }} {{ 'x' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ u is sequence }}", {}),
        ("{{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}", {}),
        ("{{ 'a' is equalto 'a' }} {{ 1 is eq 1.0 }} {{ 1 is ne 2 }} {{ 2 is gt 1 }} {{ 1 is lt 2 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 3 is greaterthan 2 }} {{ 3 is lessthan 2 }} {{ 2 is == 2 }} {{ 2 is != 2 }} {{ 1 is < 2 }}", {}),
        ("{{ 3 is odd }} {{ 3 is even }} {{ 4 is even }} {{ -3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2.0 is even }}", {}),
        ("{{ 'a' is in 'abc' }} {{ 1 is in [2] }} {{ 'k' is in {'k': 1} }} {{ 'x' is in u }}", {}),
        ("{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '12' is upper }} {{ 'É' is upper }}", {}),
        ("{{ none is sameas none }} {{ true is sameas true }} {{ 1 is sameas 1 }} {{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ range is callable }} {{ 1 is callable }}", {}),
        ("{{ x is not none and x is not string }} {{ not x is defined }} {{ x is not defined }}", {"x": [1]}),
        ("{{ 'a' is odd }}", {}),
        ("{{ u is odd }}", {}),
        ("{{ u.x is defined }}", {}),
    ],
    "strings": [
        ("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ '\\n\\tx\\n'.strip() }}|{{ '\u3000x\u00a0'.strip() }}|{{ 'éaé'.strip('é') }}", {}),
        ("{{ 'a,b,,c'.split(',') }} {{ ' a  b \\n c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b c '.rsplit(None, 1) }} {{ ''.split(',') }} {{ ''.split() }} {{ 'a::b'.split('::') }}", {}),
        ("{{ 'aXbXc'.replace('X', '-') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello wORLD'.title() }} {{ \"they're\".title() }} {{ 'hELLO'.capitalize() }} {{ 'aB'.swapcase() }}", {}),
        ("{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith('l', 2) }} {{ 'hello'.endswith('l', 0, 4) }}", {}),
        ("{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'hello'.find('l', 3) }} {{ 'hello'.count('l') }} {{ 'hello'.index('e') }} {{ 'aaa'.count('') }}", {}),
        ("{{ 'hello'.index('z') }}", {}),
        ("{{ '{} and {}'.format(1, 'x') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{{literal}} {0!r}'.format('q') }} {{ '{:>5}|{:<4}|{:^5}|{:05d}|{:.2f}|{:+d}'.format('r', 'l', 'c', 42, 3.14159, 7) }} {{ '{0[k]} {0.k}'.format({'k': 'v'}) }}", {}),
        ("{{ '-'.join(['a', 'b']) }} {{ ''.join('xyz') }} {{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ ''.isalpha() }}", {}),
        ("{{ '-'.join([1, 2]) }}", {}),
        ("{{ 'a\\nb\\r\\nc\\rd'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ '-42'.zfill(6) }}", {}),
        ("{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }} {{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }}", {}),
        ("{{ '%s|%5s|%-5s|%.2f|%05d|%x|%r|%%' % ('a', 'b', 'c', 3.14159, 42, 255, 'q') }} {{ '%d items' % 3 }} {{ '%(n)s=%(v)d' % {'n': 'x', 'v': 2} }}", {}),
        ("{{ 'Straße'.upper() }} {{ 'ÉCOLE'.lower() }} {{ 'ǆ'.capitalize() }} {{ 'ΣΑΣ'.lower() }}", {}),
        ("{{ 'ﬁne ﬂow'.upper() }} {{ 'İ'.lower()|length }} {{ 'ǅ'.swapcase() }} {{ 'ΣΑΣ ΟΔΟΣ. Σ'.lower() }} {{ 'ΑΣ ΑΣ'|title }} {{ 'ǆungla'.title() }} {{ 'ß'|capitalize }} {{ 'ŉ'.upper() }} {{ 'ǅ' is upper }} {{ 'ǅ' is lower }} {{ 'ª' is lower }}", {}),
        ("{{ 'x'.zfill is defined }} {{ 'x'.nosuch is defined }}", {}),
        ("{{ s.strip() }}", {"s": None}),
        ("{{ message.content.split('</think>')[-1].lstrip('\\n') }}|{{ message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"message": {"content": "<think>\nreason\n</think>\n\nanswer"}}),
    ],
    "tojson": [
        ("{{ x|tojson }}", {"x": NESTED}),
        ("{{ x|tojson(indent=2) }}", {"x": NESTED}),
        ("{{ x|tojson(indent=0) }}|{{ x|tojson(indent='\\t') }}", {"x": {"a": [1, {}], "b": []}}),
        ("{{ x|tojson(separators=(',', ':')) }} {{ x|tojson(sort_keys=true) }} {{ x|tojson(ensure_ascii=true) }}", {"x": {"z": "é😀", "a": [1, 2.0]}}),
        ("{{ [1.0, 1e-05, 1e16, -0.0, 0.1, 123456789012.5, 5e-324, 1.7976931348623157e308]|tojson }}", {}),
        ("{{ 'control \\x01\\x1f\\x7f tab\\t quote\" back\\\\ slash/ unicode é \\u2028'|tojson }}", {}),
        ("{{ {1: 'int key', true: 'bool', none: 'null', 2.5: 'float'}|tojson }}", {}),
        ("{{ (1, 2)|tojson }} {{ none|tojson }} {{ true|tojson }} {{ 'x'|tojson }} {{ {}|tojson(indent=2) }} {{ []|tojson(indent=2) }}", {}),
        ("{{ tools[0]|tojson }}", {"tools": [{"type": "function", "function": {"name": "f", "description": "Line1\nLine2 \"q\"", "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0.0, "default": 1.5}}, "required": ["x"]}}}]}),
        ("{{ u|tojson }}", {}),
        ("{{ namespace(a=1)|tojson }}", {}),
        ("{{ x|tojson(2) }}", {"x": {"a": 1}}),
    ],
    "undefined": [
        ("[{{ u }}] [{{ u ~ 'x' }}] [{{ u|upper }}] [{{ u|join }}] [{{ u|first }}] [{{ u|string }}]", {}),
        ("{% if u %}t{% else %}f{% endif %} {{ u is none }} {{ u == u }} {{ u != none }} {{ u|length }} {{ u|list }} {{ [u] }}", {}),
        ("{{ m.missing }}|{{ m.missing is defined }}|{{ m['missing'] }}|{{ m.missing|default('d') }}", {"m": {"a": 1}}),
        ("{{ u() }}", {}),
        ("{{ u.attr }}", {}),
        ("{{ m.missing.deeper }}", {"m": {}}),
        ("{{ u * 2 }}", {}),
        ("{{ u|tojson }}", {}),
        ("{{ none.attr }}|{{ 1.attr }}|", {}),
        ("{{ 'abc'.nosuch }}|", {}),
    ],
    "globals": [
        ("{{ range(3)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
        ("{{ range(100001)|length }}", {}),
        ("{{ range(1.5) }}", {}),
        ("{{ dict(a=1, b='x') }} {{ dict({'k': 1}, z=2) }} {{ namespace(x=1).x }}", {}),
        ("{{ raise_exception('custom message: ' ~ 42) }}", {}),
        ("{% if messages|length > 1 %}{{ raise_exception('Only one message allowed') }}{% endif %}ok", {"messages": MSGS}),
        ("{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %A %j') }}", {}),
        ("{{ messages|length }} {{ bos_token }} {{ add_generation_prompt }}", {"messages": MSGS, "bos_token": "<s>", "add_generation_prompt": True}),
    ],
}


def render_case(template, variables):
    case = {"template": template, "vars": json.dumps(variables, ensure_ascii=False)}
    try:
        t = hf_chat.compile_template(template, now=1700000000)
    except Exception as e:
        case["compile_error"] = f"{type(e).__name__}: {e}"
        return case
    try:
        case["out"] = t.render(**variables)
    except hf_chat.RaisedByTemplate as e:
        case["render_error"] = str(e)
        case["raised"] = True
    except Exception as e:
        case["render_error"] = f"{type(e).__name__}: {e}"
    return case


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # strftime_now's pinned clock is read in the local time zone on both sides
    out = {g: [render_case(t, v) for t, v in cases] for g, cases in CASES.items()}
    path = os.path.join(args.out, "chat_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    n = sum(len(v) for v in out.values())
    print(f"fixtures_chat: {n} cases in {len(out)} groups -> {path}")


if __name__ == "__main__":
    main()
