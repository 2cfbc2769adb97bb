#!/bin/sh
# tests/cli/fuzz_image.sh - a short, bounded run of the image-decoder
# fuzzer (tests/fuzz/fuzz_image.c: libpng and libjpeg-turbo through
# core/image, clang + ASan + UBSan) in the suite: it builds the harness,
# replays the corpus of tests/fuzz/corpus/image and the generated seeds,
# then mutates them for FUZZ_IMAGE_TIME seconds (default 3).  A crash, a
# leak, a refusal that is not one line or an accepted image of the wrong
# size stops it with the input left as $BUILD/fuzz/image-crash-*.  The long
# runs are `make fuzz-image FUZZ_TIME=...`.  ~6 s (the build included).
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
BUILD=${BUILD:-build}
PY=/usr/bin/python3
need clang make || exit 1
S=${FUZZ_IMAGE_TIME:-3}
bounded 300 make --no-print-directory -s BUILD="$BUILD" "$BUILD/fuzz/fuzz_image" >"$BUILD/fuzz_image_build.log" 2>&1 ||
    { tail -5 "$BUILD/fuzz_image_build.log"; echo "fuzz_image: FAIL: building the harness"; exit 1; }
W=$(mktemp -d /tmp/tandem-fuzz-image.XXXXXX)
trap 'rm -rf "$W"' EXIT
$PY tests/fuzz/seeds_image.py "$W" >/dev/null
rc=0
# The new inputs go to $W (thrown away): the run proves, it does not grow the corpus.
bounded $((S + 60)) "$BUILD/fuzz/fuzz_image" -max_total_time="$S" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -dict=tests/fuzz/image.dict -artifact_prefix="$BUILD/fuzz/image-" "$W" tests/fuzz/corpus/image \
    >"$W/log" 2>&1 || rc=$?
if [ $rc -ne 0 ]; then
    grep -E 'ERROR|SUMMARY|Test unit written' "$W/log" | head -5
    echo "fuzz_image: FAIL (exit $rc): a crash or a broken promise; the input is $BUILD/fuzz/image-crash-*"
    exit 1
fi
runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$W/log")
[ -n "$runs" ] && [ "$runs" -gt 0 ] || { tail -5 "$W/log"; echo "fuzz_image: FAIL: no runs reported"; exit 1; }
echo "ok   fuzz_image: $runs inputs in $S s, no crash"
echo "fuzz_image: all passed"
