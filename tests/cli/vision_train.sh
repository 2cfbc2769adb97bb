#!/bin/sh
# tests/cli/vision_train.sh - the vision demo's pipeline, tiny
# (docs/vision.md, "Training"): `tandem data images` -> `tandem train` with
# images= (image rows mixed with fortunes text) -> `tandem eval-vision`
# and `tandem generate --image` on held-out images.  The tiny VLM must
# name the colour of held-out images far above chance (1 in 7), which
# (measured: 29/30 after 500 steps) needs the answers' gradient to reach the tower through the image rows;
# generate --image, given the prompt eval-vision builds, answers what
# eval-vision counted.  Bad image sets are refused with one line each.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
T=${TANDEM:-bin/tandem}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-vision-train-test.XXXXXX)
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

DATA=$BUILD/fortunes.bin
[ -s "$DATA" ] || "$T" data prepare --input /usr/share/games/fortunes --output "$DATA" >/dev/null 2>&1
bounded 60 "$T" data images --output "$W/train" --n 400 --seed 1 2>/dev/null
bounded 60 "$T" data images --output "$W/held" --n 30 --seed 2 2>/dev/null
cat >"$W/vlm.json" <<JSON
{
  "model": {
    "vocab_size": 257, "hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
    "intermediate_size": 96, "first_k_dense_replace": 1,
    "max_position_embeddings": 64, "image_token_index": 256,
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 16, "patch_size": 4}
  },
  "data": "$DATA", "images": "$W/train", "image_fraction": 0.75,
  "seq_len": 56, "micro_batch": 16, "steps": 500, "lr": 5e-3, "min_lr": 1e-3, "warmup_steps": 20,
  "weight_decay": 0, "seed": 1, "out_dir": "$W/run", "save_every": 0, "eval_every": 0, "threads": 1
}
JSON
if bounded 120 "$T" train "$W/vlm.json" >"$W/train.log" 2>&1; then
    ok "train with images: $(grep -o '[0-9]* image examples ([0-9]* images)[^,]*, [0-9]* of [0-9]* rows' "$W/train.log")"
else
    cat "$W/train.log"; bad "train with images"
fi
bounded 60 "$T" eval-vision --ckpt "$W/run" --images "$W/held" --show 1000 >"$W/eval.txt" 2>"$W/eval.err" ||
    { cat "$W/eval.err"; bad "eval-vision"; }
# colour accuracy on held-out images, and one answer through generate --image
$PY - "$W" "$T" <<'PYEOF' || fail=1
import json, subprocess, sys
w, tandem = sys.argv[1], sys.argv[2]
lines = open(w + "/eval.txt").read().splitlines()
col = [l for l in lines if l.startswith(("ok", "MISS")) and "What color is the shape?" in l]
right = sum(l.startswith("ok") for l in col)
good = len(col) == 30 and right >= 18
print(("ok   " if good else "FAIL ") + "colour of held-out images: %d/%d right (chance 1 in 7; want >= 18)" % (right, len(col)))
img = col[0].split()[1]
got = col[0].split('-> "', 1)[1].rsplit('" (want', 1)[0]
ids = [256] + list(b"What color is the shape?\n")   # the placeholder, expanded to the image's 16 tokens
out = subprocess.run([tandem, "generate", "--ckpt", w + "/run", "--prompt-ids", ",".join(map(str, ids)),
                      "--image", "%s/held/%s" % (w, img), "--max-tokens", "24", "--temperature", "0",
                      "--stop", "\n", "--json"], capture_output=True, text=True, timeout=60)
text = json.loads(out.stdout)["text"] if out.returncode == 0 else None
same = text == got
print(("ok   " if same else "FAIL ") + "generate --image answers %r about %s, as eval-vision counted (%r)" % (text, img, got))
sys.exit(0 if good and same else 1)
PYEOF

# bad image sets: one line each, nothing trained
B="$W/vlm.json steps=1 out_dir=$W/bad"
expect_fail "a missing image directory" "nope: No such file" "$T" train $B images="$W/nope"
mkdir "$W/empty"
expect_fail "a directory without shapes.jsonl" "cannot open $W/empty/shapes.jsonl" "$T" train $B images="$W/empty"
printf '{"image": "img_000000.png", "prompt": "Q?", "answer": "a"}\nnot json\n' >"$W/train/bad1.jsonl"
expect_fail "a line that is not JSON" "bad1.jsonl:2: not a JSON object" "$T" train $B images="$W/train/bad1.jsonl"
printf '{"image": "img_000000.png", "prompt": "Q?"}\n' >"$W/train/bad2.jsonl"
expect_fail "a line without an answer" 'bad2.jsonl:1: want the non-empty strings' "$T" train $B images="$W/train/bad2.jsonl"
printf '{"image": "gone.png", "prompt": "Q?", "answer": "a"}\n' >"$W/train/bad3.jsonl"
expect_fail "a missing image file" "bad3.jsonl:1: .*gone.png: cannot open" "$T" train $B images="$W/train/bad3.jsonl"
printf '{"image": "../x.png", "prompt": "Q?", "answer": "a"}\n' >"$W/train/bad4.jsonl"
expect_fail "an image outside the directory" 'must be a path inside' "$T" train $B images="$W/train/bad4.jsonl"
printf '{"image": "shapes.jsonl", "prompt": "Q?", "answer": "a"}\n' >"$W/train/bad5.jsonl"
expect_fail "an image file that is no image" "not a PNG or JPEG" "$T" train $B images="$W/train/bad5.jsonl"
expect_fail "an example longer than seq_len + 1" "needs [0-9]* tokens .* more than seq_len + 1 = 41" \
    "$T" train $B seq_len=40
expect_fail "image_fraction 0" "gives no image rows" "$T" train $B image_fraction=0
expect_fail "images for a model without a tower" "no vision tower" \
    "$T" train configs/tiny.json data="$DATA" images="$W/train" steps=1 out_dir="$W/bad"
expect_fail "eval-vision on a bad set" "eval-vision: .*bad2.jsonl:1" "$T" eval-vision --ckpt "$W/run" --images "$W/train/bad2.jsonl"
[ ! -e "$W/bad/latest" ] && ok "no refused run saved a checkpoint" || bad "a refused run saved a checkpoint"
exit $fail
