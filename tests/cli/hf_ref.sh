#!/bin/sh
# tests/cli/hf_ref.sh - the PyTorch reference of the Hugging Face families
# (tests/ref/hf_ref.py): its self-check (v4 == v5 layouts, f32 vs its own
# bf16-rounded weights, every family feature matters, gradients against
# central differences, greedy against scoring, Mixtral against
# tests/ref/tandem_ref.py), then its command line end to end, in one Python
# process (torch takes seconds to import): make (sharded, bf16, v5), logprobs
# over `tandem score`'s windows, grads, greedy, and a refused checkpoint.
# Python only; the C reader's side is tests/test_safetensors.c.
set -eu
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-hfref.XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# the self-check and the command-line part are independent processes: the
# self-check runs on the second core meanwhile, its verdict read after
($PY tests/ref/hf_ref.py selfcheck >"$W/self" 2>&1; echo $? >"$W/self.rc") &
selfcheck=$!

printf 'The day a sparse model is released, parse its weights and map every tensor.\n' >"$W/text"
if $PY - "$W" <<'EOF'
import contextlib, io, json, math, os, sys
sys.path.insert(0, "tests/ref")
import hf_ref
from hf import st, families
w = sys.argv[1]
def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = hf_ref.main(list(argv))
    return rc, out.getvalue(), err.getvalue()
def ok(what, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + what + ("  " + detail if detail else ""))
    return cond
good = True
# a sharded bf16 v5 Qwen3-MoE, and 3 windows of 24 of the text
q3 = w + "/q3"
run("make", "--family", "qwen3_moe", "--out", q3, "--dtype", "bf16", "--shards", "3", "--layout", "v5", "--seed", "4")
files = sorted(os.listdir(q3))
good &= ok("make: config.json, generation_config.json, 3 shards, the index",
           files == ["config.json", "generation_config.json"] + st.shard_names(3) + ["model.safetensors.index.json"],
           " ".join(files))
cfg = json.load(open(q3 + "/config.json"))
good &= ok("config.json is v5 and bf16", cfg["dtype"] == "bfloat16" and "rope_parameters" in cfg and "rope_theta" not in cfg)
text = w + "/text"
run("logprobs", q3, "--text", text, "--seq-len", "24", "--out", w + "/lp.json")
_, gout, _ = run("grads", q3, "--text", text, "--seq-len", "24", "--out", w + "/g.safetensors")
_, grout, _ = run("greedy", q3, "--prompt-ids", "84,104,101", "--n", "5")
lp, g, gr = json.load(open(w + "/lp.json")), json.loads(gout), json.loads(grout)
good &= ok("logprobs: 3 windows of 24", len(lp["logprobs"]) == 3 and all(len(r) == 24 for r in lp["logprobs"]))
good &= ok("grads: the loss is the mean -logprob", abs(lp["loss"] - g["loss"]) < 1e-12 and g["tokens"] == 72,
           "%.6f" % g["loss"])
grads = st.load_file(w + "/g.safetensors")
good &= ok("grads: one per HF tensor, by its v5 name",
           set(grads) == {n for n, _ in families.param_shapes(cfg, "v5")} and
           all(math.isfinite(float(v.abs().max())) for v in grads.values()), "%d tensors" % len(grads))
good &= ok("greedy: 5 ids and their logprobs", len(gr["ids"]) == 5 and len(gr["logprobs"]) == 5, str(gr["ids"]))
# --ids rows give the same numbers as the windows
ids = w + "/ids.json"
stream = list(open(text, "rb").read())
json.dump([stream[0:25], stream[24:49]], open(ids, "w"))
_, out, _ = run("logprobs", q3, "--ids", ids)
same = json.loads(out)["logprobs"]
good &= ok("--ids rows == --text windows", max(abs(a - b) for r, s in zip(same, lp["logprobs"]) for a, b in zip(r, s)) < 1e-12)
# refusals: one line on stderr, non-zero
os.remove(q3 + "/model-00002-of-00003.safetensors")
rc, _, err = run("logprobs", q3, "--text", text, "--seq-len", "24")
good &= ok("a missing shard is refused", rc != 0 and err.count("\n") == 1, err.strip())
m = w + "/m"
run("make", "--family", "mixtral", "--out", m)
c = json.load(open(m + "/config.json"))
c["hidden_act"] = "gelu"
json.dump(c, open(m + "/config.json", "w"))
rc, _, err = run("logprobs", m, "--text", text, "--seq-len", "24")
good &= ok("an unsupported config key is refused by name", rc != 0 and "hidden_act" in err, err.strip())
sys.exit(0 if good else 1)
EOF
then pass "command line"; else fail "command line"; fi

wait "$selfcheck" || true
if [ "$(cat "$W/self.rc" 2>/dev/null)" = 0 ]; then pass "selfcheck ($(grep -c ' ok ' "$W/self") checks)"
else fail "selfcheck (exit $(cat "$W/self.rc" 2>/dev/null || echo none))"; grep -v ' ok ' "$W/self" | sed 's/^/     /'; fi

[ "$fails" -eq 0 ] || { echo "hf_ref.sh: $fails failed"; exit 1; }
echo "hf_ref.sh: all passed"
