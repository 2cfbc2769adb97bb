#!/bin/sh
# tests/cli/lowprec.sh - quantized checkpoints (SPEC 11, docs/checkpoint.md)
# end to end: `tandem ckpt quantize` writes what h5py reads as the
# documented format, with the values numpy computes from the float32 file
# by the documented rule; loading it serves the bits that quantizing at
# load (--dtype int8 on the float file) serves; the calibration report;
# corrupt scales and other group sizes refused with one line naming the
# dataset; training refuses an int8 file by name; GPTQ rounding; routers
# fitted to the quantized model (--fit-routers: only they change); an int8
# file with bf16 attention (--attn-dtype) written, served and announced;
# an int8 file exported to HF (q * s, bit for bit; it generates as the int8
# file at --dtype f32) and a bad scale refused by both exports; the bf16
# prefetch distance (TANDEM_BF16_PREFETCH) changes no bit, a bad one is
# ignored with one line.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
need curl || exit 1
BUILD=${BUILD:-build}
T=bin/tandem
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-lowprec-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }

# expect_fail DESCRIPTION PATTERN CMD...: non-zero exit, one stderr line matching PATTERN
expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

# in a subshell: tests/serve_lib.sh (its bounded waits, /health, the clean
# stop) with the fail() it calls, which ends that subshell
serve_setup() {
    fail() {
        echo "FAIL serve: $*"
        [ -s "$W/serve.log" ] && tail -n 5 "$W/serve.log"
        [ -n "${pid:-}" ] && kill -KILL "$pid" 2>/dev/null
        exit 1
    }
    TANDEM=$T TMP=$W
    . tests/serve_lib.sh
}

DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || $T data prepare --input /usr/share/games/fortunes --output "$DATA" 2>/dev/null
# the tiny model with a shared expert and a dense first layer, d = 72: rows
# of 72 (two whole groups of 32 and one of 8) and of 64 (the experts' F)
M='model={"vocab_size":256,"hidden_size":72,"num_hidden_layers":3,"num_attention_heads":6,"num_key_value_heads":2,"moe_intermediate_size":64,"intermediate_size":100,"num_local_experts":4,"num_experts_per_tok":2,"n_shared_experts":1,"first_k_dense_replace":1,"max_position_embeddings":256}'
$T train configs/tiny.json data="$DATA" steps=15 out_dir="$W/run" "$M" >/dev/null 2>"$W/log" || { bad "train"; cat "$W/log"; }

# ---------------------------------------------------------------- the format
$T ckpt quantize "$W/run" "$W/q8.h5" --dtype int8 --calib "$DATA" --seq-len 64 --windows 4 >"$W/q8.jsonl" 2>"$W/log" ||
    { bad "ckpt quantize int8"; cat "$W/log"; }
$T ckpt quantize "$W/run" "$W/bf.h5" --dtype bf16 >"$W/bf.jsonl" 2>"$W/log" || { bad "ckpt quantize bf16"; cat "$W/log"; }
$PY - "$W" <<'EOF' && ok "int8 / bf16 files: the documented datasets and attributes, values = numpy's rule on the float32 file, reported errors" || fail=1
import json, sys, h5py, numpy as np
w = sys.argv[1]
src = h5py.File(w + "/run/latest")
q8, bf = h5py.File(w + "/q8.h5"), h5py.File(w + "/bf.h5")
assert q8.attrs["quantized"] == "int8" and bf.attrs["quantized"] == "bf16"
assert q8.attrs["format"] == "tandem-checkpoint" and q8.attrs["config"] == src.attrs["config"]
rep = {json.loads(l)["tensor"]: json.loads(l) for l in open(w + "/q8.jsonl") if '"tensor"' in l}
n_q8 = 0
def visit(name, x):
    global n_q8
    if not isinstance(x, h5py.Dataset) or not (name.startswith("model/") or name == "lm_head"):
        return
    W = x[()].astype(np.float32)
    keep = W.ndim < 2 or name.endswith("mlp/gate") or name.endswith("shared_expert_gate")
    d, b = q8[name], bf[name]
    if keep:
        assert d.dtype == np.float32 and np.array_equal(d[()], W), name
        assert b.dtype == np.float32 and np.array_equal(b[()], W), name
        return
    # int8 g32: groups of 32 along the last dim, s = bf16(amax / 127) (the upper half of the
    # float32, nearest even), q = rint(x / s) (ties to even)
    assert d.dtype == np.int8 and d.attrs["dtype"] == "int8_g32" and d.attrs["group_size"] == 32, name
    s = q8[name + ".scale"]
    K = W.shape[-1]
    G = (K + 31) // 32
    assert s.dtype == np.float32 and s.shape == W.shape[:-1] + (G,), (name, s.shape)
    pad = np.zeros(W.shape[:-1] + (G * 32,), np.float32)
    pad[..., :K] = W
    g = pad.reshape(W.shape[:-1] + (G, 32))
    sc = (np.abs(g).max(-1) / np.float32(127)).astype(np.float32)
    su = sc.view(np.uint32).astype(np.uint64)
    sc = ((su + 0x7FFF + ((su >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    safe = np.where(sc > 0, sc, np.float32(1))
    q = np.clip(np.rint(g / safe[..., None]), -127, 127).astype(np.int8)
    q[sc == 0] = 0
    assert np.array_equal(s[()], sc), name
    assert np.array_equal(d[()], q.reshape(pad.shape)[..., :K]), name
    deq = (q.astype(np.float32) * sc[..., None]).reshape(pad.shape)[..., :K]
    rel = np.linalg.norm((W - deq).astype(np.float64)) / np.linalg.norm(W.astype(np.float64))
    assert abs(rep[name]["rel_err"] - rel) <= 1e-5 * rel + 1e-12, (name, rep[name]["rel_err"], rel)
    assert rep[name]["dtype"] == "int8"
    # bf16: the upper half of each float32, rounded to nearest even
    u = W.view(np.uint32).astype(np.uint64)
    assert b.dtype == np.uint16 and b.attrs["dtype"] == "bfloat16", name
    assert np.array_equal(b[()], ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)), name
    n_q8 += 1
src.visititems(visit)
assert n_q8 >= 10, n_q8
assert "optimizer" not in q8 and "trainer" not in q8
EOF
$PY - "$W/q8.jsonl" <<'EOF' && ok "calibration: perplexity of both, its change, top-k change per MoE layer and overall" || fail=1
import json, sys
c = [json.loads(l) for l in open(sys.argv[1]) if '"calib"' in l][0]
assert c["tokens"] == 256 and c["weights"] == "int8", c
assert len(c["topk_changed_share_per_layer"]) == 2, c       # layers 1, 2 are MoE
assert 0 <= c["topk_changed_share"] <= 0.2 and abs(c["ppl_change_pct"]) < 2, c
assert abs(c["ppl"] / c["ppl_f32"] - 1 - c["ppl_change_pct"] / 100) < 1e-6, c
print("     ppl %.4f -> %.4f (%+.3f%%), top-k changed for %.2f%% of (token, layer)"
      % (c["ppl_f32"], c["ppl"], c["ppl_change_pct"], 100 * c["topk_changed_share"]))
EOF
$T ckpt verify "$W/q8.h5" >/dev/null && ok "ckpt verify: the int8 file is sound" || bad "ckpt verify int8"
$T ckpt info "$W/q8.h5" | grep -q "int8 g32" && ok "ckpt info: says int8 g32" || bad "ckpt info int8"

# ---------------------------------------------------------------- round trip
run_gen() { $T generate --prompt "Round trip" --max-tokens 40 --seed 5 --json "$@"; }
gen() { run_gen "$@" 2>/dev/null; }
for d in int8 bf16; do
    [ $d = int8 ] && f=q8 || f=bf
    gen --ckpt "$W/run" --dtype $d >"$W/a.json"
    gen --ckpt "$W/$f.h5" >"$W/b.json"
    gen --ckpt "$W/$f.h5" --dtype $d >"$W/c.json"
    $PY -c "
import json, sys
a, b, c = (json.load(open('$W/%s.json' % x)) for x in 'abc')
sys.exit(0 if a['ids'] == b['ids'] == c['ids'] and a['logprobs'] == b['logprobs'] == c['logprobs'] else 1)" &&
        ok "$d: generate on the quantized file = generate --dtype $d on the float32 file (ids and logprobs bitwise)" ||
        bad "$d: quantized file and quantize-at-load differ"
done
gen --ckpt "$W/q8.h5" --dtype f32 >"$W/d.json" && ok "an int8 file served as f32 (dequantized)" || bad "int8 file --dtype f32"

# the bf16 decode kernel's prefetch distance (TANDEM_BF16_PREFETCH) moves
# only when lines are fetched: the same ids and logprobs at none, the
# default and the largest; a value that is not a byte count is ignored
# with one line naming it, and the run goes on.  (The model's lm_head, 256
# x 72, is two groups of four panels: the few-rows kernel that prefetches.)
gen --ckpt "$W/run" --dtype bf16 >"$W/pf.json"
for v in 0 65536 12abc; do
    TANDEM_BF16_PREFETCH=$v
    export TANDEM_BF16_PREFETCH
    run_gen --ckpt "$W/run" --dtype bf16 >"$W/pf$v.json" 2>"$W/pf$v.err" || bad "TANDEM_BF16_PREFETCH=$v: generate failed"
done
unset TANDEM_BF16_PREFETCH
$PY -c "
import json, sys
r = [json.load(open('$W/%s.json' % x)) for x in ('pf', 'pf0', 'pf65536', 'pf12abc')]
sys.exit(0 if all(x['ids'] == r[0]['ids'] and x['logprobs'] == r[0]['logprobs'] for x in r) else 1)" &&
    ok "bf16: the prefetch distance (none, default, 64 KiB, a bad value) changes no id or logprob" ||
    bad "bf16: the prefetch distance changed the output"
if [ "$(grep -c 'TANDEM_BF16_PREFETCH=12abc is not a byte count' "$W/pf12abc.err")" -eq 1 ] &&
    ! grep -q TANDEM_BF16_PREFETCH "$W/pf0.err" "$W/pf65536.err"; then
    ok "TANDEM_BF16_PREFETCH=12abc: one line naming it, ignored; 0 and 65536 taken without one"
else
    bad "TANDEM_BF16_PREFETCH: want one line for 12abc and none for 0 or 65536, got:"; cat "$W"/pf*.err
fi

# an int8 file exported to Hugging Face (configs/tiny.json, Mixtral-shaped:
# the model above has no HF family): every int8 tensor as q * s (the
# floats it serves with at --dtype f32), the rest as stored; the export
# serves as the int8 file does at --dtype f32
{ $T train configs/tiny.json data="$DATA" steps=3 out_dir="$W/mx" >/dev/null 2>&1 &&
    $T ckpt quantize "$W/mx" "$W/mx8.h5" --dtype int8 >/dev/null 2>&1 &&
    $T ckpt export "$W/mx8.h5" "$W/q8_hf" --format hf >"$W/log" 2>&1; } ||
    { bad "train, quantize and ckpt export --format hf of an int8 file"; cat "$W/log"; }
$PY - "$W" <<'EOF' && ok "hf export of an int8 file: its int8 tensors as q * s, bit for bit" || fail=1
import glob, json, struct, sys, h5py, numpy as np
w = sys.argv[1]
q8 = h5py.File(w + "/mx8.h5")
got = []
for fn in glob.glob(w + "/q8_hf/*.safetensors"):
    b = open(fn, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    for k, m in json.loads(b[8:8 + n]).items():
        if k != "__metadata__":
            s, e = m["data_offsets"]
            assert m["dtype"] == "F32", (k, m["dtype"])
            got.append(np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(m["shape"]))
n_int8 = 0
def visit(name, x):
    global n_int8
    if not isinstance(x, h5py.Dataset) or x.dtype != np.int8:
        return
    q, s = x[()], q8[name + ".scale"][()]
    want = q.astype(np.float32) * np.repeat(s, 32, axis=-1)[..., :q.shape[-1]]
    # among the exported tensors (the family's names; experts one by one)
    for m in ([want] if want.ndim == 2 else list(want)):
        assert any(a.shape == m.shape and np.array_equal(a, m) for a in got), name
    n_int8 += 1
q8.visititems(visit)
top = max(float(np.abs(a).max()) for a in got)
assert n_int8 >= 10 and top < 100, (n_int8, top)   # raw int8 read as floats would show values up to 127
EOF
gen --ckpt "$W/mx8.h5" --dtype f32 >"$W/d.json" && gen --ckpt "$W/q8_hf" >"$W/e.json" && $PY -c "
import json; d, e = (json.load(open('$W/%s.json' % x)) for x in 'de'); assert d['ids'] == e['ids'], (d['ids'], e['ids'])" &&
    ok "the hf export of the int8 file generates what the int8 file does at --dtype f32" || bad "hf export of int8: generate"

# ---------------------------------------------------------------- GPTQ rounding
$T ckpt quantize "$W/run" "$W/gq.h5" --dtype int8 --calib "$DATA" --seq-len 64 --windows 4 --gptq --gptq-windows 16 \
    >"$W/gq.jsonl" 2>"$W/gq.log" || { bad "ckpt quantize --gptq"; cat "$W/gq.log"; }
$PY - "$W" <<'EOF' && ok "--gptq: the same format; embedding, routers and vectors as rounding to nearest gives them, every other matrix re-rounded; reported errors" || fail=1
import json, sys, h5py, numpy as np
w = sys.argv[1]
src, q8, gq = h5py.File(w + "/run/latest"), h5py.File(w + "/q8.h5"), h5py.File(w + "/gq.h5")
lines = [json.loads(l) for l in open(w + "/gq.jsonl")]
rep = {l["tensor"]: l for l in lines if "tensor" in l}
summ = [l for l in lines if "quantized" in l][0]
assert summ["rounding"] == "gptq" and summ["gptq_matrices"] > 0, summ
# layer 0 dense (q/k/v, o, gate/up, down: 4 inputs), layers 1-2 MoE: 2 + 4 experts x 2 + shared 2 = 12 each; lm_head
assert summ["gptq_matrices"] + summ["gptq_nearest"] in (28, 29), summ
assert [l for l in lines if "calib" in l][0]["weights"] == "int8"
log = open(w + "/gq.log").read()
# made one layer at a time: every layer's second moments, only one layer's H held
for l in (1, 2, 3):
    assert "gptq: layer %d/3: second moments (1024 tokens)" % l in log, log
cfg = json.loads(src.attrs["config"])
d, hd = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
F, E, S = cfg["moe_intermediate_size"], cfg["num_local_experts"], cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
dense = d * d + (cfg["num_attention_heads"] * hd) ** 2 + d * d + cfg["intermediate_size"] ** 2
moe = d * d + (cfg["num_attention_heads"] * hd) ** 2 + E * (d * d + F * F) + d * d + S * S
assert summ["gptq_factor_bytes"] == 4 * max(dense, moe), (summ, dense, moe)
changed = 0
def visit(name, x):
    global changed
    if not isinstance(x, h5py.Dataset) or not (name.startswith("model/") or name == "lm_head"):
        return
    a, b = q8[name], gq[name]
    assert a.dtype == b.dtype and a.shape == b.shape and dict(a.attrs) == dict(b.attrs), name
    if a.dtype != np.int8 or name == "model/embed_tokens":
        assert np.array_equal(a[()], b[()]), name          # kept, or rounded to nearest
        if a.dtype == np.int8:
            assert np.array_equal(q8[name + ".scale"][()], gq[name + ".scale"][()]), name
        return
    q, s = b[()], gq[name + ".scale"][()]
    assert q.min() >= -127 and np.isfinite(s).all() and (s >= 0).all(), name
    K = q.shape[-1]
    deq = (q.astype(np.float32) * np.repeat(s, 32, axis=-1)[..., :K]).astype(np.float64)
    W = x[()].astype(np.float64)
    rel = np.linalg.norm(W - deq) / np.linalg.norm(W)
    assert abs(rep[name]["rel_err"] - rel) <= 1e-5 * rel, (name, rep[name]["rel_err"], rel)
    share = (q != a[()]).mean()
    assert share > 0.01, (name, share)                     # GPTQ moved some weights to the other neighbour
    changed += 1
src.visititems(visit)
assert changed >= 10, changed
EOF
$T ckpt verify "$W/gq.h5" >/dev/null && gen --ckpt "$W/gq.h5" >"$W/g.json" && ok "--gptq: the file verifies and serves" ||
    bad "--gptq file: verify or generate"
expect_fail "--gptq without --calib" "--gptq rounds int8 matrices from calibration data" \
    $T ckpt quantize "$W/run" "$W/qq.h5" --dtype int8 --gptq
expect_fail "--gptq with bf16" "it needs --dtype int8 and --calib" $T ckpt quantize "$W/run" "$W/qq.h5" --dtype bf16 --calib "$DATA" --gptq

# ---------------------------------------------------------------- router fitting
# --fit-routers on the int8 file: only the routers change (every other
# dataset and attribute as the unfitted file has them), the fit is recorded
# on the root, its report names each MoE router with a smaller logit error,
# and on held-out windows the fitted file changes fewer top-k sets than the
# unfitted one (the same --calib windows, both scored by tandem)
$T ckpt quantize "$W/run" "$W/qf.h5" --dtype int8 --calib "$DATA" --seq-len 64 --windows 16 --fit-routers \
    --fit-windows 16 >"$W/qf.jsonl" 2>"$W/qf.log" || { bad "ckpt quantize --fit-routers"; cat "$W/qf.log"; }
$T ckpt quantize "$W/run" "$W/qn.h5" --dtype int8 --calib "$DATA" --seq-len 64 --windows 16 >"$W/qn.jsonl" 2>"$W/log" ||
    { bad "ckpt quantize (to compare with --fit-routers)"; cat "$W/log"; }
$PY - "$W" <<'EOF' && ok "--fit-routers: only the routers differ from the unfitted file, the fit recorded, logit error and routing changes down" || fail=1
import json, sys, h5py, numpy as np
w = sys.argv[1]
qn, qf = h5py.File(w + "/qn.h5"), h5py.File(w + "/qf.h5")
fit = json.loads(qf.attrs["router_fit"])
# fitted over the KV cache int8 weights are served with by default (--kv-dtype auto: bf16)
assert fit == {"kv_dtype": "bf16", "split": "train", "windows": 16, "seq_len": 64, "ridge": 0.01}, fit
assert "router_fit" not in qn.attrs
assert sorted(qn.attrs) == sorted(k for k in qf.attrs if k != "router_fit")
for k in qn.attrs:
    assert qn.attrs[k] == qf.attrs[k], k
routers = ["model/layers/%d/mlp/gate" % l for l in (1, 2)]
names = {"qn": [], "qf": []}
qn.visit(names["qn"].append)
qf.visit(names["qf"].append)
assert names["qn"] == names["qf"], names
def visit(name, x):
    if not isinstance(x, h5py.Dataset):
        return
    a, b = qn[name], x
    assert a.dtype == b.dtype and a.shape == b.shape and dict(a.attrs) == dict(b.attrs), name
    if name in routers:
        rel = np.linalg.norm(b[()] - a[()]) / np.linalg.norm(a[()])
        assert b.dtype == np.float32 and 0 < rel < 0.5, (name, rel)
    else:
        assert np.array_equal(a[()], b[()]), name
qf.visititems(visit)
lines = [json.loads(l) for l in open(w + "/qf.jsonl")]
rep = [l for l in lines if "fit_routers" in l][0]
assert rep["fit_routers"] == 2 and rep["windows"] == 16 and rep["kv_dtype"] == "bf16", rep
assert [l for l in lines if "calib" in l][0]["kv_dtype"] == "bf16"
assert all(a < b for a, b in zip(rep["logit_rmse_after"], rep["logit_rmse_before"])), rep
log = open(w + "/qf.log").read()
for l, name in ((2, routers[0]), (3, routers[1])):
    assert "fit-routers: layer %d/3: %s, logit rmse " % (l, name) in log, log
cf = [l for l in lines if "calib" in l][0]
cn = [json.loads(l) for l in open(w + "/qn.jsonl") if '"calib"' in l][0]
assert cf["topk_changed_share"] < cn["topk_changed_share"], (cf, cn)
print("  fitted: top-k changed %.4f -> %.4f, logit rmse %s -> %s" % (cn["topk_changed_share"], cf["topk_changed_share"],
      rep["logit_rmse_before"], rep["logit_rmse_after"]))
EOF
$T ckpt verify "$W/qf.h5" >/dev/null && gen --ckpt "$W/qf.h5" >"$W/g.json" && ok "--fit-routers: the file verifies and serves" ||
    bad "--fit-routers file: verify or generate"
# the server notes a KV dtype other than the one the routers were fitted for;
# by default (--kv-dtype auto) it holds the KV cache in the fitted dtype
(
    serve_setup
    start_server "$W/qf.h5" --quiet --kv-dtype int8
    grep -q '^tandem: serve: note: the routers were fitted for a KV cache in bf16 .* holds it in int8: --kv-dtype bf16' \
        "$W/serve.log" || fail "no note of the KV dtype the routers were fitted for: $(cat "$W/serve.log")"
    stop_server
    start_server "$W/qf.h5" --quiet
    ! grep -q 'routers were fitted' "$W/serve.log" || fail "a note with the fitted KV dtype: $(cat "$W/serve.log")"
    grep -q '^tandem: serving .* KV cache bf16 ' "$W/serve.log" || fail "auto KV not the fitted bf16: $(cat "$W/serve.log")"
    stop_server
    cp "$W/qf.h5" "$W/qf8.h5"
    $PY -c "
import h5py, json
f = h5py.File('$W/qf8.h5', 'r+'); a = json.loads(f.attrs['router_fit']); a['kv_dtype'] = 'int8'
f.attrs['router_fit'] = json.dumps(a); f.close()"
    start_server "$W/qf8.h5" --quiet
    grep -q '^tandem: serving .* KV cache int8 ' "$W/serve.log" || fail "auto KV not the fitted int8: $(cat "$W/serve.log")"
    ! grep -q 'routers were fitted' "$W/serve.log" || fail "a note with the fitted KV dtype: $(cat "$W/serve.log")"
    stop_server
) && ok "serve: a note when the KV dtype is not the one the routers were fitted for; by default the fitted one" || fail=1
[ ! -e "$W/qf.h5.unfitted" ] && ok "--fit-routers: no staged file left" || bad "--fit-routers left $W/qf.h5.unfitted"
expect_fail "--fit-routers without --calib" "it needs --calib" $T ckpt quantize "$W/run" "$W/qq.h5" --dtype int8 --fit-routers
# a fit that fails publishes nothing: a token file of another vocabulary
printf 'x' >"$W/bad.bin"
expect_fail "--fit-routers on a bad token file" "fit-routers" $T ckpt quantize "$W/run" "$W/qx.h5" --dtype int8 --calib "$W/bad.bin" --fit-routers
[ ! -e "$W/qx.h5" ] && [ ! -e "$W/qx.h5.unfitted" ] && ok "--fit-routers: nothing published on failure" || bad "--fit-routers: a file left after a failure"

# ---------------------------------------------------------------- attention in another dtype
$T ckpt quantize "$W/run" "$W/qa.h5" --dtype int8 --attn-dtype bf16 --calib "$DATA" --seq-len 64 --windows 4 \
    >"$W/qa.jsonl" 2>"$W/log" || { bad "ckpt quantize --attn-dtype bf16"; cat "$W/log"; }
$PY - "$W" <<'EOF' && ok "--attn-dtype bf16: self_attn projections as the bf16 file has them, every other dataset as the int8 file; reported" || fail=1
import json, sys, h5py, numpy as np
w = sys.argv[1]
q8, bf, qa = h5py.File(w + "/q8.h5"), h5py.File(w + "/bf.h5"), h5py.File(w + "/qa.h5")
lines = [json.loads(l) for l in open(w + "/qa.jsonl")]
summ = [l for l in lines if "quantized" in l][0]
assert summ["dtype"] == "int8" and summ["attn_dtype"] == "bf16" and summ["embed_dtype"] == "int8", summ
c = [l for l in lines if "calib" in l][0]
assert c["weights"] == "int8" and c["attn"] == "bf16", c
assert [l for l in open(w + "/q8.jsonl") if '"quantized"' in l][0].count('"attn_dtype":"int8"') == 1
n_attn = 0
def visit(name, x):
    global n_attn
    if not isinstance(x, h5py.Dataset) or not (name.startswith("model/") or name == "lm_head"):
        return
    attn = "/self_attn/" in name and name.endswith("_proj")
    ref = bf if attn else q8
    assert x.dtype == ref[name].dtype and np.array_equal(x[()], ref[name][()]), name
    assert dict(x.attrs) == dict(ref[name].attrs), name
    n_attn += attn
qa.visititems(visit)
assert n_attn == 12, n_attn                                  # q, k, v, o of 3 layers
EOF
gen --ckpt "$W/qa.h5" >"$W/qa1.json" && gen --ckpt "$W/qa.h5" --dtype int8 >"$W/qa2.json" &&
    gen --ckpt "$W/q8.h5" >"$W/qa0.json" && $PY -c "
import json, sys
a, b, c = (json.load(open('$W/qa%d.json' % i)) for i in (1, 2, 0))
sys.exit(0 if a['ids'] == b['ids'] and a['logprobs'] == b['logprobs'] != c['logprobs'] else 1)" &&
    ok "--attn-dtype bf16 file: served as stored (--dtype int8 keeps its attention bf16), other logprobs than all-int8" ||
    bad "--attn-dtype bf16 file: serving"
# the server's start-up line names both dtypes (tests/serve_lib.sh: bounded
# waits for the line, /health and the clean stop; a subshell, for its fail)
(
    serve_setup
    start_server "$W/qa.h5" --quiet
    grep -q '^tandem: serving .* weights int8 (attention bf16) ' "$W/serve.log" ||
        fail "start-up line without the attention dtype: $(grep '^tandem: serving' "$W/serve.log")"
    stop_server
) && ok "serve: the start-up line says weights int8 (attention bf16); /health, clean stop" || fail=1
# --kv-dtype auto (the default): weights held in bf16 or int8 by choice
# (--dtype, or a file ckpt quantize wrote) get a bf16 KV cache, anything else
# a float32 one -- a bf16 file that is not a quantized one (rb.h5, as an
# imported bf16 release is) included (files without fitted routers)
$T ckpt reshard "$W/run" "$W/rb.h5" --weights-only --dtype bf16 >/dev/null 2>&1 || bad "ckpt reshard --dtype bf16"
(
    serve_setup
    for c in "run f32 f32" "run bf16 bf16" "run int8 bf16" "q8.h5 - bf16" "qa.h5 auto-int8 bf16" "rb.h5 - f32" \
        "rb.h5 bf16 bf16" "q8.h5 f32 f32"; do
        set -- $c
        case $2 in -) a="" ;; auto-*) a="--dtype ${2#auto-} --kv-dtype auto" ;; *) a="--dtype $2" ;; esac
        # shellcheck disable=SC2086
        start_server "$W/$1" --quiet $a
        grep -q "^tandem: serving .* KV cache $3 " "$W/serve.log" ||
            fail "$1 $a: the KV cache is not $3: $(grep '^tandem: serving' "$W/serve.log")"
        stop_server
    done
) && ok "--kv-dtype auto: KV bf16 for --dtype bf16|int8 and quantized files, f32 otherwise" || fail=1
expect_fail "--attn-dtype garbage" "--attn-dtype must be f32, bf16 or int8" \
    $T ckpt quantize "$W/run" "$W/qq.h5" --dtype int8 --attn-dtype int4

# ---------------------------------------------------------------- refused by name
corrupt() {   # corrupt NAME PYTHON: a copy of q8.h5 with PYTHON applied to f (h5py, r+)
    cp "$W/q8.h5" "$W/$1.h5"
    $PY -c "
import h5py, numpy as np
f = h5py.File('$W/$1.h5', 'r+')
n = 'model/layers/1/mlp/experts/up_proj'
$2
f.close()"
}
Q=model/layers/1/mlp/experts/up_proj
corrupt nan "s = f[n + '.scale'][()]; s[1, 3, 0] = np.nan; f[n + '.scale'][...] = s"
expect_fail "a NaN scale" "dataset /$Q.scale: scale nan of row \[1, 3\], group 0 is not finite" $T generate --ckpt "$W/nan.h5" --prompt hi
corrupt inf "s = f[n + '.scale'][()]; s[0, 0, 1] = np.inf; f[n + '.scale'][...] = s"
expect_fail "an infinite scale" "dataset /$Q.scale: .* not finite" $T generate --ckpt "$W/inf.h5" --prompt hi
corrupt neg "s = f[n + '.scale'][()]; s[2, 5, 1] = -s[2, 5, 1]; f[n + '.scale'][...] = s"
expect_fail "a negative scale" "dataset /$Q.scale: .* negative" $T generate --ckpt "$W/neg.h5" --prompt hi
corrupt zero "s = f[n + '.scale'][()]; s[3, 1, 0] = 0; f[n + '.scale'][...] = s"
expect_fail "a zero scale for non-zero weights" "dataset /$Q.scale: scale 0 .* zero for non-zero weights" \
    $T generate --ckpt "$W/zero.h5" --prompt hi
# a scale with bits below bfloat16's (as tandem wrote them before 2026-12-07): the GEMM holds
# scales in 16 bits, so rounding it would serve other weights than the file's
corrupt wide "s = f[n + '.scale'][()]; s[2, 7, 2] = np.nextafter(s[2, 7, 2], np.float32(1)); f[n + '.scale'][...] = s"
expect_fail "a scale that is not a bfloat16 value" \
    "dataset /$Q.scale: scale .* of row \[2, 7\], group 2 is not a bfloat16 value .*quantize the file again" \
    $T generate --ckpt "$W/wide.h5" --prompt hi
corrupt shape "s = f[n + '.scale'][()]; del f[n + '.scale']; f.create_dataset(n + '.scale', data=s[..., :1])"
expect_fail "a scale dataset of the wrong shape" "dataset /$Q.scale: shape \[4,64,1\], expected \[4,64,3\]" \
    $T generate --ckpt "$W/shape.h5" --prompt hi
corrupt f16 "s = f[n + '.scale'][()]; del f[n + '.scale']; f.create_dataset(n + '.scale', data=s.astype(np.float16))"
expect_fail "a float16 scale dataset" "dataset /$Q.scale: dtype float16, expected float32" $T generate --ckpt "$W/f16.h5" --prompt hi
corrupt noscale "del f[n + '.scale']"
expect_fail "a missing scale dataset" "dataset /$Q.scale is missing" $T generate --ckpt "$W/noscale.h5" --prompt hi
corrupt g64 "f[n].attrs['group_size'] = 64"
expect_fail "group size 64 (attribute)" "dataset /$Q: group size 64" $T generate --ckpt "$W/g64.h5" --prompt hi
corrupt g64b "f[n].attrs['dtype'] = 'int8_g64'"
expect_fail "groups of 64 (dtype attribute)" "dataset /$Q: int8 in groups of 64" $T generate --ckpt "$W/g64b.h5" --prompt hi
corrupt m128 "q = f[n][()]; q[0, 0, 0] = -128; f[n][...] = q"
expect_fail "an int8 value of -128" "dataset /$Q: value -128" $T generate --ckpt "$W/m128.h5" --prompt hi
corrupt noattr "del f[n].attrs['dtype']"
expect_fail "int8 without its dtype attribute" "dataset /$Q: int8 without the attribute dtype" $T generate --ckpt "$W/noattr.h5" --prompt hi
# the exports read int8 the same way: a bad scale is refused by name, nothing written
cp "$W/mx8.h5" "$W/mxnan.h5"
$PY -c "
import h5py, numpy as np
f = h5py.File('$W/mxnan.h5', 'r+')
s = f['model/layers/2/self_attn/k_proj.scale'][()]; s[5, 1] = np.nan; f['model/layers/2/self_attn/k_proj.scale'][...] = s"
expect_fail "hf export of an int8 file with a NaN scale" \
    "dataset /model/layers/2/self_attn/k_proj.scale: scale nan of row \[5\], group 1 is not finite" \
    $T ckpt export "$W/mxnan.h5" "$W/mxnan_hf" --format hf
expect_fail "gguf export of an int8 file with a NaN scale" \
    "dataset /model/layers/2/self_attn/k_proj.scale: scale nan of row \[5\], group 1 is not finite" \
    $T ckpt export "$W/mxnan.h5" "$W/mxnan.gguf" --format gguf --dtype q8_0
{ [ ! -e "$W/mxnan.gguf" ] && [ ! -e "$W/mxnan_hf/model.safetensors" ]; } && ok "the refused exports wrote nothing" ||
    bad "a refused export left a file behind"
printf 'A few words of text to score.' >"$W/text.txt"
expect_fail "score refuses a corrupt scale too" "dataset /$Q.scale" $T score --ckpt "$W/nan.h5" --text "$W/text.txt" --seq-len 8 --output "$W/x.h5"
expect_fail "verify refuses groups of 64" "dataset /$Q: int8 in groups of 64" $T ckpt verify "$W/g64b.h5"
expect_fail "training from an int8 file" "is int8 (a quantized serving checkpoint)" $T train configs/tiny.json data="$DATA" "$M" steps=1 init_from="$W/q8.h5" out_dir="$W/t"
expect_fail "quantizing a quantized file" "already quantized" $T ckpt quantize "$W/q8.h5" "$W/qq.h5" --dtype int8
expect_fail "quantize: a bad dtype" "--dtype must be bf16 or int8" $T ckpt quantize "$W/run" "$W/qq.h5" --dtype int4
expect_fail "generate: a bad --kv-dtype" "--kv-dtype must be auto, f32, bf16 or int8" $T generate --ckpt "$W/run" --prompt hi --kv-dtype fp8
[ ! -e "$W/qq.h5" ] && ok "nothing written on failure" || bad "quantize left a file on failure"

[ $fail -eq 0 ] && echo "lowprec.sh: all passed" || { echo "lowprec.sh: FAILED"; exit 1; }
