#!/usr/bin/env python3
"""tests/fuzz/seeds_hf_config.py DIR - seed inputs for
tests/fuzz/fuzz_hf_config.c: the config.json of each family of
tests/ref/hf (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) in both layouts and
dtypes, as transformers writes them."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from hf import families  # noqa: E402


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for fam in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        for lay in ("v4", "v5"):
            for dt in ("f32", "bf16"):
                c = families.config_json(fam, dt, lay, None)
                with open(os.path.join(out, "seed_%s_%s_%s.json" % (fam, lay, dt)), "w") as f:
                    f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")
                n += 1
    print("seeds_hf_config: %d seeds in %s" % (n, out))


if __name__ == "__main__":
    main()
