#!/usr/bin/python3
"""tests/ref/hf_chat.py - Python's jinja2 configured as transformers configures
it for apply_chat_template: the reference that core/chat is checked against
byte for byte.

Where each piece comes from (transformers, src/transformers/utils/
chat_template_utils.py, `_compile_jinja_template` and `render_jinja_template`;
older releases had the same code in tokenization_utils_base.py):
  - ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
    extensions=[AssistantTracker, jinja2.ext.loopcontrols]); keep_trailing_newline
    is left at jinja2's default (False); the default Undefined;
  - AssistantTracker adds {% generation %}...{% endgeneration %}, a CallBlock
    whose body renders in place (transformers also records where it starts
    and ends, for return_assistant_tokens_mask; the text is the same);
  - raise_exception(message): raise TemplateError(message);
  - tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    json.dumps with those arguments (it replaces jinja2's tojson, which would
    HTML-escape);
  - strftime_now(format): datetime.now().strftime(format) (here the clock can be
    pinned with --now for reproducible tests);
  - apply_chat_template renders with messages=..., tools=... (None when not
    given), documents=None, add_generation_prompt=..., then
    **{**tokenizer.special_tokens_map, **kwargs}; special_tokens_map holds the
    truthy ones of bos/eos/unk/sep/pad/cls/mask_token and
    additional_special_tokens, as strings;
  - a chat_template that is a list of {name, template} picks "tool_use" when
    tools is not None and it exists, else "default" (get_chat_template).

Usage:
  hf_chat.py render --config tokenizer_config.json --conversations C.jsonl --out DIR
                    [--prefix NAME] [--now SECONDS]
      one file per conversation line: DIR/NAME.<name>.txt, or .err holding
      "chat template: <message>" when the template called raise_exception and
      "chat template (jinja2 <Error>): <message>" for any other error.
  hf_chat.py template --template FILE --vars FILE [--now SECONDS]
      prints the template rendered with the JSON object of variables.
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What raise_exception raises (transformers raises TemplateError itself; the
    subclass only lets the harness tell it from jinja2's own errors)."""


class Generation(jinja2.ext.Extension):
    """transformers' AssistantTracker, without the index bookkeeping."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def compile_template(source, now=None):
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        t = datetime.datetime.now() if now is None else datetime.datetime.fromtimestamp(now)
        return t.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token", "additional_special_tokens"]


def token_text(v):
    return v.get("content") if isinstance(v, dict) else v


def special_tokens_map(config):
    out = {}
    for k in SPECIAL:
        v = config.get(k)
        if k == "additional_special_tokens" and isinstance(v, list):
            v = [token_text(x) for x in v]
        else:
            v = token_text(v)
        if v:
            out[k] = v
    return out


def select_template(config, tools):
    ct = config["chat_template"]
    if isinstance(ct, list):
        d = {t["name"]: t["template"] for t in ct}
        if tools is not None and "tool_use" in d:
            return d["tool_use"]
        return d["default"]
    return ct


def render_chat(config, messages, tools=None, add_generation_prompt=False, now=None, **kwargs):
    template = compile_template(select_template(config, tools), now)
    return template.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=add_generation_prompt,
                           **{**special_tokens_map(config), **kwargs})


def error_line(e):
    if isinstance(e, RaisedByTemplate):
        return f"chat template: {e.message}"
    return f"chat template (jinja2 {type(e).__name__}): {e}"


def cmd_render(args):
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    n = 0
    with open(args.conversations, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            conv = json.loads(line)
            name = conv["name"]
            messages = conv["messages"]
            try:
                text = render_chat(config, messages, tools=conv.get("tools"),
                                   add_generation_prompt=conv.get("add_generation_prompt", False),
                                   now=args.now, **conv.get("chat_template_kwargs", {}))
                path, data = f"{args.out}/{args.prefix}.{name}.txt", text
            except Exception as e:  # any error the template raises
                path, data = f"{args.out}/{args.prefix}.{name}.err", error_line(e).split("\n")[0] + "\n"
            with open(path, "w", encoding="utf-8", newline="") as o:
                o.write(data)
            n += 1
    print(f"hf_chat: {args.prefix}: {n} conversations")


def cmd_template(args):
    with open(args.template, encoding="utf-8", newline="") as f:
        source = f.read()
    variables = {}
    if args.vars:
        with open(args.vars, encoding="utf-8") as f:
            variables = json.load(f)
    try:
        out = compile_template(source, args.now).render(**variables)
    except Exception as e:
        print(error_line(e), file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("--config", required=True)
    r.add_argument("--conversations", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--prefix", default="t")
    r.add_argument("--now", type=int)
    t = sub.add_parser("template")
    t.add_argument("--template", required=True)
    t.add_argument("--vars")
    t.add_argument("--now", type=int)
    args = p.parse_args()
    if args.cmd == "render":
        os.makedirs(args.out, exist_ok=True)
        cmd_render(args)
        return 0
    return cmd_template(args)


if __name__ == "__main__":
    sys.exit(main())
