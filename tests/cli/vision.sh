#!/bin/sh
# tests/cli/vision.sh - `tandem generate --image` (docs/vision.md): a VLM
# checkpoint (trained a few steps on text: its tower and projector saved
# and loaded with the rest) answers with an image: the prompt's one
# placeholder id expanded to the image's 16 tokens, or the image put first
# when the prompt has none; another image gives other log-probabilities,
# the same image the same bits; a missing file, an image for a text-only
# model and placeholders that do not match the images are refused with one
# line.  ~10 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
T=${TANDEM:-bin/tandem}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-vision-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }

expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

[ -f "$BUILD/fortunes.bin" ] ||
    "$T" data prepare --input /usr/share/games/fortunes --output "$BUILD/fortunes.bin" >/dev/null
cat >"$W/vlm.json" <<JSON
{
  "model": {
    "vocab_size": 257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "moe_intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 128, "image_token_index": 256,
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
  },
  "data": "$BUILD/fortunes.bin", "seq_len": 32, "micro_batch": 4, "steps": 3, "lr": 1e-3,
  "warmup_steps": 1, "seed": 1, "out_dir": "$W/run", "save_every": 0, "eval_every": 0
}
JSON
bounded 120 "$T" train "$W/vlm.json" >"$W/train.log" 2>&1 || { cat "$W/train.log"; echo "FAIL train"; exit 1; }
bounded 60 "$T" data images --output "$W/img" --n 2 --seed 3 2>/dev/null
gen() { bounded 60 "$T" generate --ckpt "$W/run" --max-tokens 3 --temperature 0 --ignore-eos --json "$@"; }
gen --prompt-ids 72,256,105 --image "$W/img/img_000000.png" >"$W/a.json" 2>"$W/a.err" || { cat "$W/a.err"; bad "generate --image"; }
gen --prompt-ids 72,105 --image "$W/img/img_000000.png" >"$W/first.json" 2>/dev/null || bad "generate --image, no placeholder"
gen --prompt-ids 72,256,105 --image "$W/img/img_000000.png" >"$W/a2.json" 2>/dev/null || bad "generate --image again"
gen --prompt-ids 72,256,105 --image "$W/img/img_000001.png" >"$W/b.json" 2>/dev/null || bad "generate, another image"
$PY - "$W" <<'PYEOF' || fail=1
import json, sys
w = sys.argv[1]
a, first, a2, b = (json.load(open("%s/%s.json" % (w, n))) for n in ("a", "first", "a2", "b"))
ok = True
def check(cond, what):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok = ok and cond
check(a["prompt_ids"] == [72] + [256] * 16 + [105], "the placeholder expanded to the image's 16 tokens in place")
check(first["prompt_ids"] == [256] * 16 + [72, 105], "no placeholder: the image's tokens first")
check(len(a["logprobs"]) == 3 and a == a2 | {"ttft_ms": a["ttft_ms"], "tokens_per_s": a["tokens_per_s"]},
      "the same image twice: the same tokens and log-probabilities")
check(a["logprobs"] != b["logprobs"], "another image: other log-probabilities")
sys.exit(0 if ok else 1)
PYEOF
expect_fail "a missing image file" "nope.png: cannot open" "$T" generate --ckpt "$W/run" --prompt-ids 256,1 --image "$W/nope.png"
printf 'not an image' >"$W/junk.png"
expect_fail "a file that is not an image" "junk.png" "$T" generate --ckpt "$W/run" --prompt-ids 256,1 --image "$W/junk.png"
expect_fail "two placeholders, one image" "image placeholder" \
    "$T" generate --ckpt "$W/run" --prompt-ids 256,1,256 --image "$W/img/img_000000.png"
bounded 120 "$T" train configs/tiny.json data="$BUILD/fortunes.bin" steps=1 out_dir="$W/text" >/dev/null 2>&1 ||
    bad "train a text model"
expect_fail "an image for a text-only model" "no vision tower" \
    "$T" generate --ckpt "$W/text" --prompt-ids 1,2 --image "$W/img/img_000000.png"
exit $fail
