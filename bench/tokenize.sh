#!/bin/sh
# bench/tokenize.sh - tokenizer encode throughput, tandem against the
# reference port (@lenml/tokenizers under node) on the same text in one run
# (run by bench/run.sh, i.e. `make bench`).
#
# Text: TOK_BENCH_BYTES (default 1000000) bytes of English prose, Debian's
# fortunes (adams, fortunes, literature, people, politics, science,
# songs-poems, wisdom, work ...), encoded line by line without special
# tokens.  For each tokenizer the packages ship (Qwen3, the 32k
# SentencePiece-style one, DeepSeek-V3): load time, then MB/s in CPU
# seconds of one thread (build/bench/tok_bench, tandem) and of the node
# process (tests/ref/tok_ref.js bench), each for at least
# TOK_BENCH_SECONDS (default 3; the port makes whole passes, so a slow
# tokenizer takes longer), and their ratio.  CPU time rather than wall
# time because the machine is shared; the figures are indicative.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
NM=$PWD/build/node_modules
SECS=${TOK_BENCH_SECONDS:-3}
BYTES=${TOK_BENCH_BYTES:-1000000}
W=$(mktemp -d /tmp/tandem-tokbench.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -x "$BUILD/bench/tok_bench" ] || { echo "bench/tokenize.sh: $BUILD/bench/tok_bench is missing (make bench builds it)"; exit 1; }
command -v node >/dev/null || { echo "bench/tokenize.sh: node is missing (./tandem.sh deps)"; exit 1; }
F=/usr/share/games/fortunes
for f in adams fortunes literature people politics science songs-poems wisdom work computers cookie definitions \
         education food humorists law love medicine men-women miscellaneous news pets platitudes riddles; do
    [ -f "$F/$f" ] && cat "$F/$f"
done | head -c "$BYTES" >"$W/prose.txt"
echo "text: $(wc -c <"$W/prose.txt") bytes of English prose (fortunes), $(wc -l <"$W/prose.txt") lines"
printf '%-12s %9s %14s %16s %8s\n' tokenizer "load s" "tandem MB/s" "reference MB/s" ratio
for name in qwen3 llama2 deepseek_v3; do
    dir=$NM/@lenml/tokenizer-$name/models
    [ -f "$dir/tokenizer.json" ] || { echo "bench/tokenize.sh: $dir is missing (./tandem.sh deps)"; exit 1; }
    ours=$("$BUILD/bench/tok_bench" "$dir" "$W/prose.txt" "$SECS")
    theirs=$(NODE_PATH=$NM node tests/ref/tok_ref.js bench "$dir" "$W/prose.txt" "$SECS")
    /usr/bin/python3 - "$name" "$ours" "$theirs" <<'EOF'
import json, sys
o, r = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print("%-12s %9.3f %14.2f %16.2f %7.1fx" % (sys.argv[1], o["load_s"], o["mb_per_s"], r["mb_per_s"],
                                            o["mb_per_s"] / r["mb_per_s"]))
EOF
done
