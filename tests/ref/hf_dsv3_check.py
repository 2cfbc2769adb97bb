#!/usr/bin/python3
"""tests/ref/hf_dsv3_check.py - the Python side of tests/cli/hf_dsv3.sh
(issue 16: YaRN, FP8 checkpoints, DeepseekV3ForCausalLM and the Kimi-K2
layout), in one process per phase, like tests/ref/hf_check.py:

  hf_dsv3_check.py prepare W DATA.bin
      W/m/<variant>/   tiny HF checkpoints (tests/ref/hf_ref.py make) with
                       ref.json, the float64 logprobs of `tandem score`'s
                       windows of W/text:
        q3_yarn_v4     Qwen3-MoE f32, rope_scaling yarn (factor 4 over 128)
        q3_yarn_v5     the same as transformers 5 writes it (rope_parameters), bf16, 3 shards
        q3_fp8         Qwen3-MoE FP8 (F8_E4M3 + *_scale_inv blocks), 2 shards
        ds_bf16        DeepseekV3ForCausalLM bf16, 3 shards
        ds_fp8         DeepseekV3ForCausalLM FP8, 2 shards, with an MTP layer (read past)
        kimi_fp8       the Kimi-K2 layout (model_type kimi_k2, 384 experts top-8, one group, q_proj) FP8
      W/grad/<variant>/  the reference's gradient of one training step on DATA.bin (ds_bf16, kimi_fp8)
      W/greedy/ds_fp8.json   hf_ref greedy from PROMPT
      W/bad/<case>/    directories tandem must refuse; W/bad/cases.txt: case TAB message
  hf_dsv3_check.py check W
      compares what the shell left in W; "ok ..." / "FAIL ..." lines, exit 1 on a failure

Tolerances as tests/ref/hf_check.py (logprobs 1e-4 absolute; gradients
max|d| / max|ref| per tensor 1e-4).
"""
import copy
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from hf_check import Checker, h5_logprobs, walk_h5, same_tensors  # noqa: E402

T = 24
PROMPT = [84, 104, 101, 32, 100, 97, 121]
N_GREEDY = 10
GRAD_WINDOWS, GRAD_T = 4, 16
LP_TOL, GRAD_TOL = 1e-4, 1e-4
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
# name: (family, dtype, shards, layout, seed, config overrides)
VARIANTS = {
    "q3_yarn_v4": ("qwen3_moe", "f32", 1, "v4", 21, {"rope_scaling": YARN}),
    "q3_yarn_v5": ("qwen3_moe", "bf16", 3, "v5", 22, {"rope_scaling": YARN}),
    "q3_fp8": ("qwen3_moe", "fp8", 2, "v4", 23, None),
    "ds_bf16": ("deepseek_v3", "bf16", 3, "v4", 24, None),
    "ds_fp8": ("deepseek_v3", "fp8", 2, "v4", 25, None),
    "kimi_fp8": ("kimi_k2", "fp8", 1, "v4", 26, None),
}
GRAD_VARIANTS = ("ds_bf16", "kimi_fp8")   # FP8: the gradient with respect to the dequantized weights
MTP = "model.layers.3.eh_proj.weight"      # DeepSeek-V3's MTP layer has its own names: any of them is read past


def windows(stream, n_win, t):
    import torch
    s = torch.tensor(stream[: n_win * t + 1])
    return s[:-1].view(n_win, t), s[1:].view(n_win, t)


def prepare(w, data):
    import torch
    import hf_ref
    from hf import families, st
    from hf.model import HFRef
    torch.set_num_threads(1)
    stream = list(open(os.path.join(w, "text"), "rb").read())
    inp, tgt = windows(stream, (len(stream) - 1) // T, T)
    ginp, gtgt = windows(hf_ref.read_stream(data=data), GRAD_WINDOWS, GRAD_T)
    for name, (fam, dt, sh, lay, seed, over) in VARIANTS.items():
        d = os.path.join(w, "m", name)
        cfg, stored = hf_ref.make(fam, d, dt, sh, lay, seed, over=over)
        if name == "ds_fp8":   # the MTP layer: rewrite the last shard with one of its tensors added
            last = os.path.join(d, st.shard_names(sh)[-1])
            part = st.load_file(last)
            part = {n: (stored[n] if isinstance(stored[n], tuple) else v) for n, v in part.items()}
            part[MTP] = torch.zeros(4, 8, dtype=torch.bfloat16)
            st.save_file(part, last, metadata={"format": "pt"})
            idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
            idx["weight_map"][MTP] = os.path.basename(last)
            json.dump(idx, open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2, sort_keys=True)
        cfg, t = hf_ref.load(d)
        t.pop(MTP, None)
        ref = HFRef(cfg, t)
        with torch.no_grad():
            lp, stats = ref.logprobs(inp, tgt)
        out = {"logprobs": lp.tolist(), "router_min_gap": stats.get("router_min_gap")}
        if over and "rope_scaling" in over:   # what the same weights give without YaRN: it must matter
            c2 = copy.deepcopy(cfg)
            c2.pop("rope_scaling", None)
            if "rope_parameters" in c2:
                c2["rope_parameters"] = {"rope_theta": c2["rope_parameters"]["rope_theta"], "rope_type": "default"}
            with torch.no_grad():
                out["logprobs_no_yarn"] = HFRef(c2, t).logprobs(inp, tgt)[0].tolist()
        json.dump(out, open(os.path.join(d, "ref.json"), "w"))
        if name in GRAD_VARIANTS:
            tg = {k: v.to(torch.float64).requires_grad_(True) for k, v in t.items()}
            total = HFRef(cfg, tg).loss(ginp, gtgt)[0]
            total.backward()
            g = {k: (v.grad if v.grad is not None else torch.zeros_like(v)).to(torch.float32) for k, v in tg.items()}
            gd = os.path.join(w, "grad", name)
            os.makedirs(gd)
            gcfg = dict(cfg)
            gcfg.pop("quantization_config", None)
            json.dump(gcfg, open(os.path.join(gd, "config.json"), "w"), indent=2, sort_keys=True)
            st.save_file(g, os.path.join(gd, "model.safetensors"), metadata={"format": "pt"})
            json.dump({"loss": float(total)}, open(gd + ".json", "w"))
        if name == "ds_fp8":
            with torch.no_grad():
                ids, lps, gap = ref.greedy(PROMPT, N_GREEDY)
            os.makedirs(os.path.join(w, "greedy"), exist_ok=True)
            json.dump({"ids": ids, "logprobs": lps, "min_top2_gap": gap},
                      open(os.path.join(w, "greedy", name + ".json"), "w"))
    prepare_bad(w, hf_ref, st, families)


def prepare_bad(w, hf_ref, st, families):
    cases = []
    base_dir = os.path.join(w, "bad")
    os.makedirs(base_dir)

    def fp8_case(name, want, edit, fam="qwen3_moe"):
        d = os.path.join(base_dir, name)
        cfg, stored = hf_ref.make(fam, d, "fp8", 1, "v4", 31)
        stored = dict(stored)
        edit(cfg, stored)
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                os.remove(os.path.join(d, f))
        st.save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2, sort_keys=True)
        cases.append((name, want))

    W0 = "model.layers.0.self_attn.q_proj.weight"
    fp8_case("fp8_missing_scale", "tensor '%s': F8_E4M3 without its block scale '%s_scale_inv'" % (W0, W0),
             lambda c, t: t.pop(W0 + "_scale_inv"))
    import torch
    fp8_case("fp8_scale_shape", "tensor '%s_scale_inv': shape [3, 3] is not [3, 4] (blocks of 32x16" % W0,
             lambda c, t: t.__setitem__(W0 + "_scale_inv", t[W0 + "_scale_inv"][:, :3].contiguous()))
    fp8_case("fp8_without_config", "tensor '%s': dtype F8_E4M3 but config.json has no fp8 quantization_config"
             % W0, lambda c, t: c.pop("quantization_config"))
    fp8_case("fp8_bad_method", 'quantization_config (quant_method "bitsandbytes")',
             lambda c, t: c.__setitem__("quantization_config", {"quant_method": "bitsandbytes"}))
    fp8_case("yarn_unknown_type", 'rope_scaling type "longrope" is not supported',
             lambda c, t: c.__setitem__("rope_scaling", {"type": "longrope", "factor": 2.0}))
    fp8_case("ds_topk_method", 'topk_method "group_limited_greedy" is not supported for DeepseekV3ForCausalLM (it computes "noaux_tc")',
             lambda c, t: c.__setitem__("topk_method", "group_limited_greedy"), fam="deepseek_v3")
    fp8_case("ds_scoring_func", 'scoring_func "softmax" is not supported for DeepseekV3ForCausalLM (it computes "sigmoid")',
             lambda c, t: c.__setitem__("scoring_func", "softmax"), fam="deepseek_v3")
    fp8_case("ds_kv_b_shape", "tensor 'model.layers.1.self_attn.kv_b_proj.weight': shape [112, 16]",
             lambda c, t: t.__setitem__("model.layers.1.self_attn.kv_b_proj.weight",
                                        ("F8_E4M3", [112, 16], bytes(112 * 16))), fam="deepseek_v3")
    fp8_case("ds_missing_bias", "missing tensor 'model.layers.1.mlp.gate.e_score_correction_bias'",
             lambda c, t: t.pop("model.layers.1.mlp.gate.e_score_correction_bias"), fam="deepseek_v3")
    with open(os.path.join(base_dir, "cases.txt"), "w") as f:
        for n, want in cases:
            f.write("%s\t%s\n" % (n, want))


def check(w):
    c = Checker()
    worst = {}
    for name in VARIANTS:
        d = os.path.join(w, "m", name)
        ref = json.load(open(os.path.join(d, "ref.json")))
        r = np.array(ref["logprobs"])
        try:
            direct, imp = h5_logprobs(os.path.join(d, "direct.h5")), h5_logprobs(os.path.join(d, "import.h5"))
        except (OSError, KeyError) as e:
            c.ok(False, "score %s: %s" % (name, e))
            continue
        e1, e2 = np.abs(direct - r).max(), np.abs(imp - r).max()
        worst[name] = max(e1, e2)
        extra = ""
        ok = e1 <= LP_TOL and e2 <= LP_TOL and np.array_equal(direct, imp)
        if "logprobs_no_yarn" in ref:
            dy = np.abs(np.array(ref["logprobs_no_yarn"]) - r).max()
            ok = ok and dy > 100 * LP_TOL
            extra = "; without YaRN the reference moves by %.2e" % dy
        if os.path.exists(os.path.join(d, "export.h5")):
            ex = h5_logprobs(os.path.join(d, "export.h5"))
            ok = ok and np.array_equal(ex, direct)
            extra += "; its HF export scores bit for bit alike"
        gap = ref.get("router_min_gap")
        c.ok(ok, "score %s: direct and import bit for bit alike, max |logprob - float64| %.2e (tolerance %g)%s%s" %
             (name, worst[name], LP_TOL, extra, "; router margin %.1e" % gap if gap else ""))
    # the FP8 exports: no quantization_config, no F8 tensors; bf16 round trip bit-identical
    from hf import st
    for name in ("q3_fp8", "ds_fp8", "kimi_fp8"):
        e = os.path.join(w, "m", name, "export")
        try:
            cfg = json.load(open(os.path.join(e, "config.json")))
            hdr = st_dtypes(e)
        except OSError as ex:
            c.ok(False, "export %s: %s" % (name, ex))
            continue
        c.ok("quantization_config" not in cfg and "F8_E4M3" not in hdr and not any(n.endswith("_scale_inv") for n in hdr),
             "export %s: no quantization_config, dtypes %s" % (name, sorted(set(hdr.values()))))
    ex = os.path.join(w, "m", "ds_bf16", "export")
    why = same_tensors(os.path.join(w, "m", "ds_bf16"), ex) if os.path.isdir(ex) else "no export"
    c.ok(why is None, "DeepseekV3 bf16 HF -> tandem -> HF: every tensor bit for bit%s" % ("" if why is None else ": " + why))
    check_grads(c, w)
    g = json.load(open(os.path.join(w, "greedy", "ds_fp8.json")))
    try:
        got = json.load(open(os.path.join(w, "greedy", "ds_fp8.out")))
        dlp = max(abs(a - b) for a, b in zip(g["logprobs"], got["logprobs"])) if got["ids"] == g["ids"] else None
        c.ok(got["ids"] == g["ids"] and dlp < LP_TOL, "greedy from the FP8 DeepSeek-V3 dir: %d tokens as the reference "
             "(logprobs within %.1e)" % (len(g["ids"]), dlp if dlp is not None else float("nan")))
    except (OSError, ValueError) as ex:
        c.ok(False, "greedy ds_fp8: %s" % ex)
    print("hf_dsv3_check: %d checks, %d failed" % (c.n, c.fails))
    return 1 if c.fails else 0


def st_dtypes(d):
    import struct
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            b = open(os.path.join(d, f), "rb").read()
            n = struct.unpack("<Q", b[:8])[0]
            h = json.loads(b[8:8 + n])
            out.update({k: v["dtype"] for k, v in h.items() if k != "__metadata__"})
    return out


def check_grads(c, w):
    import h5py
    for name in GRAD_VARIANTS:
        gh5 = os.path.join(w, "grad", name + ".h5")
        run = os.path.join(w, "train", name, "latest")
        try:
            g, r = h5py.File(gh5, "r"), h5py.File(run, "r")
        except OSError as e:
            c.ok(False, "grads %s: %s" % (name, e))
            continue
        worst, wname, n = 0.0, "", 0
        names = list(walk_h5(g["model"], "model/")) + ([("lm_head", g["lm_head"])] if "lm_head" in g else [])
        for tname, dset in names:
            if tname.endswith("e_score_correction_bias"):   # state, not a trained weight: no gradient
                continue
            ref = dset[()].astype(np.float64)
            got = r["optimizer/exp_avg/" + tname][()].astype(np.float64) * 2.0   # beta1 = 0.5: exp_avg = g / 2
            rel = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
            if rel > worst:
                worst, wname = rel, tname
            n += 1
        loss_ref = json.load(open(os.path.join(w, "grad", name + ".json")))["loss"]
        loss = json.loads(open(os.path.join(w, "train", name, "metrics.jsonl")).readline())["loss"]
        c.ok(worst <= GRAD_TOL and abs(loss - loss_ref) < 1e-5,
             "one training step from %s: %d gradients, worst max|d|/max|ref| %.2e (%s), loss %.6f vs %.6f" %
             (name, n, worst, wname, loss, loss_ref))


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        return check(sys.argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
