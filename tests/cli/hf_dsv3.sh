#!/bin/sh
# tests/cli/hf_dsv3.sh - issue 16's Hugging Face side end to end, against
# the float64 PyTorch reference (tests/ref/hf_ref.py; the checks are
# tests/ref/hf_dsv3_check.py):
#   - YaRN: a Qwen3-MoE with rope_scaling yarn (v4 config, and v5
#     rope_parameters bf16 3 shards) scored directly and imported, within
#     1e-4 of float64 (and the reference without YaRN far from it);
#   - FP8 (F8_E4M3 with *_scale_inv blocks): Qwen3-MoE, DeepSeek-V3 (with
#     an MTP layer read past) and the Kimi-K2 layout scored directly and
#     imported within 1e-4; exported back without quantization_config or
#     F8 tensors, the export scoring bit for bit as the directory;
#   - DeepseekV3ForCausalLM bf16 sharded: score, HF -> tandem -> HF bit for
#     bit; one training step's gradients (DeepSeek-V3 and Kimi-K2 layouts)
#     against the reference; greedy generation from the FP8 directory;
#   - refusals: a missing scale, a scale of the wrong shape, F8 without a
#     quantization_config, another quant_method, an unknown rope_scaling
#     type, an unknown topk_method / scoring_func, a bad MLA shape, a
#     missing correction bias: one line naming it, non-zero, no file left.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=$PWD/bin/tandem
PY=/usr/bin/python3
export TANDEM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x "$T" ] || { echo "hf_dsv3.sh: $T missing (make)"; exit 1; }
W=$(mktemp -d /tmp/tandem-hfdsv3.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
expect_refused() {
    d=$1; p=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then fail "$d: accepted"; return 1; fi
    if grep -q -F -- "$p" "$W/err" && [ "$(wc -l <"$W/err")" -eq 1 ]; then return 0; fi
    fail "$d: wanted one line with \"$p\", got:"; sed 's/^/     /' "$W/err"; return 1
}

printf 'The day a sparse model is released, parse its weights, map every tensor and serve it: Day-0 import, with outputs that match the reference.\n' >"$W/text"
head -c 3000 /usr/share/games/fortunes/fortunes >"$W/corpus"
$T data prepare --input "$W/corpus" --output "$W/d.bin" 2>/dev/null
$PY tests/ref/hf_dsv3_check.py prepare "$W" "$W/d.bin" || { echo "hf_dsv3.sh: FAIL: the reference could not build the checkpoints"; exit 1; }

for d in "$W"/m/*/; do
    d=${d%/}
    v=$(basename "$d")
    $T score --ckpt "$d" --text "$W/text" --seq-len 24 --output "$d/direct.h5" >/dev/null 2>"$W/err" || { fail "score $v"; cat "$W/err"; }
    $T ckpt import "$d" "$d/import.ckpt.h5" >/dev/null 2>"$W/err" || { fail "import $v"; cat "$W/err"; continue; }
    $T score --ckpt "$d/import.ckpt.h5" --text "$W/text" --seq-len 24 --output "$d/import.h5" >/dev/null 2>"$W/err" \
        || { fail "score the import of $v"; cat "$W/err"; }
    case $v in q3_fp8|ds_fp8|ds_bf16|kimi_fp8)
        $T ckpt export "$d/import.ckpt.h5" "$d/export" --format hf --shard-mb 0.25 >/dev/null 2>"$W/err" \
            || { fail "export $v"; cat "$W/err"; continue; }
        $T score --ckpt "$d/export" --text "$W/text" --seq-len 24 --output "$d/export.h5" >/dev/null 2>"$W/err" \
            || { fail "score the export of $v"; cat "$W/err"; } ;;
    esac
done
# the MTP layer is read past with a note
$T score --ckpt "$W/m/ds_fp8" --text "$W/text" --seq-len 24 --output "$W/mtp.h5" >/dev/null 2>"$W/err" &&
    grep -q "read past model.layers.3.eh_proj.weight (the multi-token-prediction layer" "$W/err" &&
    pass "the MTP layer is read past with a note: $(grep -o 'read past model.layers.3[^;]*' "$W/err" | head -1)" ||
    { fail "MTP note"; cat "$W/err"; }

# one training step from an HF directory; gradients named by import
cat >"$W/run.json" <<EOF
{"data": "$W/d.bin", "seq_len": 16, "micro_batch": 4, "grad_accum": 1, "steps": 1, "lr": 1e-9, "min_lr": 1e-9,
 "lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0, "beta1": 0.5, "grad_clip": 0, "shuffle": false,
 "save_every": 0, "eval_every": 0, "threads": 1}
EOF
for g in "$W"/grad/*/; do
    g=${g%/}
    v=$(basename "$g")
    $T ckpt import "$g" "$g.h5" >/dev/null 2>"$W/err" || { fail "import the gradients of $v"; cat "$W/err"; }
    $T train "$W/run.json" init_from="$W/m/$v" out_dir="$W/train/$v" >/dev/null 2>"$W/err" ||
        { fail "train from $v"; cat "$W/err"; }
done
$T generate --ckpt "$W/m/ds_fp8" --prompt-ids 84,104,101,32,100,97,121 --max-tokens 10 --temperature 0 --json \
    >"$W/greedy/ds_fp8.out" 2>"$W/err" || { fail "generate from ds_fp8"; cat "$W/err"; }

# refusals
while IFS="$(printf '\t')" read -r name want; do
    B=$W/bad/$name
    if expect_refused "score $name" "$want" $T score --ckpt "$B" --text "$W/text" --seq-len 24 --output "$W/x.h5"; then
        msg=$(cat "$W/err")
        if expect_refused "import $name" "$want" $T ckpt import "$B" "$W/x.h5" && [ ! -e "$W/x.h5" ]; then
            pass "refused $name: $msg"
        else
            [ -e "$W/x.h5" ] && fail "import $name left $W/x.h5"
        fi
    fi
    rm -f "$W/x.h5" "$W/x.h5.tmp"
done <"$W/bad/cases.txt"

$PY tests/ref/hf_dsv3_check.py check "$W" || fails=$((fails + 1))
[ "$fails" -eq 0 ] || { echo "hf_dsv3.sh: $fails FAILED"; exit 1; }
echo "hf_dsv3.sh: all passed"
