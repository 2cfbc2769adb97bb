#!/usr/bin/env python3
"""tests/fuzz/seeds_api.py DIR - seed inputs for tests/fuzz/fuzz_api.c: one
byte naming the endpoint (0 completions, 1 chat, 2 tokenize, 3
detokenize), then a request body as OpenAI clients and vLLM's send them."""
import json
import os
import sys

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "and again"}]}]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
SEEDS = [
    (0, {"prompt": "Q: why", "max_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 5, "n": 2, "logprobs": 2}),
    (0, {"prompt": [[84, 104], [101, 32, 100]], "max_tokens": 4, "stop": ["\n", "Q:"], "stream": True,
         "stream_options": {"include_usage": True}}),
    (0, {"prompt": "x", "max_tokens": 500, "best_of": 1, "echo": False, "top_k": 5, "ignore_eos": True}),
    (1, {"messages": MSGS, "max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 3}),
    (1, {"messages": MSGS[:2], "max_completion_tokens": 8, "n": 3, "seed": 1, "stream": True, "stop": "Q"}),
    (1, {"messages": MSGS + [{"role": "tool", "content": "42", "tool_call_id": "c1"}], "tools": TOOLS,
         "chat_template_kwargs": {"enable_thinking": False}}),
    (1, {"messages": [{"role": "user", "content": None}], "add_generation_prompt": False}),
    (2, {"prompt": "Hello, world", "add_special_tokens": True}),
    (2, {"messages": MSGS, "add_generation_prompt": True}),
    (3, {"tokens": [72, 101, 108, 108, 111]}),
    (3, {"tokens": [300, -1]}),
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, (k, b) in enumerate(SEEDS):
        with open(os.path.join(out, "seed_%d" % i), "wb") as f:
            f.write(bytes([k]) + json.dumps(b).encode())
    print("seeds_api: %d seeds in %s" % (len(SEEDS), out))


if __name__ == "__main__":
    main()
