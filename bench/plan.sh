#!/bin/sh
# bench/plan.sh - wall time of `tandem plan` over every layout of 8,192
# devices (issue 17: interactive, < 2 s), training and serving, for the
# big configs there are.  Indicative on a shared machine: the planner runs
# on one core and does no I/O, so other load slows it about linearly.
#
# MERGE NOTE (issue 16): configs/dsv3_3t_1m.json, configs/deepseek_v3.json
# and configs/kimi_k2.json join the list below as soon as they exist; the
# planner needs nothing else (its sizes come from the model's own table).
set -eu
cd "$(dirname "$0")/.."
T=bin/tandem
printf '%-28s %-6s %7s %9s %6s %9s\n' config mode world layouts fit wall_s
for c in configs/moe128.json configs/mixtral_8x7b.json configs/dsv3_3t_1m.json configs/deepseek_v3.json \
         configs/kimi_k2.json; do
    [ -e "$c" ] || { printf '%-28s (not in this tree)\n' "$c"; continue; }
    for mode in train serve; do
        ctx=4096
        [ "$c" != configs/moe128.json ] || ctx=1024   # its max_position_embeddings
        if [ $mode = train ]; then keys="seq_len=$ctx global_batch=16384 recompute=full zero=1"
        else keys="context=$ctx concurrency=64"; fi
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086
        $T plan "$c" --world 8192 --device-mem-gb 80 --mode $mode $keys --json >/tmp/tandem-bench-plan.json || true
        t1=$(date +%s.%N)
        set -- $(/usr/bin/python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); print(len(v), sum(r["feasible"] for r in v))' /tmp/tandem-bench-plan.json)
        printf '%-28s %-6s %7d %9d %6d %9.3f\n' "$c" $mode 8192 "$1" "$2" "$(echo "$t1 - $t0" | bc)"
    done
done
rm -f /tmp/tandem-bench-plan.json
