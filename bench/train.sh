#!/bin/sh
# bench/train.sh - end-to-end training throughput next to PyTorch (run by
# bench/run.sh, i.e. `make bench`).
#
# For each config (small, medium) it trains a fixed number of steps with
# `tandem train` and with bench/torch_train.py (the same model, batch and
# AdamW in PyTorch 1.13, Debian's python3-torch, 2 threads,
# OMP_WAIT_POLICY=PASSIVE: PyTorch at its best here) and reports tokens/s of
# both, their ratio, and for both (the FLOP count is tandem's: 6 x active
# params + 6 x L x H x hd x T per token):
#   MFU       model FLOPs per second over the machine's FMA peak, as
#             metrics.jsonl's mfu measures it at the start of each tandem
#             run (core/fma_peak.h: a register-only FMA loop on the run's
#             threads); PyTorch's over the same peak;
#   GEMM eff  over the best GEMM rate measured at start-up: tandem's
#             metrics.jsonl gemm_eff (its kernel or cblas_sgemm on 1024^3),
#             PyTorch's over torch.matmul 1024^3 measured by the script.
# Each number is the median over the steps after the first 3
# (first-touch memory, allocator warm-up), pooled over TRAIN_BENCH_ROUNDS
# rounds.  The runs are interleaved A B B A (tandem, torch, torch, tandem,
# ...) so that a linear drift of the machine's load hits both sides alike;
# the per-round ratios are in the JSON line.  Then a per-op profile of
# tandem on medium: `perf record -g` of a couple of steps of a separate run,
# grouped by op.
#
# Target: tandem >= 1.3x PyTorch's tokens/s on both configs, MFU >= 65% on
# medium.  Shared machines are noisy: trust the ratios measured side by side,
# not absolute numbers across runs; the load average is printed with them.
# A run's peaks are measured once at its start: under a varying load that
# snapshot can be low and the figures flattering, so the table also gives
# MFU against the best FMA peak measured anywhere in the bench (the
# machine's quiet-moment figure), and the ratio of the fastest steps of
# each side (the least disturbed ones).
#
# OpenBLAS kernels: both sides use OpenBLAS (PyTorch for every product,
# tandem for its sgemm rate; tandem's products are its own AVX-512 kernels
# when built with them).  bench/blas_core.sh sets OPENBLAS_CORETYPE to the
# fastest kernel family that computes correctly here (OpenBLAS's own
# detection can pick SSE3 kernels on an AVX-512 CPU, and an inherited
# OPENBLAS_CORETYPE can be wrong too): BENCH_BLAS=inherit keeps the
# environment's, any other value is used as OPENBLAS_CORETYPE.  PyTorch
# also runs with glibc malloc tunables that keep freed memory for reuse (see
# bench/torch_train.py: page faults cost 2x on a medium step otherwise).
#
# Knobs (environment): TRAIN_BENCH_CONFIGS ("small medium"),
# TRAIN_BENCH_STEPS_SMALL (30), TRAIN_BENCH_STEPS_MEDIUM (8),
# TRAIN_BENCH_ROUNDS (2), TRAIN_BENCH_THREADS (2), TRAIN_BENCH_PROFILE
# (medium; "none" skips the profile), TRAIN_BENCH_PROFILE_STEPS (2),
# TRAIN_BENCH_PROFILE_MAX_S (20: the profile window's cap), BENCH_BLAS
# (auto), PYTHON (/usr/bin/python3).  Last line printed: one JSON object
# starting with {"bench":"train".
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if [ "$BUILD" = build ]; then BIN=bin/tandem; else BIN=$BUILD/bin/tandem; fi
PY=${PYTHON:-/usr/bin/python3}
DATA=$BUILD/fortunes.bin
CONFIGS=${TRAIN_BENCH_CONFIGS:-small medium}
ROUNDS=${TRAIN_BENCH_ROUNDS:-2}
THREADS=${TRAIN_BENCH_THREADS:-2}
PROFILE=${TRAIN_BENCH_PROFILE:-medium}
PROF_STEPS=${TRAIN_BENCH_PROFILE_STEPS:-2}
PROF_MAX_S=${TRAIN_BENCH_PROFILE_MAX_S:-20}
SKIP=3

[ -x "$BIN" ] || { echo "bench/train.sh: $BIN missing (make bench builds it)"; exit 1; }
"$PY" -c 'import torch' 2>/dev/null || { echo "bench/train.sh: $PY cannot import torch (apt-get install python3-torch)"; exit 1; }
if [ ! -s "$DATA" ]; then
    [ -r /usr/share/games/fortunes ] || { echo "bench/train.sh: no $DATA and no /usr/share/games/fortunes (make deps)"; exit 1; }
    "$BIN" data prepare --input /usr/share/games/fortunes --output "$DATA" >/dev/null
fi
# Each side sets its own threads: tandem's pool (OpenBLAS single-threaded
# inside it), torch.set_num_threads in the script; no environment caps.
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS GOTO_NUM_THREADS MKL_NUM_THREADS TANDEM_THREADS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tandem-bench-train.XXXXXX")
TPID=""
PPID_PERF=""
cleanup() {
    [ -n "$PPID_PERF" ] && kill -INT "$PPID_PERF" 2>/dev/null
    [ -n "$TPID" ] && kill -KILL "$TPID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

steps_of() {
    case $1 in
        small) echo "${TRAIN_BENCH_STEPS_SMALL:-30}" ;;
        medium) echo "${TRAIN_BENCH_STEPS_MEDIUM:-8}" ;;
        *) echo 10 ;;
    esac
}

load() { cut -d' ' -f1-3 /proc/loadavg; }

# median tokens/s of the steps after the first $SKIP of one run, for the log
tandem_median() {
    "$PY" -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r["tokens_per_s"] for r in rows if r["step"] > int(sys.argv[2])]
print("%.0f" % statistics.median(v) if v else "nan")' "$1" "$SKIP"
}

run_tandem() {   # config round
    c=$1; r=$2; n=$(steps_of "$c"); out=$TMP/$c.tandem.$r
    t0=$(date +%s)
    if ! "$BIN" train "configs/$c.json" "data=$DATA" "steps=$n" eval_every=0 save_every=0 keep_last=1 \
            "threads=$THREADS" "out_dir=$out" >"$out.log" 2>&1; then
        echo "bench/train.sh: tandem train configs/$c.json failed:"; tail -5 "$out.log"; return 1
    fi
    cp "$out/metrics.jsonl" "$out.metrics.jsonl"
    rm -rf "$out"   # the checkpoint written after the last step (medium: ~1.2 GB)
    printf '  %-7s round %d  tandem   %7s tok/s  (%d steps, %3d s, load %s)\n' "$c" "$r" \
        "$(tandem_median "$out.metrics.jsonl")" "$n" $(($(date +%s) - t0)) "$(load)"
}

run_torch() {   # config round
    c=$1; r=$2; n=$(steps_of "$c"); out=$TMP/$c.torch.$r
    t0=$(date +%s)
    if ! OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_train.py "configs/$c.json" --data "$DATA" \
            --warmup "$SKIP" --steps $((n - SKIP)) --threads "$THREADS" >"$out.json" 2>"$out.log"; then
        echo "bench/train.sh: bench/torch_train.py configs/$c.json failed:"; tail -5 "$out.log"; cat "$out.json"
        return 1
    fi
    printf '  %-7s round %d  pytorch  %7s tok/s  (%d steps, %3d s, load %s)\n' "$c" "$r" \
        "$("$PY" -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["tokens_per_s"])' "$out.json")" \
        "$n" $(($(date +%s) - t0)) "$(load)"
}

T_START=$(date +%s)
LOAD_START=$(load)
echo "== training throughput: tandem vs PyTorch $("$PY" -c 'import torch; print(torch.__version__)') ($THREADS threads, $(nproc) cores, load $LOAD_START)"
ENV_CORETYPE=${OPENBLAS_CORETYPE:-}
. bench/blas_core.sh
for c in $CONFIGS; do
    [ "$(steps_of "$c")" -gt "$SKIP" ] || { echo "bench/train.sh: $c needs more than $SKIP steps"; exit 1; }
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        if [ $((r % 2)) -eq 1 ]; then run_tandem "$c" "$r"; run_torch "$c" "$r"
        else run_torch "$c" "$r"; run_tandem "$c" "$r"; fi
        r=$((r + 1))
    done
done
LOAD_END=$(load)

# ---------------------------------------------------------------- profile
# A separate run (the timed ones stay unperturbed): perf samples every
# thread of it from the end of step 1 for PROF_STEPS steps (at most
# PROF_MAX_S seconds), then the run is killed (no checkpoint to wait for).
PROF_NOTE=""
if [ "$PROFILE" != none ]; then
    if ! command -v perf >/dev/null 2>&1; then
        PROF_NOTE="perf not installed"
    else
        pout=$TMP/prof
        "$BIN" train "configs/$PROFILE.json" "data=$DATA" steps=1000 eval_every=0 save_every=0 \
            "threads=$THREADS" "out_dir=$pout" >"$TMP/prof.log" 2>&1 &
        TPID=$!
        nsteps() { [ -f "$pout/metrics.jsonl" ] && wc -l <"$pout/metrics.jsonl" || echo 0; }
        while [ "$(nsteps)" -lt 1 ] && kill -0 "$TPID" 2>/dev/null; do sleep 0.2; done
        if kill -0 "$TPID" 2>/dev/null; then
            perf record -F 499 -g -p "$TPID" -o "$TMP/perf.data" >"$TMP/perf.log" 2>&1 &
            PPID_PERF=$!
            pt0=$(date +%s)
            while [ "$(nsteps)" -lt $((1 + PROF_STEPS)) ] && [ $(($(date +%s) - pt0)) -lt "$PROF_MAX_S" ] \
                  && kill -0 "$PPID_PERF" 2>/dev/null; do sleep 0.2; done
            PROF_WINDOW=$(($(date +%s) - pt0))
            PROF_DONE=$(($(nsteps) - 1))
            kill -INT "$PPID_PERF" 2>/dev/null || true
            wait "$PPID_PERF" 2>/dev/null || true
            PPID_PERF=""
            PROF_NOTE="tandem train configs/$PROFILE.json, steps 2-$((1 + PROF_DONE)) ($PROF_DONE whole steps in a ${PROF_WINDOW} s window), perf record -F 499 -g"
        else
            PROF_NOTE="profile run failed: $(tail -1 "$TMP/prof.log")"
        fi
        kill -KILL "$TPID" 2>/dev/null || true
        wait "$TPID" 2>/dev/null || true
        TPID=""
        rm -rf "$pout"
        if [ -s "$TMP/perf.data" ]; then
            nm -l -S --defined-only "$BIN" >"$TMP/nm.txt" 2>/dev/null || true
            perf script -i "$TMP/perf.data" -F comm,tid,ip,sym,dso >"$TMP/perf.txt" 2>/dev/null || true
        elif [ -z "${PROF_NOTE##tandem*}" ]; then
            PROF_NOTE="perf recorded nothing: $(tail -1 "$TMP/perf.log")"
        fi
    fi
fi

# ---------------------------------------------------------------- report
"$PY" - "$TMP" "$SKIP" "$ROUNDS" "$THREADS" "$LOAD_START" "$LOAD_END" "$(($(date +%s) - T_START))" \
    "$PROF_NOTE" "$BLAS_CORE" "${OPENBLAS_CORETYPE:-}" "$ENV_CORETYPE" $CONFIGS <<'EOF'
import json, os, re, statistics, sys
from collections import Counter, defaultdict

tmp, skip, rounds, threads, load0, load1, wall, prof_note, blas_core, coretype, env_coretype = sys.argv[1:12]
skip, rounds = int(skip), int(rounds)
configs = sys.argv[12:]
med = statistics.median
res = {}
for c in configs:
    t_tok, t_mfu, t_ge, t_sge, p_tok, p_ge, per_round, t_fma, t_gemm, t_sgemm, p_peaks = ([] for _ in range(11))
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open("%s/%s.tandem.%d.metrics.jsonl" % (tmp, c, r)) if l.strip()]
        rows = [x for x in rows if x["step"] > skip]
        tj = json.load(open("%s/%s.torch.%d.json" % (tmp, c, r)))
        fpt = tj["flops_per_token"]
        # the peaks this tandem run divided by (measured once at its start),
        # from its own figures: mfu against the FMA peak, gemm_eff against
        # the best GEMM rate, sgemm_eff against cblas_sgemm's
        x = rows[-1]
        peak_of = lambda key: round(fpt * x["tokens_per_s"] / x[key] * 1e-9, 1)
        t_fma.append(peak_of("mfu"))
        t_gemm.append(peak_of("gemm_eff"))
        t_sgemm.append(peak_of("sgemm_eff"))
        ntok = tj["batch"][0] * tj["batch"][1]
        ptok = [ntok / s for s in tj["step_times"]]
        p_peaks.append(tj["peak_gflops"])
        t_tok += [x["tokens_per_s"] for x in rows]
        t_mfu += [x["mfu"] for x in rows]
        t_ge += [x["gemm_eff"] for x in rows]
        t_sge += [x["sgemm_eff"] for x in rows]
        p_tok += ptok
        p_ge += [fpt * v / (tj["peak_gflops"] * 1e9) for v in ptok]
        per_round.append(dict(tandem_tok_s=round(med([x["tokens_per_s"] for x in rows]), 1),
                              torch_tok_s=round(med(ptok), 1),
                              ratio=round(med([x["tokens_per_s"] for x in rows]) / med(ptok), 3),
                              tandem_fma_peak=t_fma[-1], tandem_gemm_peak=t_gemm[-1], tandem_sgemm_peak=t_sgemm[-1],
                              torch_matmul_peak=p_peaks[-1], torch_loss=[tj["loss_first"], tj["loss_last"]]))
    res[c] = dict(steps=len(rows) + skip, timed_steps_per_side=len(t_tok),
                  tandem_tok_s=round(med(t_tok), 1), torch_tok_s=round(med(p_tok), 1),
                  ratio=round(med(t_tok) / med(p_tok), 3),
                  tandem_tok_s_best=round(max(t_tok), 1), torch_tok_s_best=round(max(p_tok), 1),
                  ratio_best=round(max(t_tok) / max(p_tok), 3),
                  tandem_mfu=round(med(t_mfu), 4), tandem_gemm_eff=round(med(t_ge), 4),
                  tandem_sgemm_eff=round(med(t_sge), 4), torch_gemm_eff=round(med(p_ge), 4),
                  flops_per_token=fpt, tandem_fma_peak=t_fma, tandem_gemm_peak=t_gemm, tandem_sgemm_peak=t_sgemm,
                  torch_matmul_peak=p_peaks, rounds=per_round)

# the machine's FMA peak: the best any run measured (a disturbed
# measurement reads low); both sides' MFU against it
fma_all = [p for v in res.values() for p in v["tandem_fma_peak"]]
best = max(fma_all)
unsteady = max(fma_all) > 1.5 * min(fma_all)
for v in res.values():
    v["tandem_mfu_vs_best_peak"] = round(v["flops_per_token"] * v["tandem_tok_s"] / (best * 1e9), 4)
    v["torch_mfu_vs_best_peak"] = round(v["flops_per_token"] * v["torch_tok_s"] / (best * 1e9), 4)
print("\n  %-7s %12s %12s %7s  %-26s %-9s  %-17s  %s" % ("", "", "", "", "    MFU (FMA peak)", "", " GEMM efficiency", ""))
print("  %-7s %12s %12s %7s  %8s %8s %8s  %8s %8s   %s" % ("config", "tandem tok/s", "torch tok/s", "ratio",
                                                        "tandem", "tandem*", "torch*", "tandem", "torch", "targets"))
for c, v in res.items():
    tgt = ["ratio >= 1.3 " + ("ok" if v["ratio"] >= 1.3 else "MISSED")]
    if c == "medium":
        tgt.append("MFU >= 65%% %s (reported), %s (best peak)" % (
            "ok" if v["tandem_mfu"] >= 0.65 else "MISSED", "ok" if v["tandem_mfu_vs_best_peak"] >= 0.65 else "MISSED"))
    print("  %-7s %12.0f %12.0f %6.2fx  %7.1f%% %7.1f%% %7.1f%%  %7.1f%% %7.1f%%   %s" % (
        c, v["tandem_tok_s"], v["torch_tok_s"], v["ratio"], 100 * v["tandem_mfu"], 100 * v["tandem_mfu_vs_best_peak"],
        100 * v["torch_mfu_vs_best_peak"], 100 * v["tandem_gemm_eff"], 100 * v["torch_gemm_eff"], ", ".join(tgt)))
print("  MFU: tandem as metrics.jsonl reports it (its run's FMA peak); * against the best FMA peak of the bench,")
print("  %.0f GFLOP/s%s.  GEMM efficiency: against the best GEMM rate measured at start-up (tandem's"
      % (best, " -- the runs' peaks differ by > 1.5x: the load varied, per-run figures are unreliable" if unsteady else ""))
print("  metrics.jsonl gemm_eff: its kernel or cblas_sgemm on 1024^3), PyTorch's against torch.matmul 1024^3.")
print("  medians over %s timed steps per side (after %d warm-up steps, %d rounds A B B A);"
      % ("/".join(str(v["timed_steps_per_side"]) for v in res.values()), skip, rounds))
print("  per-round tandem/torch ratios: %s; of the fastest steps (least disturbed): %s" % (
    "; ".join("%s %s" % (c, " ".join("%.2f" % x["ratio"] for x in v["rounds"])) for c, v in res.items()),
    "; ".join("%s %.0f/%.0f = %.2f" % (c, v["tandem_tok_s_best"], v["torch_tok_s_best"], v["ratio_best"])
              for c, v in res.items())))
print("  peaks (GFLOP/s, one per run): FMA %s; tandem's best GEMM %s, its cblas_sgemm %s; torch.matmul %s"
      % (" ".join("%.0f" % p for p in fma_all),
         " ".join("%.0f" % p for v in res.values() for p in v["tandem_gemm_peak"]),
         " ".join("%.0f" % p for v in res.values() for p in v["tandem_sgemm_peak"]),
         " ".join("%.0f" % p for v in res.values() for p in v["torch_matmul_peak"])))
print("  OpenBLAS kernels %s (OPENBLAS_CORETYPE %s); load %s at the start, %s at the end; %s s"
      % (blas_core, coretype or "unset", load0, load1, wall))

# ---------------------------------------------------------------- profile
profile = None
perf_txt, nm_txt = os.path.join(tmp, "perf.txt"), os.path.join(tmp, "nm.txt")
if os.path.exists(perf_txt) and os.path.getsize(perf_txt) > 0:
    funcs = []   # (start, end, name, file) of bin/tandem, from nm -l -S
    if os.path.exists(nm_txt):
        for line in open(nm_txt):
            p = line.split()
            if len(p) >= 4 and p[2] in "tTwW":
                f = p[4].rsplit(":", 1)[0] if len(p) >= 5 else ""
                funcs.append((int(p[0], 16), int(p[0], 16) + int(p[1], 16), p[3], os.path.basename(f)))
    funcs.sort()
    import bisect
    starts = [f[0] for f in funcs]

    def src_of(ip):
        i = bisect.bisect_right(starts, ip) - 1
        return funcs[i][3] if i >= 0 and funcs[i][0] <= ip < funcs[i][1] else ""

    ATT_BW = re.compile(r"^(bw_|attention_backward)")
    NAMES = {
        "core/ops/gemm.c": None, "attention.c": None,
        "rmsnorm.c": "rmsnorm fw/bw", "swiglu.c": "swiglu / silu fw/bw", "rope.c": "rope",
        "softmax.c": "softmax / cross-entropy", "embedding.c": "embedding fw/bw",
        "optim.c": "adamw + grad norm/clip", "pool.c": "pool spin / wait",
    }

    def classify(chain):
        """chain: [(ip, sym, dso)], leaf first -> op group."""
        ip, sym, dso = chain[0]
        syms = [s for _, s, _ in chain]
        if "kernel" in dso:
            if any("page_fault" in s for s in syms):
                return "kernel: page faults"
            if any("futex" in s or "sched_yield" in s for s in syms):
                return "pool spin / wait"
            return "kernel: other"
        if "openblas" in dso or "blas" in dso:
            return "backward gemm (OpenBLAS sgemm)"
        if re.match(r"^(__)?expf?(_fma|_avx2|_finite)?(@plt)?$", sym) or sym.startswith("__expf") or sym == "expf@plt":
            return "exp (libm)"
        if re.search(r"mem(set|cpy|move)", sym):
            return "memset / memcpy"
        if "tandem" not in os.path.basename(dso):
            return "other (%s)" % os.path.basename(dso)
        f = src_of(int(ip, 16))
        if f == "gemm.c":
            if sym in ("pack_range", "gemm_pack"):
                return "weight pack (model_pack)"
            if sym in ("tile", "wide", "drive", "tile_avx512", "wide_avx512", "tile_generic", "xwt_rows",
                       "xwt_panels", "gemm_xwt", "gemm_xwt_serial"):
                return "gemm forward kernel"
            return "backward gemm (tandem kernel)"
        if f == "attention.c":
            return "attention bw" if any(ATT_BW.match(s) for s in syms) else "attention fw"
        if f == "moe.c":
            return "moe router / aux" if re.match(r"moe_(router|topk|aux|z)", sym) else "moe dispatch / combine"
        if f == "layer.c":
            if sym in ("add_range", "residual_add"):
                return "residual add"
            return "moe dispatch / combine" if re.search(r"expert|ep_|moe", sym) else "layer glue"
        if f in NAMES and NAMES[f]:
            return NAMES[f]
        if f == "trainer.c" or sym.startswith("train_"):
            return "trainer (zero grads, loss)"
        return "other tandem (%s)" % (f or sym)

    samples, chain = [], []
    for line in open(perf_txt, errors="replace"):
        if line.startswith((" ", "\t")):
            m = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", line)
            if m:
                sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(2))
                chain.append((m.group(1), sym, m.group(3)))
        elif not line.strip():
            if chain:
                samples.append(chain)
            chain = []
    if chain:
        samples.append(chain)
    groups, top, gsyms = Counter(), Counter(), defaultdict(Counter)
    for ch in samples:
        g = classify(ch)
        groups[g] += 1
        top[ch[0][1]] += 1
        gsyms[g][ch[0][1]] += 1
    n = sum(groups.values())
    print("\n== where tandem's time goes: %s, %d samples (both threads)" % (prof_note, n))
    print("  %-34s %7s   %s" % ("op", "share", "top symbols"))
    for g, k in groups.most_common():
        syms = ", ".join("%s %.1f%%" % (s, 100.0 * q / n) for s, q in gsyms[g].most_common(3))
        print("  %-34s %6.1f%%   %s" % (g, 100.0 * k / n, syms))
    profile = dict(note=prof_note, samples=n, groups={g: round(k / n, 4) for g, k in groups.most_common()},
                   top_symbols={s: round(k / n, 4) for s, k in top.most_common(15)})
elif prof_note:
    print("\n== profile skipped: %s" % prof_note)

out = dict(bench="train", threads=int(threads), load_start=load0, load_end=load1, wall_s=int(wall),
           skip_steps=skip, rounds=rounds, openblas_core=blas_core, openblas_coretype=coretype or None,
           env_openblas_coretype=env_coretype or None, best_fma_peak_gflops=best, configs=res)
if profile:
    out["profile"] = profile
print("\n" + json.dumps(out))
EOF
