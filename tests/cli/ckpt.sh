#!/bin/sh
# tests/cli/ckpt.sh - checkpoints end to end: h5dump and h5py read them as
# SPEC section 4 says; a PyTorch model built from one (tests/ref/tandem_ref.py)
# computes tandem's loss; `tandem ckpt info|verify|reshard|export|diff`;
# 16-bit exports read back with h5py; and every kind of damage (a flipped
# byte, a truncated file, a changed shape, a changed format_version) is
# refused with its own message and a non-zero exit.
# Checkpoints come from build/tests/mpi_ckpt (model_init_weights + synthetic
# optimizer state), independent of the trainer.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=bin/tandem
TOOL=$BUILD/tests/mpi_ckpt
PY=/usr/bin/python3
export TANDEM_THREADS=2 OPENBLAS_NUM_THREADS=1
for b in "$T" "$TOOL"; do [ -x "$b" ] || { echo "ckpt.sh: $b missing (make unit)"; exit 1; }; done
W=$(mktemp -d /tmp/tandem-ckpt-cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
# expect_ok DESC CMD...: the command succeeds
expect_ok() { d=$1; shift; if "$@" >"$W/out" 2>&1; then pass "$d"; else fail "$d"; sed 's/^/     /' "$W/out"; fi; }
# expect_refused DESC PATTERN CMD...: the command fails, its stderr has PATTERN on one line
expect_refused() {
    d=$1; p=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then fail "$d: accepted"; return; fi
    if grep -q -F -- "$p" "$W/err" && [ "$(wc -l <"$W/err")" -eq 1 ]; then pass "$d: $(cat "$W/err")"
    else fail "$d: wanted one line with \"$p\", got:"; sed 's/^/     /' "$W/err"; fi
}

# GQA, a dense first layer, shared experts, an untied head: every tensor kind
CFG='{"vocab_size":64,"hidden_size":32,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":48,"moe_intermediate_size":16,"num_local_experts":4,"num_experts_per_tok":2,"n_shared_experts":1,"first_k_dense_replace":1,"max_position_embeddings":64,"router_aux_loss_coef":0.02,"router_z_loss_coef":0.01}'
A=$W/a.h5
expect_ok "save a checkpoint (weights, AdamW moments, trainer state)" $TOOL save "$A" --config "$CFG" --moments --step 5 --seed 3

# ---- h5dump and h5py see SPEC section 4
h5dump -H -p "$A" >"$W/dump" 2>&1 || fail "h5dump -H cannot read $A"
missing=""
for pat in 'ATTRIBUTE "format"' 'ATTRIBUTE "format_version"' 'ATTRIBUTE "config"' 'ATTRIBUTE "step"' \
    'ATTRIBUTE "tokens_seen"' 'GROUP "topology"' 'ATTRIBUTE "world_size"' 'DATASET "embed_tokens"' \
    'DATASET "lm_head"' 'DATASET "q_proj"' 'DATASET "gate"' 'GROUP "experts"' 'GROUP "shared_experts"' \
    'ATTRIBUTE "partition"' 'CHECKSUM FLETCHER32' 'CHUNKED' 'GROUP "optimizer"' 'GROUP "exp_avg_sq"' \
    'GROUP "trainer"' 'DATASET "rank_rng"' 'H5T_IEEE_F32LE' 'H5T_STD_U64LE'; do
    grep -q -F "$pat" "$W/dump" || missing="$missing [$pat]"
done
[ -z "$missing" ] && pass "h5dump -H lists the SPEC structure" || fail "h5dump -H lacks:$missing"
expect_ok "h5py: names, shapes, dtypes, attributes, partitions, Fletcher32 chunks" $PY tests/ref/ckpt_check.py "$A" --topology 1,1,1,1

# ---- PyTorch built from the checkpoint computes tandem's loss
ref=$($PY tests/ref/ckpt_loss.py "$A" "$W/ids.bin" --batch 2 --seq 16)
ours=$($TOOL loss "$A" "$W/ids.bin" 2 16)
# tandem computes in float32, the reference in float64: ~1e-6 relative over
# a 3-layer model (tests/test_model.c uses the same 2e-5)
if $PY -c "import sys; r, o = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(r - o) > 2e-5 * abs(r))" "$ref" "$ours"; then
    pass "loss: PyTorch from h5py $ref, tandem $ours"
else
    fail "loss: PyTorch from h5py $ref, tandem $ours (tolerance 2e-5 relative)"
fi

# ---- info, verify
expect_ok "ckpt info" $T ckpt info "$A"
grep -q "model/layers/2/mlp/experts/down_proj *\[4,32,16\] *float32 *replicated" "$W/out" && pass "info lists tensors" || fail "info output"
$T ckpt info --json "$A" >"$W/info.json"
if $PY - "$W/info.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "tandem-checkpoint" and j["format_version"] == 1 and j["step"] == 5, j
assert j["topology"] == {"world_size": 1, "dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1}, j["topology"]
assert j["config"]["hidden_size"] == 32 and j["optimizer"]["beta2"] == 0.95 and j["trainer"]["micro_batches"] == 15
names = [t["name"] for t in j["tensors"]]
assert names[0] == "model/embed_tokens" and "trainer/rank_rng" in names, names[:3]
w = [t for t in j["tensors"] if t["name"].startswith("model/") or t["name"] == "lm_head"]
tok = [t for t in j["tensors"] if t["name"].startswith("tokenizer/")]
assert len(j["tensors"]) == 3 * len(w) + 2 + len(tok)
assert j["tokenizer"] == {t["name"][10:]: t["numel"] for t in tok} and set(j["tokenizer"]) == {"tokenizer.json", "generation_config.json"}, j["tokenizer"]
assert all(t["dtype"] == "uint8" for t in tok)
assert j["totals"]["weight_params"] == sum(t["numel"] for t in w)
assert j["totals"]["optimizer_values"] == 2 * j["totals"]["weight_params"]
assert all(t["partition"] == "replicated" and t["dtype"] == "float32" for t in w)
EOF
then pass "info --json is one JSON object with config, topology, tensors, totals"; else fail "info --json"; fi
expect_ok "ckpt verify" $T ckpt verify "$A"
$T ckpt info "$A" | grep "^tokenizer  " | grep "generation_config.json (19 bytes)" | grep -q "tokenizer.json ([0-9]* bytes)" \
    && pass "info lists the tokenizer files" || fail "info: no tokenizer line"

# ---- reshard: another topology recorded, the same numbers
R=$W/r.h5
expect_ok "reshard to dp=2 tp=2 ep=2" $T ckpt reshard "$A" "$R" --dp 2 --tp 2 --ep 2
expect_ok "h5py: resharded file records dp=2 tp=2 ep=2 partitions" $PY tests/ref/ckpt_check.py "$R" --topology 2,2,1,2 --compare "$A"
expect_ok "reshard to pp=3" $T ckpt reshard "$R" "$W/r3.h5" --pp 3
expect_ok "h5py: pp=3 partitions" $PY tests/ref/ckpt_check.py "$W/r3.h5" --topology 1,1,3,1 --compare "$A"
$T ckpt diff "$A" "$W/r3.h5" >"$W/diff" 2>&1 && grep -q "identical; max abs 0, max rel 0" "$W/diff" \
    && pass "diff: resharded twice, every tensor identical (weights, moments)" || { fail "diff after reshard"; cat "$W/diff"; }
expect_ok "the resharded file loads with its optimizer state" $TOOL load "$W/r3.h5" --moments
expect_refused "a topology that does not divide the model" "tp=3 does not divide num_attention_heads=4" \
    $T ckpt reshard "$A" "$W/bad.h5" --tp 3
expect_refused "ep must divide dp" "ep=2 does not divide dp=1" $T ckpt reshard "$A" "$W/bad.h5" --ep 2

# ---- serving exports: 16-bit weights h5py reads, tandem upcasts
for dt in bf16 f16; do
    E=$W/$dt.h5
    expect_ok "export --dtype $dt" $T ckpt export "$A" "$E" --dtype $dt
    expect_ok "h5py: $dt values are the nearest-even roundings, no optimizer" \
        $PY tests/ref/ckpt_check.py "$E" --dtype $dt --weights-only --compare "$A"
    expect_ok "verify $dt export" $T ckpt verify "$E"
    ref=$($PY tests/ref/ckpt_loss.py "$E" "$W/ids.bin" --batch 2 --seq 16)
    ours=$($TOOL loss "$E" "$W/ids.bin" 2 16)
    if $PY -c "import sys; r, o = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(r - o) > 2e-5 * abs(r))" "$ref" "$ours"; then
        pass "loss on the $dt export: PyTorch $ref, tandem (upcast to float32) $ours"
    else
        fail "loss on the $dt export: PyTorch $ref, tandem $ours"
    fi
done
$PY -c "
import h5py, numpy as np, sys
f = h5py.File(sys.argv[1]); d = f['model/layers/0/self_attn/q_proj']
assert d.dtype == np.float16 and f['model/norm'].dtype == np.float32
" "$W/f16.h5" && pass "h5py reads the f16 export as float16 (norms float32)" || fail "h5py float16"
# ---- the tokenizer files: 1-D uint8 datasets h5py reads as bytes, carried
# through reshard and export
if $PY - "$A" "$R" "$W/r3.h5" "$W/bf16.h5" <<'EOF'
import h5py, json, sys
want = None
for p in sys.argv[1:]:
    with h5py.File(p, "r") as f:
        d = f["tokenizer/tokenizer.json"]
        assert d.dtype == "uint8" and d.ndim == 1 and d.fletcher32 and d.chunks, (p, d)
        got = (bytes(f["tokenizer/tokenizer.json"][()]), bytes(f["tokenizer/generation_config.json"][()]))
        assert "tokenizer/tokenizer_config.json" not in f, p
    want = want or got
    assert got == want, p
assert json.loads(want[0])["model"]["vocab"]["<0xFF>"] == 255 and json.loads(want[1]) == {"eos_token_id": 2}
EOF
then pass "h5py: /tokenizer bytes, the same in the resharded and exported files"; else fail "tokenizer files"; fi
$T ckpt info "$W/bf16.h5" | grep -q "optimizer   none" && pass "export drops the optimizer" || fail "export kept the optimizer"
expect_ok "reshard --weights-only keeps step" $T ckpt reshard "$A" "$W/wo.h5" --weights-only --tp 2
[ "$($T ckpt info --json "$W/wo.h5" | $PY -c 'import json,sys; j=json.load(sys.stdin); print(j["step"], j["optimizer"])')" = "5 None" ] \
    && pass "weights-only: step 5, no optimizer" || fail "weights-only metadata"
expect_refused "resume from a weights-only file" "/optimizer is missing" $TOOL load "$W/wo.h5" --moments

# ---- diff of different weights
$TOOL save "$W/b.h5" --config "$CFG" --seed 4 >/dev/null 2>&1
$T ckpt diff "$A" "$W/b.h5" >"$W/diff" 2>&1 && grep -q "model/embed_tokens" "$W/diff" && grep -q "only in A" "$W/diff" \
    && ! grep -q "; 0 not comparable" "$W/diff" && pass "diff of two different checkpoints (exit 0)" || { fail "diff"; cat "$W/diff"; }

# ---- damage: each refused with its own message, by verify and by a load
damage() {  # damage KIND FILE
    $PY - "$1" "$2" <<'EOF'
import os, sys, h5py, numpy as np
kind, path = sys.argv[1:3]
if kind == "byte":
    with h5py.File(path, "r") as f:
        info = f["model/layers/1/mlp/experts/down_proj"].id.get_chunk_info(0)
    with open(path, "r+b") as fp:
        fp.seek(info.byte_offset + info.size // 2)
        b = fp.read(1)
        fp.seek(info.byte_offset + info.size // 2)
        fp.write(bytes([b[0] ^ 0x20]))
elif kind == "tok":
    with h5py.File(path, "r") as f:
        info = f["tokenizer/tokenizer.json"].id.get_chunk_info(0)
    with open(path, "r+b") as fp:
        fp.seek(info.byte_offset + 3)
        b = fp.read(1)
        fp.seek(info.byte_offset + 3)
        fp.write(bytes([b[0] ^ 0x01]))
elif kind == "truncate":
    os.truncate(path, os.path.getsize(path) * 2 // 3)
elif kind == "shape":
    with h5py.File(path, "r+") as f:
        attrs = dict(f["model/layers/0/self_attn/k_proj"].attrs)
        del f["model/layers/0/self_attn/k_proj"]
        d = f.create_dataset("model/layers/0/self_attn/k_proj", shape=(8, 32), dtype="f4", chunks=True, fletcher32=True)
        for k, v in attrs.items():
            d.attrs[k] = v
elif kind == "version":
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 2
EOF
}
msgs=""
for kind in byte tok truncate shape version; do
    case $kind in
    byte) want="checksum mismatch in dataset /model/layers/1/mlp/experts/down_proj" ;;
    tok) want="checksum mismatch in dataset /tokenizer/tokenizer.json" ;;
    truncate) want="file is truncated" ;;
    shape) want="dataset /model/layers/0/self_attn/k_proj: shape [8,32] does not match the config [16,32]" ;;
    version) want="attribute format_version is 2; this tandem reads version 1" ;;
    esac
    X=$W/damaged_$kind.h5
    cp "$A" "$X"
    damage $kind "$X"
    expect_refused "verify refuses a $kind change" "$want" $T ckpt verify "$X"
    msgs="$msgs$(cat "$W/err")
"
    expect_refused "load refuses a $kind change" "$want" $TOOL load "$X" --moments
done
[ "$(printf '%s' "$msgs" | sort -u | wc -l)" -eq 5 ] && pass "five kinds of damage, five different messages" || fail "messages not distinct"

# ---- every subcommand has --help; misuse exits 2
nohelp=""
for s in info verify reshard export diff; do
    $T ckpt $s --help >"$W/out" 2>&1 && grep -q "usage: tandem ckpt" "$W/out" || nohelp="$nohelp $s"
done
[ -z "$nohelp" ] && pass "--help on every subcommand" || fail "--help of:$nohelp"
set +e
$T ckpt frobnicate >/dev/null 2>&1; [ $? -eq 2 ] && pass "unknown subcommand exits 2" || fail "unknown subcommand"
$T ckpt info >/dev/null 2>&1; [ $? -eq 2 ] && pass "missing argument exits 2" || fail "missing argument"
set -e

if [ $fails -ne 0 ]; then echo "ckpt.sh: $fails FAILED"; exit 1; fi
echo "ckpt.sh: all passed"
