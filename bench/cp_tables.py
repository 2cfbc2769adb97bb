#!/usr/bin/python3
"""bench/cp_tables.py - docs/scaling.md's context-parallel tables for a
1M-token context on configs/dsv3_3t_1m.json, from `tandem plan --json` (the
trainer's and the engine's own byte formulas: train_mem, engine_mem,
kvcache_bytes; plan/plan.c for the communication).

    bench/cp_tables.py [--tandem bin/tandem] [--device-gb 141]

Training: one 1M-token sequence per dp rank, dp = ep = 8, tp = 8, pp = 16,
recompute full, ZeRO-1, for cp = 1 .. 256 (world = 1024 cp).  Serving: the
KV cache of one 1M-token request per rank of a tp = 8, ep = 8 instance, for
the weight and KV dtypes, and how many ranks would have to share it.
"""
import argparse
import json
import math
import subprocess

CFG = "configs/dsv3_3t_1m.json"
T = 1 << 20
GIB = float(1 << 30)


def plan(tandem, args):
    out = subprocess.run([tandem, "plan", CFG, "--json"] + args, capture_output=True, text=True)
    return json.loads(out.stdout)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="bin/tandem")
    ap.add_argument("--device-gb", type=float, default=141)
    a = ap.parse_args()
    dev = ["--device-mem-gb", "%g" % a.device_gb]
    cfg = json.load(open(CFG))
    L = cfg["num_hidden_layers"]
    # the MLA latent a position stores per layer (attention.h attn_pos_values, one kv head)
    pos_values = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    print("training, seq_len %d, dp=8 ep=8 tp=8 pp=16, recompute full, zero (GiB per rank, per step)" % T)
    print("| cp | world | rows per rank | activations | K/V of the sequence, 1 layer (f32) | cp comm | all comm | est. step s | fits %g GB |"
          % a.device_gb)
    print("|---|---|---|---|---|---|---|---|---|")
    for cp in (1, 4, 16, 64, 256):
        r = plan(a.tandem, ["--world", str(1024 * cp)] + dev +
                 ["seq_len=%d" % T, "--layout", "dp=8,tp=8,pp=16,ep=8,cp=%d" % cp])
        b, c = r["per_rank_bytes"], r["comm_bytes_per_step"]
        print("| %d | %d | %d | %.1f | %.2f | %.1f | %.1f | %.1f | %s |" % (
            cp, 1024 * cp, T // cp, b["activations"] / GIB, T * pos_values * 4 / GIB, c["cp"] / GIB,
            sum(c.values()) / GIB, r["est_step_s"], "yes" if r["feasible"] else "no (%.0f GiB)" % (b["total"] / GIB)))
    print()
    print("serving one %d-token request (concurrency 1), tp=8 ep=8 instance (GiB per rank)" % T)
    print("| weights | KV dtype | weights | KV cache | total | fits %g GB | ranks to hold the KV beside the weights, split by sequence |"
          % a.device_gb)
    print("|---|---|---|---|---|---|---|")
    for w, kv in (("bf16", "bf16"), ("int8", "bf16"), ("int8", "int8")):
        r = plan(a.tandem, ["--mode", "serve", "--world", "64"] + dev +
                 ["context=%d" % T, "concurrency=1", "dtype=" + w, "kv_dtype=" + kv, "--layout", "dp=8,tp=8,ep=8"])
        b = r["per_rank_bytes"]
        free = a.device_gb * 1e9 - (b["total"] - b["kv_cache"])
        need = math.ceil(b["kv_cache"] / free) if free > 0 else "none (weights alone too big)"
        print("| %s | %s | %.1f | %.1f | %.1f | %s | %s |" % (w, kv, b["weights"] / GIB, b["kv_cache"] / GIB,
              b["total"] / GIB, "yes" if r["feasible"] else "no", need))
    print("(KV per token: %d layers x %d latent values x dtype bytes; MLA's one latent head is not split by tp)"
          % (L, pos_values))


if __name__ == "__main__":
    main()
