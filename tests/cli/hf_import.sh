#!/bin/sh
# tests/cli/hf_import.sh - Hugging Face checkpoints end to end (SPEC section
# 9, docs/import.md), against the float64 PyTorch reference of the four
# families (tests/ref/hf_ref.py; the checks are tests/ref/hf_check.py):
#   - score on 32 HF directories (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE x
#     v4/v5 layout x f32/bf16 x one file/3 shards) read directly, and on
#     their `tandem ckpt import`: logprobs within 1e-4 of float64, the two
#     bit for bit alike;
#   - one training step (`tandem train init_from=HF_DIR`, beta1 = 0.5 so that
#     exp_avg = g / 2): every tensor's gradient against the reference's,
#     named through `tandem ckpt import` of the gradient files;
#   - greedy generation from an HF directory = hf_ref greedy;
#   - HF -> tandem -> HF (`ckpt export --format hf`, sharded) bit for bit,
#     config and tokenizer files byte for byte; v4 -> v5 through export;
#   - tandem-native models export as the family that expresses them, and
#     the reference computes tandem's logprobs from the export;
#   - eval, rollout, score --rollout and rl from an HF directory;
#   - every refusal (missing / unexpected tensor, shape, dtype,
#     architecture, each unsupported config key, corrupt / truncated /
#     missing shard): one line, non-zero exit, and no import file left.
# Serving under tp=2 / ep=2 from an HF directory: tests/mpi/serve_hf.sh.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=$PWD/bin/tandem
TOOL=$BUILD/tests/mpi_ckpt
PY=/usr/bin/python3
export TANDEM_THREADS=1 OPENBLAS_NUM_THREADS=1
for b in "$T" "$TOOL"; do [ -x "$b" ] || { echo "hf_import.sh: $b missing (make unit)"; exit 1; }; done
W=$(mktemp -d /tmp/tandem-hfimport.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
# expect_refused DESC PATTERN CMD...: fails, with one stderr line holding PATTERN
expect_refused() {
    d=$1; p=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then fail "$d: accepted"; return 1; fi
    if grep -q -F -- "$p" "$W/err" && [ "$(wc -l <"$W/err")" -eq 1 ]; then return 0; fi
    fail "$d: wanted one line with \"$p\", got:"; sed 's/^/     /' "$W/err"; return 1
}
t0=$(date +%s)

printf 'The day a sparse model is released, parse its weights, map every tensor and serve it: Day-0 import, with outputs that match the reference.\n' >"$W/text"
head -c 4000 /usr/share/games/fortunes/fortunes >"$W/corpus"
$T data prepare --input "$W/corpus" --output "$W/d.bin" 2>/dev/null
$PY tests/ref/hf_check.py prepare "$W" "$W/d.bin" || { echo "hf_import.sh: FAIL: the reference could not build the checkpoints"; exit 1; }
t1=$(date +%s)

# ---- every variant: score directly, import, score the import, export back
for d in "$W"/m/*/; do
    d=${d%/}
    v=$(basename "$d")
    $T score --ckpt "$d" --text "$W/text" --seq-len 24 --output "$d/direct.h5" >/dev/null 2>"$W/err" || { fail "score $v"; cat "$W/err"; }
    $T ckpt import "$d" "$d/import.ckpt.h5" >/dev/null 2>"$W/err" || { fail "import $v"; cat "$W/err"; continue; }
    $T score --ckpt "$d/import.ckpt.h5" --text "$W/text" --seq-len 24 --output "$d/import.h5" >/dev/null 2>"$W/err" \
        || { fail "score the import of $v"; cat "$W/err"; }
    $T ckpt export "$d/import.ckpt.h5" "$d/export" --format hf --shard-mb 0.25 >/dev/null 2>"$W/err" \
        || { fail "export $v"; cat "$W/err"; }
    case $v in *_v4_f32_1)
        $T ckpt export "$d/import.ckpt.h5" "$d/as_v5" --format hf --layout v5 >/dev/null 2>"$W/err" \
            || { fail "export $v --layout v5"; cat "$W/err"; } ;;
    esac
done
t2=$(date +%s)

# ---- one training step from an HF directory; gradients named by import
cat >"$W/run.json" <<EOF
{"data": "$W/d.bin", "seq_len": 16, "micro_batch": 4, "grad_accum": 1, "steps": 1, "lr": 1e-9, "min_lr": 1e-9,
 "lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0, "beta1": 0.5, "grad_clip": 0, "shuffle": false,
 "save_every": 0, "eval_every": 0, "threads": 1}
EOF
for g in "$W"/grad/*/; do
    g=${g%/}
    v=$(basename "$g")
    $T ckpt import "$g" "$g.h5" >/dev/null 2>"$W/err" || { fail "import the gradients of $v"; cat "$W/err"; }
    data=$W/d.bin
    if [ -f "$W/m/$v/tokenizer.json" ]; then
        # the directory's tokenizer is the run's: its data is prepared with it
        # (byte tokens at their byte values: the same ids as d.bin's)
        data=$W/d_$v.bin
        $T data prepare --input "$W/corpus" --output "$data" --tokenizer "$W/m/$v" 2>/dev/null ||
            fail "data prepare --tokenizer $v"
        cmp -s "$(dirname "$data")/d.bin" "$data" && fail "d_$v.bin: the token file does not name its tokenizer"
    fi
    $T train "$W/run.json" init_from="$W/m/$v" data="$data" out_dir="$W/train/$v" >/dev/null 2>"$W/err" ||
        { fail "train from $v"; cat "$W/err"; }
done
# ---- greedy generation
for g in "$W"/greedy/*.json; do
    v=$(basename "$g" .json)
    $T generate --ckpt "$W/m/$v" --prompt-ids 84,104,101,32,100,97,121 --max-tokens 10 --temperature 0 --json \
        >"$W/greedy/$v.out" 2>"$W/err" || { fail "generate from $v"; cat "$W/err"; }
done
t3=$(date +%s)

# ---- tandem-native models: export as the family that expresses them
mkdir -p "$W/native"
for c in tiny tiny_olmoe tiny_qwen2moe tiny_qwen3moe; do
    n=$W/native/$c
    mkdir -p "$n"
    m=$($PY -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['model']))" "configs/$c.json")
    $TOOL save "$n/t.h5" --config "$m" --seed 3 >/dev/null
    $T ckpt export "$n/t.h5" "$n/hf" --format hf >/dev/null 2>"$W/err" || { fail "export native $c"; cat "$W/err"; continue; }
    $T score --ckpt "$n/t.h5" --text "$W/text" --seq-len 24 --output "$n/score.h5" >/dev/null 2>&1 || fail "score native $c"
done
$PY tests/ref/hf_check.py native-ref "$W/native" || fail "the reference on the native exports"
CFG_A='{"vocab_size":64,"hidden_size":32,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":48,"moe_intermediate_size":16,"num_local_experts":4,"num_experts_per_tok":2,"n_shared_experts":1,"first_k_dense_replace":1,"max_position_embeddings":64}'
$TOOL save "$W/native/a.h5" --config "$CFG_A" >/dev/null
expect_refused "export of a model no family expresses" "no Hugging Face family expresses this model (MixtralForCausalLM: " \
    $T ckpt export "$W/native/a.h5" "$W/native/a_hf" --format hf \
    && pass "a dense first layer with an ungated shared expert: refused, naming each family's obstacle"
V=$W/m/qwen2_moe_v4_f32_1
expect_refused "export into a directory holding a model" "already holds a model (" \
    $T ckpt export "$V/import.ckpt.h5" "$V" --format hf && pass "export refuses to write over a model directory"

# ---- the other commands that read a checkpoint, from an HF directory
printf '{"prompt_ids": [84, 104, 101]}\n{"prompt": "ab"}\n' >"$W/p.jsonl"
if $T eval --ckpt "$V" --data "$W/d.bin" --seq-len 16 >"$W/out" 2>&1 && grep -q '"perplexity"' "$W/out"; then
    pass "eval --ckpt HF_DIR"; else fail "eval --ckpt HF_DIR"; cat "$W/out"; fi
if $T rollout --ckpt "$V" --prompts "$W/p.jsonl" --n 2 --max-tokens 6 --output "$W/ro.jsonl" 2>/dev/null &&
    $T score --rollout "$W/ro.jsonl" --ckpt "$V" >"$W/out" 2>&1 && grep -q '"logprob_diff_max":0,"routing_mismatch":0' "$W/out"; then
    pass "rollout --ckpt HF_DIR, and score --rollout against it: logprob_diff_max 0, no routing mismatch"
else fail "rollout / score --rollout from an HF dir"; cat "$W/out"; fi
if $T rl configs/rl_vowels.json init_from="$V" out_dir="$W/rl" steps=1 prompts_per_step=2 group_size=2 \
    max_new_tokens=4 threads=1 >"$W/out" 2>&1 && [ -e "$W/rl/latest" ]; then
    pass "rl init_from=HF_DIR runs a step"; else fail "rl init_from=HF_DIR"; cat "$W/out"; fi
expect_refused "resuming from an HF directory" "holds no optimizer state" \
    $T train "$W/run.json" resume="$V" out_dir="$W/resumed" && pass "train resume=HF_DIR is refused (no optimizer state; init_from is the way)"

# ---- refusals: one line, non-zero, before any weight is used; no file left
nref=0
while IFS="$(printf '\t')" read -r name want; do
    B=$W/bad/$name
    if expect_refused "score $name" "$want" $T score --ckpt "$B" --text "$W/text" --seq-len 24 --output "$W/x.h5"; then
        msg=$(cat "$W/err")
        if expect_refused "import $name" "$want" $T ckpt import "$B" "$W/x.h5" && [ ! -e "$W/x.h5" ] && [ ! -e "$W/x.h5.tmp" ]; then
            pass "refused $name: $msg"
            nref=$((nref + 1))
        else
            [ -e "$W/x.h5" ] && fail "import $name left $W/x.h5"
        fi
    fi
    rm -f "$W/x.h5" "$W/x.h5.tmp"
done <"$W/bad/cases.txt"
while IFS="$(printf '\t')" read -r name want; do
    if $T score --ckpt "$W/ok/$name" --text "$W/text" --seq-len 24 --output "$W/x.h5" >/dev/null 2>"$W/err" &&
        grep -q -F -- "$want" "$W/err"; then pass "accepted $name with a note: $(cat "$W/err")"
    else fail "$name: wanted success and a note \"$want\", got:"; cat "$W/err"; fi
done <"$W/ok/cases.txt"
expect_refused "import of a directory without config.json" "is not a Hugging Face model directory" \
    $T ckpt import "$W/native" "$W/x.h5" && pass "import of a non-HF directory refused"

# ---- the imported checkpoint: info lists the tokenizer; the checks
$T ckpt info "$W/m/qwen3_moe_v5_bf16_3/import.ckpt.h5" | grep "^tokenizer" | grep -q "tokenizer.json (" \
    && pass "ckpt info lists the imported tokenizer files" || fail "ckpt info: no tokenizer"
$T ckpt verify "$W/m/qwen3_moe_v5_bf16_3/import.ckpt.h5" >/dev/null 2>&1 && pass "ckpt verify: the import is sound" \
    || fail "ckpt verify of an import"
$PY tests/ref/hf_check.py check "$W" || fails=$((fails + 1))
t4=$(date +%s)
echo "hf_import.sh: reference $((t1 - t0)) s, score/import/export $((t2 - t1)) s, train/generate $((t3 - t2)) s, rest $((t4 - t3)) s"
[ "$fails" -eq 0 ] || { echo "hf_import.sh: $fails FAILED"; exit 1; }
echo "hf_import.sh: all passed"
