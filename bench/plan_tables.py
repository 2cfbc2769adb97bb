#!/usr/bin/python3
"""bench/plan_tables.py - the tables of docs/planning.md: the best layout
`tandem plan` finds for each config on 1,024 to 8,192 devices of 80, 96 and
141 GB, training (recompute=full, ZeRO-1) and serving; markdown on stdout.

    /usr/bin/python3 bench/plan_tables.py [CONFIG ...]

The configs: moe128, Mixtral-8x7B, DeepSeek-V3, Kimi-K2 and the 3T-parameter
1M-context variant (configs/dsv3_3t_1m.json)."""
import json, os, subprocess, sys

CASES = {
    "configs/moe128.json": {"train": "seq_len=1024 global_batch=8192 recompute=full zero=1",
                            "serve": "context=1024 concurrency=64"},
    "configs/mixtral_8x7b.json": {"train": "seq_len=4096 global_batch=4096 recompute=full zero=1",
                                  "serve": "context=32768 concurrency=16 dtype=bf16 kv_dtype=bf16"},
    # issue 16's configs: pretraining windows of 4k tokens (no context parallelism yet, issue 19);
    # serving DeepSeek-V3 / Kimi-K2 at 32k x 64 and the 3T model one 1M-token request
    "configs/deepseek_v3.json": {"train": "seq_len=4096 global_batch=8192 recompute=full zero=1",
                                 "serve": "context=32768 concurrency=16 dtype=bf16 kv_dtype=bf16"},
    "configs/kimi_k2.json": {"train": "seq_len=4096 global_batch=8192 recompute=full zero=1",
                             "serve": "context=32768 concurrency=16 dtype=bf16 kv_dtype=bf16"},
    "configs/dsv3_3t_1m.json": {"train": "seq_len=4096 global_batch=8192 recompute=full zero=1",
                                "serve": "context=1048576 concurrency=1 dtype=bf16 kv_dtype=bf16"},
}
GIB = 1024 ** 3


def plan(cfg, world, mem, mode, keys):
    cmd = ["bin/tandem", "plan", cfg, "--world", str(world), "--device-mem-gb", str(mem), "--mode", mode,
           "--json"] + keys.split()
    out = subprocess.run(cmd, capture_output=True, text=True)
    return json.loads(out.stdout) if out.stdout.strip() else []


def main():
    cfgs = sys.argv[1:] or [c for c in CASES if os.path.exists(c)]
    for cfg in cfgs:
        for mode in ("train", "serve"):
            keys = CASES[cfg][mode]
            print(f"\n**{cfg}, {mode}** (`{keys}`)\n")
            if mode == "train":
                print("| devices | GB | fit | best dp/tp/pp/ep | weights | grads | optim | acts | comm | work | total GiB | step s | tokens/s | top comm (GB/step) |")
                print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            else:
                print("| devices | GB | fit | best dp/tp/ep (instances) | weights | kv_cache | acts | work | total GiB | decode step ms | tok/s per instance | top comm (MB/step) |")
                print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for world in (1024, 2048, 4096, 8192):
                for mem in (80, 96, 141):
                    v = plan(cfg, world, mem, mode, keys)
                    ok = [r for r in v if r["feasible"]]
                    if not ok:
                        why = v[0]["reason"] if v else "no layout"
                        print(f"| {world} | {mem} | 0/{len(v)} | none: {why} |" + " |" * (9 if mode == "serve" else 11))
                        continue
                    r = ok[0]
                    l, b, c = r["layout"], r["per_rank_bytes"], r["comm_bytes_per_step"]
                    g = max(c, key=c.get)
                    if mode == "train":
                        print(f"| {world} | {mem} | {len(ok)}/{len(v)} | {l['dp']}/{l['tp']}/{l['pp']}/{l['ep']} | "
                              + " | ".join(f"{b[k] / GIB:.1f}" for k in ("weights", "gradients", "optimizer", "activations", "comm", "workspace", "total"))
                              + f" | {r['est_step_s']:.2f} | {r['tokens_per_s']:.3g} | {g} {c[g] / 1e9:.1f} |")
                    else:
                        print(f"| {world} | {mem} | {len(ok)}/{len(v)} | {l['dp']}/{l['tp']}/{l['ep']} ({l['dp'] // l['ep']}) | "
                              + " | ".join(f"{b[k] / GIB:.1f}" for k in ("weights", "kv_cache", "activations", "workspace", "total"))
                              + f" | {r['est_step_s'] * 1e3:.2f} | {r['tokens_per_s']:.3g} | {g} {c[g] / 1e6:.1f} |")


main()
