#!/bin/sh
# tests/cli/swa.sh - sliding-window attention from Hugging Face directories
# (docs/config.md, core/ops/attention.h):
#   - a Mixtral-shaped tiny directory with sliding_window 5 and a
#     Qwen2-MoE one with use_sliding_window, sliding_window 6 and
#     max_window_layers 1 (layer 0 full, the others windowed), scored over
#     windows of 24 tokens: `tandem score` (read directly and through `ckpt
#     import`) within 1e-4 of the float64 PyTorch reference with HF's mask
#     (tests/ref/hf, one Python process), and far from the reference
#     without the window (the window is applied, not ignored);
#   - decode past the window across KV blocks (rollout of 60 tokens, window
#     5, blocks of 16): every sampled token's log-prob is the trainer
#     forward's bit for bit (`score --rollout`: logprob_diff_max 0);
#   - the import keeps the keys: export back to HF gives the same window.
set -eu
cd "$(dirname "$0")/../.."
T=$PWD/bin/tandem
PY=/usr/bin/python3
export TANDEM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x "$T" ] || { echo "swa.sh: $T missing (make)"; exit 1; }
W=$(mktemp -d /tmp/tandem-swa.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

printf 'A sliding window keeps the last few keys: what lies further back is never read again, so the cache is a ring.\n' >"$W/text"
# the directories and the reference logprobs, with and without the window
$PY - "$W" <<'PYEOF' || { echo "swa.sh: FAIL: the reference could not build the directories"; exit 1; }
import contextlib, io, json, sys
sys.path.insert(0, "tests/ref")
import hf_ref
w = sys.argv[1]
def run(*argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert hf_ref.main(list(argv)) == 0, argv
for name, fam, edit in (("mixtral", "mixtral", {"sliding_window": 5}),
                        ("qwen2", "qwen2_moe", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1})):
    d = "%s/%s" % (w, name)
    run("make", "--family", fam, "--out", d, "--seed", "3")
    c = json.load(open(d + "/config.json"))
    run("logprobs", d, "--text", w + "/text", "--seq-len", "24", "--out", d + "/full.json")
    c.update(edit)
    json.dump(c, open(d + "/config.json", "w"), indent=1)
    run("logprobs", d, "--text", w + "/text", "--seq-len", "24", "--out", d + "/ref.json")
PYEOF

for m in mixtral qwen2; do
    d=$W/$m
    $T score --ckpt "$d" --text "$W/text" --seq-len 24 --output "$d/direct.h5" >/dev/null 2>"$W/err" || { fail "score $m"; cat "$W/err"; }
    $T ckpt import "$d" "$d/import.h5" >/dev/null 2>"$W/err" || { fail "import $m"; cat "$W/err"; continue; }
    $T score --ckpt "$d/import.h5" --text "$W/text" --seq-len 24 --output "$d/imported.h5" >/dev/null 2>"$W/err" ||
        { fail "score the import of $m"; cat "$W/err"; }
    if $PY - "$d" <<'PYEOF'; then pass "$m: score (direct and imported) = float64 reference with HF's sliding-window mask"; else fail "$m: scores"; fi
import json, sys
import h5py, numpy as np
d = sys.argv[1]
ref = np.array(json.load(open(d + "/ref.json"))["logprobs"])
full = np.array(json.load(open(d + "/full.json"))["logprobs"])
got = [h5py.File(d + f, "r")["logprobs"][()].astype(np.float64) for f in ("/direct.h5", "/imported.h5")]
e = [float(np.abs(g - ref).max()) for g in got]
off = float(np.abs(got[0] - full).max())
print("     max |logprob - reference| %.2e direct, %.2e imported; %.2e from the reference without the window" % (e[0], e[1], off))
# 1e-4: the tolerance of tests/cli/hf_import.sh (float32 vs float64); the
# window changes the logprobs by far more (checked above 1e-2)
sys.exit(0 if max(e) < 1e-4 and np.array_equal(got[0], got[1]) and off > 1e-2 else 1)
PYEOF
    $T ckpt export "$d/import.h5" "$d/export" --format hf >/dev/null 2>"$W/err" || { fail "export $m"; cat "$W/err"; }
    if $PY - "$d" <<'PYEOF'; then pass "$m: export back to HF keeps the window keys"; else fail "$m: exported config"; fi
import json, sys
d = sys.argv[1]
a, b = json.load(open(d + "/config.json")), json.load(open(d + "/export/config.json"))
keys = ("sliding_window", "use_sliding_window", "max_window_layers")
sys.exit(0 if all(a.get(k) == b.get(k) for k in keys if k in a) else 1)
PYEOF
done

# decode 60 tokens past a window of 5 (blocks of 16): the trainer's forward bits
printf '{"prompt_ids": [84, 104, 101]}\n{"prompt": "ab"}\n' >"$W/p.jsonl"
for m in mixtral qwen2; do
    if $T rollout --ckpt "$W/$m" --prompts "$W/p.jsonl" --n 2 --max-tokens 60 --temperature 1 --seed 5 \
        --output "$W/$m.ro.jsonl" 2>"$W/err" &&
        $T score --rollout "$W/$m.ro.jsonl" --ckpt "$W/$m" >"$W/out" 2>&1 &&
        grep -q '"logprob_diff_max":0,"routing_mismatch":0' "$W/out"; then
        pass "$m: rollout of 60 tokens past the window = score --rollout bit for bit"
    else fail "$m: rollout vs score --rollout"; cat "$W/err" "$W/out"; fi
done
[ "$fails" -eq 0 ] && echo "ok   swa.sh" || { echo "swa.sh: $fails failed"; exit 1; }
