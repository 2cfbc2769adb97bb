#!/bin/sh
# tests/cli/limits.sh - what every entry point refuses, with one line (or
# HTTP 400), and what no fixed limit drops any more (issue 12).
#
#  1. A model of vocab_size 64, so that the bytes of a text prompt fall
#     outside it: serve (a text prompt and an id prompt; the server stays
#     up and answers the next request), generate (--prompt, --prompt-ids),
#     rollout and rl (a prompts file, the built-in prompts) refuse the
#     prompt naming the token and the vocabulary size.  They used to embed
#     it, reading past the table.
#  2. The KV cache (serve --kv-mb 1: 2048 positions, context 4096): a
#     request whose prompt + max_tokens needs 2049 positions is refused
#     (400, param max_tokens, naming both sizes); one that needs exactly
#     2048 runs to its end; rollout refuses the same before generating.
#     A prompt longer than the whole cache is refused (param prompt, its
#     length and the cache's).  serve --max-context 100: a 100-token
#     prompt and 90 + 11 tokens are refused naming both numbers, 90 + 10
#     run; --max-context above max_position_embeddings is refused at
#     start-up (no rope_scaling: positions past it would be wrong).
#  3. data prepare with 1000 --input files, and with --input=F repeated
#     1000 times: every byte of every file is in the token file (the 65th
#     value was dropped, or written past the parser's table).
#  4. serve --model-name of 300 bytes: /v1/models names it whole.
#  5. an rl prompt id over 63 bytes, a dataset name longer than any of
#     tandem's (ckpt verify / info): refused with one line, no longer cut
#     or skipped.
# Every wait is bounded and fails with a line naming what it waited for.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=${TANDEM:-$PWD/bin/tandem}
PY=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE TANDEM_THREADS=${TANDEM_THREADS:-1}
W=$(mktemp -d "${TMPDIR:-/tmp}/tandem-limits.XXXXXX")
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -rf "$W"
}
trap cleanup EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }

# expect_fail DESCRIPTION PATTERN CMD...: non-zero exit, one stderr line matching PATTERN, nothing on stdout
expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    [ -s "$W/out" ] && { bad "$desc: wrote to stdout"; return; }
    ok "$desc: $(cat "$W/err")"
}

# ---------------------------------------------------------------- a vocab_size 64 model
$PY - "$W/d64.bin" <<'EOF'
import random, struct, sys
random.seed(1)
n = 20000
toks = bytes(random.randrange(64) for _ in range(n))
hdr = b"TNDMTOK1" + struct.pack("<IIQQI", 1, 1, n, 0, 64) + b"\0" * 28
open(sys.argv[1], "wb").write(hdr + toks)
EOF
M64='{"vocab_size":64,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":4,"moe_intermediate_size":64,"num_local_experts":4,"num_experts_per_tok":2,"max_position_embeddings":4096}'
"$T" train configs/tiny.json data="$W/d64.bin" steps=3 out_dir="$W/m64" "model=$M64" >"$W/train.log" 2>&1 ||
    { cat "$W/train.log"; bad "training the vocab 64 model"; exit 1; }

# ---------------------------------------------------------------- 1. ids outside the vocabulary
expect_fail "generate --prompt, vocab 64" "prompt token id 122 at position 0 is outside the vocabulary (vocab_size 64)" \
    "$T" generate --ckpt "$W/m64" --prompt "zzz" --max-tokens 4
expect_fail "generate --prompt of byte 0xff" "prompt token id 255 at position 1 is outside the vocabulary (vocab_size 64)" \
    "$T" generate --ckpt "$W/m64" --prompt "$(printf '\001\377')" --max-tokens 4
expect_fail "generate --prompt-ids 1,2,64" "prompt token id 64 at position 2 is outside the vocabulary (vocab_size 64)" \
    "$T" generate --ckpt "$W/m64" --prompt-ids 1,2,64 --max-tokens 4
"$T" generate --ckpt "$W/m64" --prompt-ids 0,63,5 --max-tokens 4 --json >"$W/g.json" 2>"$W/err" &&
    $PY -c 'import json,sys; o=json.load(open(sys.argv[1])); assert len(o["ids"]) == 4 and max(o["ids"]) < 64' "$W/g.json" &&
    ok "generate --prompt-ids 0,63,5: 4 tokens, all in the vocabulary" || { cat "$W/err"; bad "generate in-vocabulary ids"; }
printf '{"prompt_ids": [1, 2]}\n{"prompt": "hello"}\n' >"$W/p.jsonl"
expect_fail "rollout, a text prompt" "p.jsonl:2: prompt token id 104 at position 0 is outside the vocabulary (vocab_size 64)" \
    "$T" rollout --ckpt "$W/m64" --prompts "$W/p.jsonl" --kv-mb 1
expect_fail "rl, a prompts file" "line 2: prompt token id 104 at position 0 is outside the vocabulary (vocab_size 64)" \
    "$T" rl configs/rl_vowels.json "model=$M64" out_dir="$W/rl1" steps=1 prompts="$W/p.jsonl" prompts_per_step=2
expect_fail "rl, the built-in prompts" "built-in vowels prompts are text, byte tokens up to 121, outside the model's vocabulary (vocab_size 64)" \
    "$T" rl configs/rl_vowels.json "model=$M64" out_dir="$W/rl2" steps=1

# ---------------------------------------------------------------- serve
NAME=$($PY -c 'print("m" * 300)')
"$T" serve --ckpt "$W/m64" --port 0 --kv-mb 1 --max-running 4 --model-name "$NAME" 2>"$W/serve.log" &
pid=$!
port=""
i=0
while [ -z "$port" ]; do
    kill -0 "$pid" 2>/dev/null || { cat "$W/serve.log"; bad "the server exited at start"; exit 1; }
    [ $i -lt 300 ] || { cat "$W/serve.log"; bad "no start-up line from serve within 30 s"; exit 1; }
    port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$W/serve.log" 2>/dev/null) || port=""   # the log may not exist yet
    i=$((i + 1))
    [ -n "$port" ] || sleep 0.1
done
$PY - "$port" "$NAME" <<'EOF' || fail=1
import http.client, json, sys
port, name = int(sys.argv[1]), sys.argv[2]

def post(body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)

bad = 0
def check(cond, what):
    global bad
    print(("ok   " if cond else "FAIL ") + what)
    bad |= not cond

# 1. ids outside the vocabulary, as text and as ids; the server stays up
for prompt, want in (("zzz", "prompt token id 122 at position 0"), ([1, 2, 70], "prompt token id 70 at position 2"),
                     (["ab", [3, 64]], "prompt token id 97 at position 0")):
    st, o = post({"prompt": prompt, "max_tokens": 3})
    e = o.get("error", {})
    check(st == 400 and e.get("param") == "prompt" and want in e.get("message", "")
          and "vocab_size 64" in e.get("message", ""),
          "serve, prompt %r: %d %s" % (prompt, st, e.get("message")))
st, o = post({"prompt": [0, 63, 7], "max_tokens": 3, "seed": 1})
check(st == 200 and len(o["choices"][0]["token_ids"]) == 3, "serve answers a valid prompt after the refusals")

# 2. the whole KV cache: 2048 positions (the last sampled token is never cached)
st, o = post({"prompt": [1] * 10, "max_tokens": 2040})
e = o.get("error", {})
m = e.get("message", "")
check(st == 400 and e.get("param") == "max_tokens" and "needs 2049 positions" in m and "holds 2048" in m,
      "serve: 10 + 2040 tokens in a 2048-position cache: %d %s" % (st, m))
st, o = post({"prompt": [1] * 10, "max_tokens": 2039, "temperature": 0}, timeout=600)
ch = o["choices"][0] if st == 200 else {}
check(st == 200 and ch.get("finish_reason") == "length" and len(ch.get("token_ids", [])) == 2039,
      "serve: 10 + 2039 tokens (exactly the cache) run to their end: %d %s" % (st, ch.get("finish_reason")))
# a prompt the whole cache cannot hold: param prompt, its length and the cache's
st, o = post({"prompt": [1] * 3000, "max_tokens": 1})
e = o.get("error", {})
m = e.get("message", "")
check(st == 400 and e.get("param") == "prompt" and "the prompt has 3000 tokens" in m and "holds 2048 positions" in m
      and "--kv-mb" in m, "serve: a 3000-token prompt in a 2048-position cache: %d %s" % (st, m))

# 4. a long model name, whole
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request("GET", "/v1/models")
ids = [m["id"] for m in json.loads(c.getresponse().read())["data"]]
check(ids == [name], "serve --model-name of %d bytes: /v1/models has it whole" % len(name))
sys.exit(bad)
EOF
kill -TERM "$pid"
i=0
while kill -0 "$pid" 2>/dev/null; do
    [ $i -lt 200 ] || { bad "serve still running 20 s after SIGTERM"; break; }
    i=$((i + 1))
    sleep 0.1
done
rc=0
wait "$pid" || rc=$?
pid=""
[ "$rc" -eq 0 ] && ok "serve: exit 0 after SIGTERM" || bad "serve exit code $rc"

# serve --max-context (SPEC 12): 100 positions of the model's 4096; above
# max_position_embeddings (no rope_scaling) it is refused at start-up
expect_fail "serve --max-context above max_position_embeddings" \
    "max-context 5000 exceeds the model's max_position_embeddings 4096.*rope_scaling" \
    "$T" serve --ckpt "$W/m64" --port 0 --max-context 5000
"$T" serve --ckpt "$W/m64" --port 0 --kv-mb 1 --max-context 100 2>"$W/serve_ctx.log" &
pid=$!
port=""
i=0
while [ -z "$port" ]; do
    kill -0 "$pid" 2>/dev/null || { cat "$W/serve_ctx.log"; bad "the server exited at start"; exit 1; }
    [ $i -lt 300 ] || { cat "$W/serve_ctx.log"; bad "no start-up line from serve within 30 s"; exit 1; }
    port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$W/serve_ctx.log" 2>/dev/null) || port=""
    i=$((i + 1))
    [ -n "$port" ] || sleep 0.1
done
grep -q "context 100," "$W/serve_ctx.log" && ok "serve --max-context 100: the start-up line says context 100" ||
    bad "serve --max-context 100: start-up line: $(head -n 1 "$W/serve_ctx.log")"
$PY - "$port" <<'EOF' || fail=1
import http.client, json, sys
port = int(sys.argv[1])

def req(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)

bad = 0
def check(cond, what):
    global bad
    print(("ok   " if cond else "FAIL ") + what)
    bad |= not cond

st, o = req("POST", "/v1/completions", {"prompt": [1] * 100, "max_tokens": 1})
e = o.get("error", {})
m = e.get("message", "")
check(st == 400 and e.get("param") == "prompt" and "the prompt has 100 tokens" in m and "--max-context of 100" in m,
      "serve --max-context 100, a 100-token prompt: %d %s" % (st, m))
st, o = req("POST", "/v1/completions", {"prompt": [1] * 90, "max_tokens": 11})
e = o.get("error", {})
m = e.get("message", "")
check(st == 400 and e.get("param") == "max_tokens" and "(90 tokens) plus max_tokens (11)" in m
      and "--max-context of 100" in m, "serve --max-context 100, 90 + 11 tokens: %d %s" % (st, m))
st, o = req("POST", "/v1/completions", {"prompt": [1] * 90, "max_tokens": 10, "temperature": 0})
ch = o["choices"][0] if st == 200 else {}
check(st == 200 and len(ch.get("token_ids", [])) == 10, "serve --max-context 100, 90 + 10 tokens run: %d" % st)
st, o = req("GET", "/v1/models")
check(st == 200 and o["data"][0].get("max_model_len") == 100, "/v1/models max_model_len 100: %s" % o["data"][0])
sys.exit(bad)
EOF
kill -TERM "$pid"
wait "$pid" || true
pid=""

# rollout refuses what cannot fit the cache, before generating anything
printf '{"prompt_ids": [1, 2, 3]}\n' >"$W/p3.jsonl"
expect_fail "rollout: prompt + --max-tokens beyond the cache" "needs 3002 positions of KV cache; the whole cache holds 2048.*raise --kv-mb" \
    "$T" rollout --ckpt "$W/m64" --prompts "$W/p3.jsonl" --kv-mb 1 --max-tokens 3000

# ---------------------------------------------------------------- 3. a thousand --input values
mkdir "$W/in"
$PY - "$W/in" <<'EOF'
import os, sys
for i in range(1000):
    open(os.path.join(sys.argv[1], "f%04d" % i), "wb").write(b"x" * (1 + i % 7))
EOF
want=$($PY -c 'print(sum(1 + i % 7 for i in range(1000)))')
count() { $PY -c 'import struct,sys; print(struct.unpack("<Q", open(sys.argv[1], "rb").read()[16:24])[0])' "$1"; }
# shellcheck disable=SC2046
"$T" data prepare --input $(ls -d "$W"/in/f*) --output "$W/a.bin" --val-fraction 0 2>"$W/err" || { cat "$W/err"; bad "prepare 1000 inputs"; }
[ "$(count "$W/a.bin")" = "$want" ] && ok "data prepare --input F1 ... F1000: all $want bytes" ||
    bad "data prepare --input F1 ... F1000: $(count "$W/a.bin") tokens, want $want"
# shellcheck disable=SC2046
"$T" data prepare $(for f in "$W"/in/f*; do printf -- '--input=%s ' "$f"; done) --output "$W/b.bin" --val-fraction 0 \
    2>"$W/err" || { cat "$W/err"; bad "prepare --input=F x 1000"; }
[ "$(count "$W/b.bin")" = "$want" ] && ok "data prepare --input=F repeated 1000 times: all $want bytes" ||
    bad "data prepare --input=F x 1000: $(count "$W/b.bin") tokens, want $want"

# ---------------------------------------------------------------- 5. names that do not fit are refused, not cut
ID=$($PY -c 'print("i" * 100)')
printf '{"prompt_ids": [1, 2], "id": "%s"}\n' "$ID" >"$W/pid.jsonl"
expect_fail "rl: a prompt id of 100 bytes" 'line 1: "id" is longer than 63 bytes' \
    "$T" rl configs/rl_vowels.json "model=$M64" out_dir="$W/rl3" steps=1 prompts="$W/pid.jsonl" prompts_per_step=1
# a dataset whose name is longer than any of tandem's: verify and info say so
# (they used to skip it without a word)
cp "$W/m64/step_00000003.h5" "$W/long.h5"
$PY - "$W/long.h5" <<'EOF'
import h5py, sys
with h5py.File(sys.argv[1], "a") as f:
    f.create_dataset("extra/" + "n" * 200, data=[1.0, 2.0])
EOF
expect_fail "ckpt verify: a dataset name of 206 bytes" "has a name of 160 bytes or more" "$T" ckpt verify "$W/long.h5"
expect_fail "ckpt info: a dataset name of 206 bytes" "has a name of 160 bytes or more" "$T" ckpt info "$W/long.h5"

[ $fail -eq 0 ] && echo "limits: all passed" || echo "limits: FAILED"
exit $fail
