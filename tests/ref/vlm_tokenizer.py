#!/usr/bin/python3
"""tests/ref/vlm_tokenizer.py DIR - a small Hugging Face tokenizer for the
tiny vision-language models of the tests and benchmarks (tests/cli/serve_vision.sh,
bench/vision.sh): byte-level BPE (GPT-2's byte alphabet, ids 0-255 the 256
bytes in that alphabet's order, no merges), and the added special tokens
<image> (256: the models' image_token_index), <|im_start|> (257),
<|im_end|> (258, eos), with a ChatML chat template whose content is a
string (tandem serve flattens image parts to "<image>" in it; a list of
text parts is joined too).  Writes DIR/tokenizer.json and
DIR/tokenizer_config.json."""
import json
import os
import sys


def byte_alphabet():
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100..."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


SPECIAL = ["<image>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
            "{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    alpha = byte_alphabet()
    vocab = {alpha[b]: b for b in range(256)}
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIAL)]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    cfg = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "chat_template": TEMPLATE,
           "model_max_length": 1024, "tokenizer_class": "PreTrainedTokenizerFast",
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
