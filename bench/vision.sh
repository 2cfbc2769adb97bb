#!/bin/sh
# bench/vision.sh - the image path (docs/vision.md) on a small VLM scaled to
# this machine (a 2-layer MoE language model, d 256, over the byte-level BPE
# of tests/ref/vlm_tokenizer.py; a 4-layer vision tower, 192 wide, 3 heads,
# 64 x 64 images in patches of 8: P = 64 tokens per image):
#   - images per second: PNG and JPEG decoding (libpng, libjpeg-turbo),
#     resize + normalisation, and the tower + projector
#     (model_vision_encode) one image at a time and 8 at once, 2 threads
#     (build/bench/vision_bench, best of 3 passes over 32 shapes images);
#   - TTFT of an image + text chat request against a text request of the
#     same token count (the image's P placeholders replaced by P characters),
#     `tandem serve --no-prefix-cache`, median of 7 of each, alternated, as
#     the server measures it (submit to first token: the image's encoding
#     at admission included);
#   - VLM training tokens/s: tandem's training step (build/bench/vision_train:
#     the trainer's forward, backward, clipping, AdamW and packing on
#     micro-batches of 8 sequences of 96 tokens, each opening with an
#     image's 64 placeholders) against the same model in PyTorch
#     (bench/torch_vlm.py: bench/torch_train.py's language model and the
#     tower written with torch.nn.functional), 2 threads each, median step
#     after 2 untimed, runs interleaved A B B A.  Target >= 1.3x.  (In
#     process: the functions `tandem train` calls, docs/vision.md.)
# Prints a table and one JSON line {"bench":"vision",...}.  Shared machines
# are noisy: figures here are indicative.
set -eu
cd "$(dirname "$0")/.."
. tests/bounds.sh
BUILD=${BUILD:-build}
T=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
B=$BUILD/bench/vision_bench
VT=$BUILD/bench/vision_train
[ -x "$T" ] || { echo "bench/vision.sh: $T missing (make)"; exit 1; }
[ -x "$B" ] && [ -x "$VT" ] || { echo "bench/vision.sh: $B or $VT missing (make bench builds them)"; exit 1; }
STEPS=${VISION_BENCH_STEPS:-6}
need curl || exit 1
export OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1
W=$(mktemp -d /tmp/tandem-vision-bench.XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$W"' EXIT
P=64
MODEL='{"vocab_size": 259, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "moe_intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
 "max_position_embeddings": 512, "image_token_index": 256,
 "vision_config": {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 3,
                   "image_size": 64, "patch_size": 8}}'
printf '%s\n' "$MODEL" >"$W/model.json"
"$T" data images --output "$W/img" --n 32 --seed 9 2>/dev/null
$PY -c 'import glob, sys
from PIL import Image
for f in sorted(glob.glob(sys.argv[1] + "/img_*.png")):
    Image.open(f).save(f[:-4] + ".jpg", quality=90)' "$W/img"

# ---------------------------------------------------------------- images per second
line=$(bounded 600 "$B" "$W/model.json" "$W"/img/*.png "$W"/img/*.jpg --reps 3 --threads 2)
get() { printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# ---------------------------------------------------------------- TTFT
$PY tests/ref/vlm_tokenizer.py "$W/tok"
"$T" data prepare --input /usr/share/games/fortunes/computers --tokenizer "$W/tok" --output "$W/text.bin" >/dev/null 2>&1
printf '{"model": %s, "seq_len": 64, "micro_batch": 4, "steps": 1, "lr": 1e-3, "warmup_steps": 1, "save_every": 0, "eval_every": 0}\n' \
    "$MODEL" >"$W/run.json"
bounded 300 "$T" train "$W/run.json" data="$W/text.bin" out_dir="$W/run" >/dev/null 2>&1 || { echo "FAIL train"; exit 1; }
: >"$W/serve.log"
TANDEM_THREADS=2 "$T" serve --ckpt "$W/run/latest" --port 0 --kv-mb 32 --no-prefix-cache --max-body 1048576 \
    2>>"$W/serve.log" >/dev/null &
pid=$!
wait_until 60 "serve start-up line" grep -q 'serving .* on http' "$W/serve.log" || exit 1
port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$W/serve.log")
$PY - "$port" "$W/img/img_000000.png" "$P" "$W/ttft.json" <<'PYEOF'
import base64, json, sys, urllib.request
port, img, P, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
url = "http://127.0.0.1:%s/v1/chat/completions" % port
b64 = base64.b64encode(open(img, "rb").read()).decode()
q = "What color is the shape?"
image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
                                                   {"type": "text", "text": q}]}], "max_tokens": 1, "temperature": 0}
# "<image>\n" + q takes P + 1 tokens before q; P + 1 characters are P + 1 byte tokens
text = {"messages": [{"role": "user", "content": "x" * P + "\n" + q}], "max_tokens": 1, "temperature": 0}
def post(body):
    r = urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=120)
    return json.load(r)
a, b = post(image), post(text)
assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"], (a["usage"], b["usage"])
for i in range(7):
    post(image), post(text)
json.dump({"prompt_tokens": a["usage"]["prompt_tokens"]}, open(out, "w"))
PYEOF
kill -TERM $pid; wait $pid || true; pid=""
# the server's per-request lines: "prompt N completion 1 ... ttft X ms"; the first pair is warm-up
ttft() {   # ttft N-th-of-each-pair(1 image, 2 text): median ms over the 7 timed pairs
    grep ' 200 prompt ' "$W/serve.log" | sed -n 's/.* ttft \([0-9.]*\) ms.*/\1/p' | awk -v k="$1" 'NR > 2 && (NR % 2) == (k % 2)' |
        sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
t_img=$(ttft 1)
t_txt=$(ttft 2)

# ---------------------------------------------------------------- training
tps() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p'; }
a1=$(bounded 900 "$VT" "$W/model.json" 8 96 "$STEPS" 2 2 | tps)
b1=$(bounded 900 $PY bench/torch_vlm.py "$W/model.json" 8 96 "$STEPS" 2 2 | tps)
b2=$(bounded 900 $PY bench/torch_vlm.py "$W/model.json" 8 96 "$STEPS" 2 2 | tps)
a2=$(bounded 900 "$VT" "$W/model.json" 8 96 "$STEPS" 2 2 | tps)
$PY - "$line" "$t_img" "$t_txt" "$W/ttft.json" "$(cut -d' ' -f1-3 /proc/loadavg)" "$a1" "$a2" "$b1" "$b2" <<'PYEOF'
import json, sys
kv = dict(x.split("=") for x in sys.argv[1].split()[1:])
f = {k: float(v) for k, v in kv.items()}
ti, tt = float(sys.argv[2]), float(sys.argv[3])
n = json.load(open(sys.argv[4]))["prompt_tokens"]
print("images per second (64 x 64, %d tokens each; 2 threads; best of 3):" % f["tokens_per_image"])
print("  decode PNG %10.0f   decode JPEG %10.0f   resize + normalise %10.0f" % (f["png_per_s"], f["jpeg_per_s"], f["pixels_per_s"]))
print("  vision tower + projector: %.1f one at a time, %.1f in batches of 8" % (f["encode1_per_s"], f["encode8_per_s"]))
print("TTFT (tandem serve, %d prompt tokens, median of 7): image + text %.1f ms, text %.1f ms (%.2fx)" % (n, ti, tt, ti / tt))
a1, a2, b1, b2 = (float(x) for x in sys.argv[6:10])
ta, tb = (a1 + a2) / 2, (b1 + b2) / 2
print("VLM training tok/s (2 threads, 8 x 96 tokens, 64 of them an image's): tandem %.1f (rounds %.1f %.1f), "
      "PyTorch %.1f (%.1f %.1f): %.2fx (target >= 1.3x)" % (ta, a1, a2, tb, b1, b2, ta / tb))
print("load average: %s" % sys.argv[5])
print(json.dumps(dict(bench="vision", images_per_s=f, ttft_ms=dict(image=ti, text=tt, prompt_tokens=n),
                      training=dict(tandem=ta, torch=tb, ratio=round(ta / tb, 3)), load=sys.argv[5])))
PYEOF
