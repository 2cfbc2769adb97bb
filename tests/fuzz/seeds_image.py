#!/usr/bin/python3
"""tests/fuzz/seeds_image.py DIR - seed inputs for tests/fuzz/fuzz_image.c:
small PNGs of every colour type and bit depth PIL writes (RGB, RGBA, L,
LA, 1-bit, 8- and 4-bit palette with tRNS, 16-bit gray), and JPEGs
(4:4:4, 4:2:0, progressive, gray, with restart markers), all under 1 kB so
the fuzzer mutates them quickly."""
import io
import os
import sys

import numpy as np
from PIL import Image


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (6, 9, 3), dtype=np.uint8)
    a = rng.integers(0, 256, (6, 9), dtype=np.uint8)
    ims = {
        "rgb.png": (Image.fromarray(rgb), "PNG", {}),
        "rgba.png": (Image.fromarray(np.dstack([rgb, a]), "RGBA"), "PNG", {}),
        "l.png": (Image.fromarray(a, "L"), "PNG", {}),
        "la.png": (Image.fromarray(np.dstack([a, a]), "LA"), "PNG", {}),
        "1.png": (Image.fromarray(a > 128), "PNG", {}),
        "p8.png": (Image.fromarray(rgb).quantize(40), "PNG", {"transparency": 2}),
        "p4.png": (Image.fromarray(rgb).quantize(9), "PNG", {"bits": 4}),
        "i16.png": (Image.fromarray((a.astype(np.uint16) * 257), "I;16"), "PNG", {}),
        "q.jpg": (Image.fromarray(rgb), "JPEG", {"quality": 80, "subsampling": 0}),
        "q420.jpg": (Image.fromarray(rgb), "JPEG", {"quality": 60, "subsampling": 2}),
        "prog.jpg": (Image.fromarray(rgb), "JPEG", {"progressive": True}),
        "gray.jpg": (Image.fromarray(a, "L"), "JPEG", {}),
    }
    for name, (im, fmt, kw) in ims.items():
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        with open(os.path.join(out, "seed_" + name), "wb") as f:
            f.write(b.getvalue())
    print("seeds_image: %d seeds in %s" % (len(ims), out))


if __name__ == "__main__":
    main()
