#!/bin/sh
# tests/cli/images.sh - `tandem data images` (SPEC section 13, docs/data.md):
# the PNGs decoded by an independent decoder (PIL) are 64 x 64 RGB, black
# but for one shape, whose pixels are exactly those the geometry of
# docs/data.md gives (recomputed here in numpy from the JSONL's size and
# position), in the pure colour the JSONL names; every shape and colour
# drawn, sizes 16-40 and wholly inside; the JSONL has the three questions of
# section 13 with their answers for each image; the same seed gives the same
# bytes, another seed other images; bad arguments refused with one line.  ~2 s.
set -eu
cd "$(dirname "$0")/../.."
. tests/bounds.sh
T=${TANDEM:-bin/tandem}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/tandem-images-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fail=1; }

expect_fail() {
    desc=$1; pat=$2; shift 2
    if "$@" >"$W/out" 2>"$W/err"; then bad "$desc: exit 0"; return; fi
    n=$(wc -l <"$W/err")
    if [ "$n" -ne 1 ] || ! grep -q -- "$pat" "$W/err"; then
        bad "$desc: want one line matching '$pat', got:"; cat "$W/err"; return
    fi
    ok "$desc: $(cat "$W/err")"
}

bounded 60 $T data images --output "$W/a" --n 150 --seed 4 2>"$W/log" || { cat "$W/log"; echo "FAIL data images"; exit 1; }
# (the second run writes into a directory whose parent does not exist yet,
# as `make demo-vision` does on a clean clone: it is created)
bounded 60 $T data images --output "$W/new/b" --n 150 --seed 4 2>/dev/null
bounded 60 $T data images --output "$W/c" --n 150 --seed 5 2>/dev/null
if cmp -s "$W/a/shapes.jsonl" "$W/new/b/shapes.jsonl" && cmp -s "$W/a/img_000149.png" "$W/new/b/img_000149.png"; then
    ok "the same seed writes the same files"
else bad "the same seed wrote other files"; fi
if cmp -s "$W/a/shapes.jsonl" "$W/c/shapes.jsonl"; then bad "seeds 4 and 5 drew the same images"; else ok "another seed draws other images"; fi

$PY - "$W/a" 150 <<'PYEOF' || fail=1
import json, os, sys
import numpy as np
from PIL import Image
d, n = sys.argv[1], int(sys.argv[2])
bad = 0
def check(ok, what):
    global bad
    print(("ok   " if ok else "FAIL ") + what)
    bad |= not ok
COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0),
          "magenta": (255, 0, 255), "cyan": (0, 255, 255), "white": (255, 255, 255)}
Q = {"What color is the shape?": lambda r: r["color"], "What shape is this?": lambda r: r["shape"],
     "Describe the image.": lambda r: "a %s %s" % (r["color"], r["shape"])}
rows = [json.loads(l) for l in open(os.path.join(d, "shapes.jsonl"))]
check(len(rows) == 3 * n, "%d JSONL lines for %d images" % (len(rows), n))
check(all(set(r) == {"image", "prompt", "answer", "shape", "color", "size", "x", "y"} for r in rows), "the documented fields")
check(all(r["answer"] == Q[r["prompt"]](r) for r in rows), "the three questions of SPEC 13 with their answers")
imgs = {}
for r in rows:
    imgs.setdefault(r["image"], []).append(r)
check(len(imgs) == n and all(len(v) == 3 and {x["prompt"] for x in v} == set(Q) for v in imgs.values()),
      "each image has the three questions")
# The geometry of docs/data.md at pixel centres (px + 0.5, py + 0.5), in floats.
py, px = np.mgrid[0:64, 0:64] + 0.5
mism = []
for name, (r, *_) in sorted(imgs.items()):
    im = Image.open(os.path.join(d, name))
    a = np.asarray(im.convert("RGB"))
    if im.size != (64, 64) or im.mode != "RGB":
        mism.append("%s: %s %s" % (name, im.size, im.mode)); continue
    s, x, y = r["size"], r["x"], r["y"]
    if not (16 <= s <= 40 and 0 <= x and 0 <= y and x + s <= 64 and y + s <= 64):
        mism.append("%s: box %d at (%d,%d) not inside" % (name, s, x, y)); continue
    cx, cy = x + s / 2, y + s / 2
    if r["shape"] == "circle":
        m = (px - cx) ** 2 + (py - cy) ** 2 <= (s / 2) ** 2
    elif r["shape"] == "square":
        m = (px >= x) & (px <= x + s) & (py >= y) & (py <= y + s)
    else:
        m = (py >= y) & (py <= y + s) & (np.abs(px - cx) <= (py - y) / 2)
    want = np.zeros((64, 64, 3), np.uint8)
    want[m] = COLORS[r["color"]]
    if not np.array_equal(a, want):
        mism.append("%s: %d pixels differ from a %s %s of %d at (%d,%d)" %
                    (name, int((a != want).any(-1).sum()), r["color"], r["shape"], s, x, y))
check(not mism, "every image is black but for its shape, in its colour, pixel for pixel" + (": " + "; ".join(mism[:3]) if mism else ""))
shapes = {r["shape"] for r in rows}
colors = {r["color"] for r in rows}
sizes = [r["size"] for r in rows]
check(shapes == {"circle", "square", "triangle"} and colors == set(COLORS), "every shape and colour drawn")
check(min(sizes) <= 18 and max(sizes) >= 38, "sizes span 16-40 (saw %d-%d)" % (min(sizes), max(sizes)))
sys.exit(bad)
PYEOF

expect_fail "no --n" "required" $T data images --output "$W/x"
expect_fail "--n 0" "n" $T data images --output "$W/x" --n 0
expect_fail "--n 2.5" "whole numbers" $T data images --output "$W/x" --n 2.5
expect_fail "an output that cannot be made" "cannot create" $T data images --output /proc/nonexistent/dir --n 2

[ $fail -eq 0 ] && echo "images: all passed" || { echo "images: FAILED"; exit 1; }
