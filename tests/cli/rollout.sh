#!/bin/sh
# tests/cli/rollout.sh - `tandem rollout` end to end, checked by the trainer.
#
#  1. train the tiny config for 20 steps; roll out 6 prompts (text and id
#     forms, different lengths) x 4 samples; check every field and shape
#     (tests/ref/rollout_check.py), that the same seed gives the same
#     samples with another batch size, and that the training forward
#     (`tandem score --rollout`) gives logprob_diff_max == 0 and
#     routing_mismatch == 0 exactly;
#  2. bad prompt files: one error line naming the line, non-zero exit,
#     nothing generated; a malformed rollout file for the checker;
#  3. --follow: a run directory at step 10; once the rollout has produced
#     its first sample a trainer resumes the run and writes step 20 (the
#     rollout is SIGSTOPped meanwhile, so the checkpoint always lands while
#     requests are in flight and others queued); every sample exactly once,
#     versions 10 then 20, and the checker passes for both versions;
#     a checkpoint that fails to load is retried with a warning; one of
#     another model config is an error; no checkpoint within --wait-timeout
#     is an error.
# Needs bin/tandem (make); TANDEM=path tests another build (a sanitized one,
# say); TANDEM_TRAIN=path trains with another build than TANDEM.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
TANDEM_TRAIN=${TANDEM_TRAIN:-$TANDEM}
PY=/usr/bin/python3
CHECK="$PY tests/ref/rollout_check.py"
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
W=$(mktemp -d "${TMPDIR:-/tmp}/tandem-rollout.XXXXXX")
trap 'rm -rf "$W"' EXIT
t0=$(date +%s)
fail() {
    echo "rollout: FAIL: $*"
    exit 1
}
ok() { echo "ok   $*"; }
KV="--kv-mb 16"

test -s "$BUILD/fortunes.bin" ||
    "$TANDEM" data prepare --input /usr/share/games/fortunes --output "$BUILD/fortunes.bin" >/dev/null
train() {   # train OUT_DIR key=value...
    d=$1
    shift
    bounded 300 "$TANDEM_TRAIN" train configs/tiny.json data="$BUILD/fortunes.bin" out_dir="$d" "$@" >"$W/train.log" 2>&1 ||
        { tail -n 20 "$W/train.log"; fail "tandem train $*"; }
}

# ---------------------------------------------------------------- 1. rollout + trainer check
train "$W/run" steps=20
CK="$W/run/step_00000020.h5"
cat >"$W/p.jsonl" <<'EOF'
{"prompt": "A", "id": "one-byte"}
{"prompt_ids": [87, 104, 121, 32, 100, 111]}
{"prompt": "The meaning of life is", "id": 42}

{"prompt": "Fortune favours the bold, but it also favours those who read their fortunes carefully: ", "id": "long"}
{"id": "ids-form", "prompt_ids": [10, 32, 32, 45, 45, 32, 77, 97, 114, 107, 32, 84, 119, 97, 105, 110]}
{"prompt": "Caf\u00e9 \u2014 ", "id": "utf8"}
EOF
bounded 300 "$TANDEM" rollout --ckpt "$W/run" --prompts "$W/p.jsonl" --n 4 --max-tokens 48 --temperature 1 --seed 11 $KV \
    >"$W/a.jsonl" 2>"$W/a.log" || { cat "$W/a.log"; fail "rollout"; }
grep -q "rollout: 24 samples" "$W/a.log" || { cat "$W/a.log"; fail "no summary line"; }
$CHECK shape "$W/a.jsonl" --prompts "$W/p.jsonl" --n 4 --ckpt "$CK" --max-tokens 48 --seed 11 --versions 20 ||
    fail "output shape"
# same seed, another batch size and thread count, a file output: the same samples
TANDEM_THREADS=1 bounded 300 "$TANDEM" rollout --ckpt "$CK" --prompts "$W/p.jsonl" --n 4 --max-tokens 48 --seed 11 $KV --max-running 3 \
    --output "$W/b.jsonl" 2>"$W/b.log" || { cat "$W/b.log"; fail "rollout --output"; }
$CHECK same "$W/a.jsonl" "$W/b.jsonl" || fail "same seed, different output"
# the 4 samples of a prompt share its cached blocks: without the prefix
# cache nothing is found cached and the samples are the same
hit=$(sed -n 's/.*prefix cache: \([0-9]*\) of [0-9]* prompt tokens found cached.*/\1/p' "$W/b.log")
[ -n "$hit" ] && [ "$hit" -gt 0 ] || { cat "$W/b.log"; fail "rollout --n 4: no prompt tokens found cached"; }
bounded 300 "$TANDEM" rollout --ckpt "$CK" --prompts "$W/p.jsonl" --n 4 --max-tokens 48 --seed 11 $KV --no-prefix-cache \
    --output "$W/nc.jsonl" 2>"$W/nc.log" || { cat "$W/nc.log"; fail "rollout --no-prefix-cache"; }
grep -q "prefix cache: 0 of 0 prompt tokens" "$W/nc.log" || { cat "$W/nc.log"; fail "--no-prefix-cache: the cache was used"; }
$CHECK same "$W/a.jsonl" "$W/nc.jsonl" || fail "--no-prefix-cache: other samples than with the prefix cache"
ok "rollout --n 4: $hit prompt tokens from the prefix cache; the same samples with --no-prefix-cache"
# top-k / top-p / a stop string: still exact
bounded 300 "$TANDEM" rollout --ckpt "$CK" --prompts "$W/p.jsonl" --n 2 --max-tokens 32 --temperature 0.8 --top-k 40 \
    --top-p 0.95 --stop " " --seed 5 $KV >"$W/c.jsonl" 2>"$W/c.log" || { cat "$W/c.log"; fail "rollout --stop"; }
$CHECK shape "$W/c.jsonl" --prompts "$W/p.jsonl" --n 2 --ckpt "$CK" --max-tokens 32 --seed 5 --stop " " ||
    fail "output shape with --stop"
bounded 300 "$TANDEM" score --rollout "$W/a.jsonl" --ckpt "$CK" --batch 5 >"$W/a.check" || fail "score --rollout"
$CHECK verdict "$W/a.check" --samples 24 || fail "trainer check"
bounded 300 "$TANDEM" score --rollout "$W/c.jsonl" --ckpt "$W/run" >"$W/c.check" || fail "score --rollout (stop)"
$CHECK verdict "$W/c.check" --samples 12 || fail "trainer check (stop)"

# low precision: weights and KV cache in int8, checked by the trainer at
# the same dtypes (exactly 0), and not at float32 (the rounding shows)
"$TANDEM" rollout --ckpt "$CK" --prompts "$W/p.jsonl" --n 2 --max-tokens 32 --seed 7 --dtype int8 --kv-dtype int8 $KV \
    >"$W/q.jsonl" 2>"$W/q.log" || { cat "$W/q.log"; fail "rollout --dtype int8 --kv-dtype int8"; }
"$TANDEM" score --rollout "$W/q.jsonl" --ckpt "$CK" --dtype int8 --kv-dtype int8 >"$W/q.check" || fail "score --rollout --dtype int8"
$CHECK verdict "$W/q.check" --samples 12 || fail "trainer check (int8)"
"$TANDEM" score --rollout "$W/q.jsonl" --ckpt "$CK" >"$W/q32.check" || fail "score --rollout (int8 rollout, f32 check)"
$PY -c "import json,sys; c=json.load(open('$W/q32.check')); sys.exit(0 if c['logprob_diff_max'] > 0 else 1)" ||
    fail "an int8 rollout checked in float32 should differ"
ok "--dtype int8 --kv-dtype int8: the trainer at the same dtypes reproduces it exactly (in float32 it differs by $($PY -c "import json; print(json.load(open('$W/q32.check'))['logprob_diff_max'])"))"

# ---------------------------------------------------------------- 2. bad input
bad() {   # bad NAME LINE_TAG: the prompts file $W/NAME.jsonl must fail naming LINE_TAG
    rc=0
    bounded 120 "$TANDEM" rollout --ckpt "$CK" --prompts "$W/$1.jsonl" --n 2 $KV >"$W/bad.out" 2>"$W/bad.err" || rc=$?
    [ "$rc" -ne 0 ] || fail "$1: exit 0"
    [ ! -s "$W/bad.out" ] || fail "$1: generated something"
    [ "$(wc -l <"$W/bad.err")" -eq 1 ] || { cat "$W/bad.err"; fail "$1: not one error line"; }
    grep -q "error: rollout: .*$2" "$W/bad.err" || { cat "$W/bad.err"; fail "$1: the error does not name $2"; }
    ok "$1: $(cat "$W/bad.err")"
}
printf '{"prompt": "ok"}\n{"prompt": "broken"\n' >"$W/notjson.jsonl"
bad notjson "notjson.jsonl:2:"
printf '{"prompt": "ok"}\n\n{"id": 3}\n' >"$W/noprompt.jsonl"
bad noprompt "noprompt.jsonl:3:"
printf '{"prompt": "ok"}\n{"prompt_ids": [1, 2, 256]}\n' >"$W/range.jsonl"
bad range "range.jsonl:2: prompt token id 256"
printf '{"prompt_ids": [1, -2]}\n' >"$W/negative.jsonl"
bad negative "negative.jsonl:1:"
$PY -c 'import json; print(json.dumps({"prompt": "ok"})); print(json.dumps({"prompt": "x" * 300}))' >"$W/long.jsonl"
bad long "long.jsonl:2: the prompt has 300 tokens"
printf '{"prompt": ""}\n' >"$W/empty.jsonl"
bad empty "empty.jsonl:1: the prompt is empty"
: >"$W/none.jsonl"
bad none "no prompts"
head -c 300 "$W/a.jsonl" >"$W/trunc.jsonl"
rc=0
bounded 300 "$TANDEM" score --rollout "$W/trunc.jsonl" --ckpt "$CK" >/dev/null 2>"$W/bad.err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "trunc.jsonl:1:" "$W/bad.err" || { cat "$W/bad.err"; fail "malformed rollout file"; }
ok "score --rollout on a truncated file: $(cat "$W/bad.err")"

# ---------------------------------------------------------------- 3. --follow
$PY -c '
import json
for i in range(40):
    print(json.dumps({"prompt": "Prompt %d: " % i + "abcdefghij"[: i % 11], "id": "p%d" % i}))
' >"$W/p40.jsonl"
train "$W/run2" steps=10
FOLLOW="$PY tests/ref/rollout_follow.py --timeout 180"
ROLL="env TANDEM_THREADS=1 $TANDEM rollout --prompts $W/p40.jsonl --n 4 --max-tokens 64 --seed 3 $KV --max-running 16"
# the next checkpoint, written by a trainer resuming the run, mid-generation
$FOLLOW --out "$W/f.jsonl" --err "$W/f.log" \
    --during "$TANDEM_TRAIN train configs/tiny.json data=$BUILD/fortunes.bin resume=$W/run2 out_dir=$W/run2 steps=20 save_every=20 >$W/train2.log 2>&1" \
    -- $ROLL --follow "$W/run2" || fail "--follow"
[ -s "$W/run2/step_00000020.h5" ] || fail "the trainer wrote no step 20"
grep -q "policy version 10 -> 20" "$W/f.log" || { cat "$W/f.log"; fail "no swap reported"; }
$CHECK shape "$W/f.jsonl" --prompts "$W/p40.jsonl" --n 4 --ckpt "$W/run2/step_00000020.h5" --max-tokens 64 \
    --seed 3 --versions 10,20 --order || fail "--follow output"
bounded 300 "$TANDEM" score --rollout "$W/f.jsonl" --ckpt "$W/run2" >"$W/f.check" || fail "score --rollout (follow)"
$CHECK verdict "$W/f.check" --samples 160 || fail "trainer check (follow)"
grep -q '"versions":\[10,20\]' "$W/f.check" || fail "the check did not cover both versions"

# a checkpoint that cannot be loaded: a warning, admission held, retried
# until latest names a good one
mkdir "$W/run3"
cp "$W/run2/step_00000010.h5" "$W/run3/"
ln -s step_00000010.h5 "$W/run3/latest"
publish() {   # publish DIR FILE_NAME: atomically point DIR/latest at FILE_NAME
    ln -s "$2" "$1/.latest.new" && mv -T "$1/.latest.new" "$1/latest"
}
$FOLLOW --out "$W/g.jsonl" --err "$W/g.log" \
    --during "head -c 4096 /dev/urandom >$W/run3/step_00000015.h5 && ln -s step_00000015.h5 $W/run3/.latest.new && mv -T $W/run3/.latest.new $W/run3/latest" \
    --wait-stderr "will retry" \
    --then "cp $W/run2/step_00000020.h5 $W/run3/.tmp.h5 && mv $W/run3/.tmp.h5 $W/run3/step_00000020.h5 && ln -s step_00000020.h5 $W/run3/.latest.new && mv -T $W/run3/.latest.new $W/run3/latest" \
    -- $ROLL --follow "$W/run3" || fail "--follow with a bad checkpoint"
$CHECK shape "$W/g.jsonl" --prompts "$W/p40.jsonl" --n 4 --ckpt "$W/run2/step_00000020.h5" --max-tokens 64 \
    --seed 3 --versions 10,20 --order || fail "--follow output after a failed load"
bounded 300 "$TANDEM" score --rollout "$W/g.jsonl" --ckpt "$W/run3" >"$W/g.check" || fail "score --rollout (retry)"
$CHECK verdict "$W/g.check" --samples 160 || fail "trainer check (retry)"

# --follow in int8: each new checkpoint quantized at load as the first was
mkdir "$W/run5"
cp "$W/run2/step_00000010.h5" "$W/run5/"
publish "$W/run5" step_00000010.h5
$FOLLOW --out "$W/k.jsonl" --err "$W/k.log" \
    --during "cp $W/run2/step_00000020.h5 $W/run5/.tmp.h5 && mv $W/run5/.tmp.h5 $W/run5/step_00000020.h5 && ln -s step_00000020.h5 $W/run5/.latest.new && mv -T $W/run5/.latest.new $W/run5/latest" \
    -- $ROLL --dtype int8 --kv-dtype int8 --follow "$W/run5" || fail "--follow --dtype int8"
"$TANDEM" score --rollout "$W/k.jsonl" --ckpt "$W/run5" --dtype int8 --kv-dtype int8 >"$W/k.check" ||
    fail "score --rollout (follow, int8)"
$CHECK verdict "$W/k.check" --samples 160 || fail "trainer check (follow, int8)"
grep -q '"versions":\[10,20\]' "$W/k.check" || fail "the int8 check did not cover both versions"
ok "--follow --dtype int8 --kv-dtype int8: versions 10 and 20, exact"

# a checkpoint of another model: one error line, non-zero exit
bounded 300 "$TANDEM_TRAIN" train configs/tiny.json data="$BUILD/fortunes.bin" out_dir="$W/other" steps=1 \
    model='{"vocab_size":256,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"moe_intermediate_size":32,"num_local_experts":4,"num_experts_per_tok":2,"max_position_embeddings":256}' \
    >"$W/train3.log" 2>&1 || { tail "$W/train3.log"; fail "training another model"; }
mkdir "$W/run4"
cp "$W/run2/step_00000010.h5" "$W/run4/"
publish "$W/run4" step_00000010.h5
$FOLLOW --out "$W/h.jsonl" --err "$W/h.log" --expect-fail \
    --during "cp $W/other/step_00000001.h5 $W/run4/step_00000030.h5 && ln -s step_00000030.h5 $W/run4/.latest.new && mv -T $W/run4/.latest.new $W/run4/latest" \
    -- $ROLL --follow "$W/run4" || fail "--follow onto another model config"
grep -q "another model config" "$W/h.log" || { cat "$W/h.log"; fail "config mismatch not named"; }

# no checkpoint at all
mkdir "$W/empty"
rc=0
bounded 300 "$TANDEM" rollout --follow "$W/empty" --prompts "$W/p.jsonl" --wait-timeout 0.5 >/dev/null 2>"$W/e.log" || rc=$?
[ "$rc" -ne 0 ] && grep -q "error: rollout: no checkpoint appeared in" "$W/e.log" ||
    { cat "$W/e.log"; fail "--follow without a checkpoint"; }
ok "--follow on an empty directory: $(grep error "$W/e.log")"

echo "rollout: all passed in $(($(date +%s) - t0)) s"
