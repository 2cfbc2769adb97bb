#!/bin/sh
# tests/cli/serve_vision.sh - image requests served (SPEC section 13,
# docs/vision.md): a tiny VLM (a 2-layer MoE language model over the
# byte-level BPE of tests/ref/vlm_tokenizer.py with <image> = id 256, a
# 1-layer vision tower of 32 x 32 pixels in patches of 8: P = 16 tokens per
# image), trained 2 steps on text, served by one `tandem serve`:
#  1. the official OpenAI Node SDK (tests/ref/openai_sdk_vision.js) sends PNG
#     and JPEG images (data: URLs) as content parts, one and two per message,
#     streamed and not; usage counts P tokens per image (/tokenize agrees);
#     another image gives another answer; image and text-only requests sent
#     at once (one batch) answer what they answer alone, bit for bit; bad
#     images raise BadRequestError with the server's message;
#  2. the SDK's image answer equals `tandem generate --image` on the same
#     image, rendered prompt and seed (token ids and log-probabilities);
#  3. curl with garbage: an http URL, a non-image, truncated and corrupt
#     images, too many images, bad JSON in a part, an image to the
#     completions endpoint's placeholder id: each a 400 with one message,
#     and the server answers after each; one model load for all of it.
# Images come from `tandem data images`.  ~10 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
NM=$PWD/build/node_modules
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TANDEM_THREADS=1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-serve-vision.XXXXXX")
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
    echo "serve_vision: FAIL: $*"
    [ -s "$TMP/serve.log" ] && { echo "--- server log (last 20 lines)"; tail -n 20 "$TMP/serve.log"; }
    exit 1
}
ok() { echo "ok   $*"; }
need node curl || exit 1
[ -f "$NM/openai/package.json" ] || fail "npm package openai is missing (./tandem.sh deps installs it)"
. tests/serve_lib.sh

# ---------------------------------------------------------------- the model
$PY tests/ref/vlm_tokenizer.py "$TMP/tok"
"$TANDEM" data prepare --input /usr/share/games/fortunes/computers --tokenizer "$TMP/tok" --output "$TMP/text.bin" \
    >"$TMP/prep.log" 2>&1 || { cat "$TMP/prep.log"; fail "data prepare"; }
cat >"$TMP/vlm.json" <<'EOF'
{
  "model": {
    "vocab_size": 259, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
    "moe_intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "image_token_index": 256,
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
  },
  "seq_len": 64, "micro_batch": 4, "steps": 2, "lr": 3e-3, "warmup_steps": 1,
  "seed": 7, "shuffle": false, "save_every": 0, "eval_every": 0
}
EOF
bounded 120 "$TANDEM" train "$TMP/vlm.json" data="$TMP/text.bin" out_dir="$TMP/run" >"$TMP/train.log" 2>&1 ||
    { tail -n 5 "$TMP/train.log"; fail "training the tiny VLM"; }
CK=$TMP/run/latest
P=16
bounded 60 "$TANDEM" data images --output "$TMP/img" --n 4 --seed 1 2>/dev/null || fail "data images"
# image B as a JPEG: the same pixels through another codec (PIL writes it)
$PY -c 'import sys; from PIL import Image; Image.open(sys.argv[1]).save(sys.argv[2], quality=90)' \
    "$TMP/img/img_000001.png" "$TMP/b.jpg"

start_server "$CK" --max-body 1048576
URL=http://127.0.0.1:$port

# ---------------------------------------------------------------- 1. the SDK
NODE_PATH=$NM bounded 300 node tests/ref/openai_sdk_vision.js "$URL" tandem "$P" "$TMP/img/img_000000.png" "$TMP/b.jpg" \
    "$TMP/sdk.json" || fail "the OpenAI SDK image requests"

# ---------------------------------------------------------------- 2. = generate --image
$PY - "$TMP/sdk.json" "$TMP/tok" >"$TMP/msgs.json" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))["a"]
# the flattened message the server renders: "<image>\n" + the question
q = [p["text"] for p in a["messages"][0]["content"] if p["type"] == "text"][0]
print(json.dumps([{"role": "user", "content": "<image>\n" + q}]))
EOF
"$TANDEM" tokenize --tokenizer "$CK" --chat "$TMP/msgs.json" --add-generation-prompt >"$TMP/rendered.json" ||
    fail "tokenize --chat"
ids=$($PY -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$TMP/rendered.json")
bounded 120 "$TANDEM" generate --ckpt "$CK" --image "$TMP/img/img_000000.png" --prompt-ids "$ids" --max-tokens 8 \
    --temperature 0.9 --seed 3 --json >"$TMP/gen.json" 2>"$TMP/gen.log" || { cat "$TMP/gen.log"; fail "generate --image"; }
$PY - "$TMP/sdk.json" "$TMP/gen.json" <<'EOF' || fail "serve vs generate --image"
import json, struct, sys
a = json.load(open(sys.argv[1]))["a"]
g = json.load(open(sys.argv[2]))
assert g["ids"] == a["token_ids"], "generate --image %s, the server %s" % (g["ids"], a["token_ids"])
gl = g.get("logprobs")
assert gl is not None and len(gl) == len(a["logprobs"]), "generate --image gave no logprobs"
bits = lambda v: [struct.pack("<f", x) for x in v]
assert bits(gl) == bits(a["logprobs"]), "log-probabilities differ: %s vs %s" % (gl, a["logprobs"])
print("ok   the served image answer equals tandem generate --image (same image, prompt and seed): %d token ids and "
      "their log-probabilities, bit for bit" % len(g["ids"]))
EOF

# ---------------------------------------------------------------- 3. curl garbage
post() {   # post BODY_FILE -> HTTP status in $code, body in $TMP/resp
    code=$(curl -s --max-time 30 -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$1" "$URL${2:-/v1/chat/completions}")
}
expect_400() {   # expect_400 WHAT WORDS BODY [PATH]
    printf '%s' "$3" >"$TMP/body.json"
    post "$TMP/body.json" "${4:-}"
    [ "$code" = 400 ] || fail "$1: HTTP $code ($(head -c 300 "$TMP/resp"))"
    msg=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$TMP/resp")
    case $msg in *"$2"*) ;; *) fail "$1: message '$msg' lacks '$2'" ;; esac
    curl -sf --max-time 10 "$URL/health" >/dev/null || fail "$1: the server is down afterwards"
    ok "$1: 400 $msg"
}
part() { printf '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "%s"}}]}], "max_tokens": 2}' "$1"; }
b64() { base64 -w0 "$1"; }
# the first half of a PNG; one byte of its compressed data flipped (its CRC then fails)
$PY -c 'import sys; b = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(b[:len(b) // 2])' \
    "$TMP/img/img_000000.png" "$TMP/trunc.png"
$PY -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); i = b.index(b"IDAT") + 8; b[i] ^= 0xff; open(sys.argv[2], "wb").write(b)' \
    "$TMP/img/img_000000.png" "$TMP/corrupt.png"
expect_400 "an http URL" "only data: URLs are accepted" "$(part http://127.0.0.1:9/cat.png)"
expect_400 "an https URL" "does not fetch https: URLs" "$(part https://example.com/cat.png)"
expect_400 "garbage base64" "invalid character" "$(part 'data:image/png;base64,%%%%')"
expect_400 "a text file as PNG" "not a PNG or JPEG image" "$(part "data:image/png;base64,$(printf 'plain text' | base64 -w0)")"
expect_400 "a truncated PNG" "truncated PNG" "$(part "data:image/png;base64,$(b64 "$TMP/trunc.png")")"
expect_400 "a corrupt PNG" "corrupt PNG" "$(part "data:image/png;base64,$(b64 "$TMP/corrupt.png")")"
expect_400 "a GIF media type" "only image/png and image/jpeg" "$(part 'data:image/gif;base64,R0lGODlhAQABAAAAACw=')"
expect_400 "an image_url without url" "an image_url part needs" \
    '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"href": "x"}}]}]}'
expect_400 "the placeholder typed as text" "but no image" \
    '{"messages": [{"role": "user", "content": "look: <image>"}], "max_tokens": 2}'
expect_400 "the placeholder in a completions prompt" "the image placeholder" \
    '{"prompt": "look: <image>", "max_tokens": 2}' /v1/completions
img=$(b64 "$TMP/img/img_000002.png")
many=$($PY -c 'import json,sys; u = "data:image/png;base64," + sys.argv[1]; print(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}] * 17}]}))' "$img")
expect_400 "17 images" "at most 16 per request" "$many"
printf '%s' "$(part "data:image/png;base64,$img")" >"$TMP/good.json"
post "$TMP/good.json"
[ "$code" = 200 ] || fail "a good image request after the bad ones: HTTP $code"
loads=$(grep -c 'serving .* on http' "$TMP/serve.log")
[ "$loads" -eq 1 ] || fail "$loads model loads in the log"
ok "the server answers after every bad request; one model load served text and images"
stop_server
echo "serve_vision: all passed"
