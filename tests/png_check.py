#!/usr/bin/python3
"""tests/png_check.py INDEX.json RULES.json - the figures `tandem plot`
wrote, read back by an independent decoder (zlib + struct + numpy here, not
cairo): every figure RULES.json names ("figures") is in INDEX.json and has
a PNG that decodes (signature, IHDR, CRCs, zlib, the five filters) at the
size expected ("size": {name: [w, h]}, default 900 x 540), with more than 1%
non-white pixels, more than 20 distinct colours, and at least 100 pixels of
each colour named ("colours": {name: [[r, g, b], ...]}); its SVG parses as
XML with an <svg> root of the same size and strokes a path in each colour
named besides its legend swatch.  A line whose values coincide with a later
line's (rss and alloc_peak of a small run, say) is drawn under it: the PNG
then shows only its legend swatch, so a colour with fewer than 100 pixels
passes only if the swatch is there (SWATCH_PIXELS) and the SVG holds the
hidden line.  Exit 1 on any failure, one line per figure.  (The checker of tests/cli/plot.sh, as a file for every script
that checks plots.)
"""
import json, struct, sys, zlib
import numpy as np
import xml.etree.ElementTree as ET

def png_pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind}"
        chunks.append((kind, body))
        pos += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"depth {depth} type {ctype}"
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = w * bpp
    assert len(raw) == h * (stride + 1), "IDAT size"
    # None, Sub and Up rows vectorised (numpy); Average and Paeth byte by byte
    img = np.zeros((h, stride), dtype=np.int64)
    prev = np.zeros(stride, dtype=np.int64)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(np.int64)
        if f == 0: pass
        elif f == 1: line = line.reshape(w, bpp).cumsum(axis=0).reshape(stride) & 255
        elif f == 2: line = (line + prev) & 255
        elif f in (3, 4):
            cur, up = line.tolist(), prev.tolist()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = up[i], up[i - bpp] if i >= bpp else 0
                if f == 3: cur[i] = (cur[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            line = np.array(cur, dtype=np.int64)
        else: raise AssertionError(f"filter {f}")
        img[y] = prev = line
    rgb = img.reshape(h, w, bpp)[:, :, :3]
    pixels = (rgb[:, :, 0] << 16 | rgb[:, :, 1] << 8 | rgb[:, :, 2]).reshape(-1)
    return w, h, pixels

SWATCH_PIXELS = 20   # a legend swatch alone shows 60 (a 900 x 540 figure)

def svg_strokes(root):
    """{(r, g, b): number of <path>s stroked in that colour} of a cairo SVG
    (style "stroke:rgb(12.156863%,46.666667%,70.588235%);...")."""
    out = {}
    for el in root.iter("{http://www.w3.org/2000/svg}path"):
        style = el.get("style", "")
        i = style.find("stroke:rgb(")
        if i < 0: continue
        parts = style[i + 11:style.index(")", i)].split(",")
        rgb = tuple(int(round(float(v.rstrip("%")) * 255 / 100)) for v in parts)
        out[rgb] = out.get(rgb, 0) + 1
    return out

index, rules = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
bad = 0
for fig in index["figures"]:
    name = fig["name"]
    if name not in rules["figures"]: continue
    try:
        w, h, px = png_pixels(fig["png"])
        keys, counts = np.unique(px, return_counts=True)
        colours = {(int(k) >> 16, (int(k) >> 8) & 255, int(k) & 255): int(c) for k, c in zip(keys, counts)}
        ink = 1 - colours.get((255, 255, 255), 0) / len(px)
        want_w, want_h = rules.get("size", {}).get(name, [900, 540])
        problems = []
        if (w, h) != (want_w, want_h): problems.append(f"size {w}x{h}, want {want_w}x{want_h}")
        if ink < 0.01: problems.append(f"blank: {ink:.2%} non-white")
        if len(colours) <= 20: problems.append(f"{len(colours)} colours")
        root = ET.parse(fig["svg"]).getroot()
        strokes = svg_strokes(root)
        notes = []
        for rgb in rules.get("colours", {}).get(name, []):
            n, paths = colours.get(tuple(rgb), 0), strokes.get(tuple(rgb), 0)
            if paths < 2: problems.append(f"colour {rgb}: {paths} stroked paths in the SVG (want the line and its swatch)")
            elif SWATCH_PIXELS <= n < 100: notes.append(f"colour {rgb}: {n} pixels, its line drawn under a later one")
            elif n < 100: problems.append(f"colour {rgb}: {n} pixels")
        if root.tag != "{http://www.w3.org/2000/svg}svg": problems.append(f"svg root {root.tag}")
        if root.get("width", "").rstrip("pt") != str(w) or root.get("height", "").rstrip("pt") != str(h):
            problems.append(f"svg size {root.get('width')}x{root.get('height')}")
        print(("FAIL " if problems else "ok   ") + f"{name}: {w}x{h}, {len(colours)} colours, {ink:.1%} ink"
              + (": " + "; ".join(problems + notes) if problems or notes else ""))
        bad |= bool(problems)
    except Exception as e:
        print(f"FAIL {name}: {fig['png']} / {fig['svg']}: {e}")
        bad = 1
missing = set(rules.get("figures", [])) - {f["name"] for f in index["figures"]}
if missing: print(f"FAIL figures not written: {sorted(missing)}"); bad = 1
sys.exit(bad)
