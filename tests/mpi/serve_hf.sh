#!/bin/sh
# tests/mpi/serve_hf.sh - Hugging Face directories served straight from
# their safetensors (no import) by one process and by `mpirun -np 2 tandem
# serve ... tp=2` and `... ep=2`, each rank reading only its slice of each
# tensor (its heads and expert rows under tp, its experts' files under
# ep): the same tokens and log-probabilities (within 1e-5) for greedy and
# seeded requests, several concurrent.  The four families of
# tests/ref/hf_ref.py, in the layouts and dtypes that stress the mapping:
# Qwen3-MoE v5 bf16 in 3 shards (fused gate_up_proj split under tp, per-head
# q/k norms, a dense/MoE schedule), Qwen2-MoE v4 (q/k/v biases split with
# the heads, the gated shared expert split under tp), Mixtral v5 and OLMoE
# v4 bf16 (full-width q/k norms all-reduced over tp, clip_qkv), and
# DeepSeek-V3 and Kimi-K2 in FP8 (MLA's heads split under tp with the
# latent replicated, block-scaled weights sliced per rank, the sigmoid
# group-limited router with its correction bias, an ungated shared expert).
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T=$PWD/bin/tandem
PY=/usr/bin/python3
MPI="mpirun --oversubscribe --allow-run-as-root"
W=$(mktemp -d /tmp/tandem-servehf.XXXXXX)
pids=""
cleanup() { for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done; sleep 1; rm -rf "$W"; }
trap cleanup EXIT
port_of() {   # the port a server's start-up line names, waiting up to 30 s for it
    i=0
    until grep -q "serving.*on http://127.0.0.1:[0-9]" "$1" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 150 ] || { echo "FAIL server did not start within 30 s:" >&2; cat "$1" >&2; return 1; }
        sleep 0.2
    done
    sed -n 's/.*on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1" | head -1
}
$PY - "$W" <<'EOF' || { echo "serve_hf.sh: FAIL: the reference could not build the checkpoints"; exit 1; }
import sys
sys.path.insert(0, "tests/ref")
import hf_ref
w = sys.argv[1]
for fam, lay, dt, sh in (("qwen3_moe", "v5", "bf16", 3), ("qwen2_moe", "v4", "f32", 1),
                         ("mixtral", "v5", "f32", 2), ("olmoe", "v4", "bf16", 1),
                         ("deepseek_v3", "v4", "fp8", 2), ("kimi_k2", "v4", "fp8", 1)):
    hf_ref.make(fam, "%s/%s" % (w, fam), dt, sh, lay, seed=21)
EOF
fail=0
for fam in qwen3_moe qwen2_moe mixtral olmoe deepseek_v3 kimi_k2; do
    D=$W/$fam
    # a log per server and family: a server still stopping never writes into the next one's
    L=$W/$fam
    TANDEM_THREADS=1 "$T" serve --ckpt "$D" --port 0 --quiet >/dev/null 2>"$L.s1.log" &
    pids="$pids $!"
    $MPI -np 2 -x TANDEM_THREADS=1 "$T" serve --ckpt "$D" --port 0 --quiet tp=2 >/dev/null 2>"$L.s2.log" &
    pids="$pids $!"
    $MPI -np 2 -x TANDEM_THREADS=1 "$T" serve --ckpt "$D" --port 0 --quiet ep=2 >/dev/null 2>"$L.s3.log" &
    pids="$pids $!"
    p1=$(port_of "$L.s1.log") && p2=$(port_of "$L.s2.log") && p3=$(port_of "$L.s3.log") || { fail=1; break; }
    if [ -z "$p1" ] || [ -z "$p2" ] || [ -z "$p3" ]; then
        echo "FAIL $fam: a server gave no port:"; cat "$L".s?.log; fail=1; break
    fi
    set +e
    $PY - "$p1" "$p2" "$p3" "$fam" <<'PYEOF'
import json, sys, threading, http.client
ports = sys.argv[1:4]
reqs = [dict(prompt=[84, 104, 101, 32], max_tokens=20, temperature=0, logprobs=2),
        dict(prompt="Q: why", max_tokens=24, temperature=0.9, seed=5, logprobs=1),
        dict(prompt=[72, 101, 108, 108, 111, 250, 280], max_tokens=16, temperature=1.2, top_k=20, seed=9, logprobs=1),
        dict(prompt="x" * 40, max_tokens=12, temperature=0.7, top_p=0.9, seed=1, n=2, logprobs=1)]
def ask(port, body, out, i):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    out[i] = body if r.status == 200 else {"error": body}
results = {}
for port in ports:
    out = [None] * len(reqs)
    th = [threading.Thread(target=ask, args=(port, b, out, i)) for i, b in enumerate(reqs)]
    [t.start() for t in th]
    [t.join(150) for t in th]
    if any(o is None or "error" in o for o in out):
        print("FAIL %s: the server on port %s did not answer every request within 150 s: %s" % (sys.argv[4], port, out))
        sys.exit(1)
    results[port] = out
fail = 0
for label, port in (("tp=2", ports[1]), ("ep=2", ports[2])):
    worst, n = 0.0, 0
    for a, b in zip(results[ports[0]], results[port]):
        for ca, cb in zip(a["choices"], b["choices"]):
            if ca["token_ids"] != cb["token_ids"]:
                print("FAIL %s %s: tokens differ:" % (sys.argv[4], label), ca["token_ids"], cb["token_ids"]); fail = 1
            la, lb = ca["logprobs"]["token_logprobs"], cb["logprobs"]["token_logprobs"]
            worst = max([worst] + [abs(x - y) for x, y in zip(la, lb)])
            n += len(ca["token_ids"])
    ok = worst <= 1e-5 and not fail
    print("%s %s served from its HF directory at %s: %d tokens as one process, logprobs max abs diff %.2e"
          % ("ok  " if ok else "FAIL", sys.argv[4], label, n, worst))
    fail |= not ok
sys.exit(fail)
PYEOF
    rc=$?
    set -e
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 1
    pids=""
    [ $rc -eq 0 ] || fail=1
done
[ $fail -eq 0 ] && echo "serve_hf.sh: all passed" || { echo "serve_hf.sh: FAILED"; exit 1; }
