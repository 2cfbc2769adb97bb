#!/bin/sh
# bench/plan.sh - wall time of `tandem plan` over every layout of 8,192
# devices (issue 17: interactive, < 2 s), training and serving, for the
# big configs there are.  Indicative on a shared machine: the planner runs
# on one core and does no I/O, so other load slows it about linearly.
# The DeepSeek-V3-family configs (issue 16) need nothing of their own:
# their sizes come from the model's own parameter table.
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
        # shellcheck disable=SC2086
        /usr/bin/python3 - "$T" "$c" $mode $keys <<'EOF'
import json, subprocess, sys, time
t, c, mode, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
t0 = time.monotonic()
out = subprocess.run([t, "plan", c, "--world", "8192", "--device-mem-gb", "80", "--mode", mode, "--json"] + keys,
                     capture_output=True, text=True).stdout
dt = time.monotonic() - t0
v = json.loads(out)
print("%-28s %-6s %7d %9d %6d %9.3f" % (c, mode, 8192, len(v), sum(r["feasible"] for r in v), dt))
EOF
    done
done
