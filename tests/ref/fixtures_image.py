#!/usr/bin/python3
"""Fixtures for tests/test_image.c: PNG and JPEG files of every layout the
decoder converts, each with the RGB pixels an independent decoder finds in
it, broken files the decoder must refuse, and PyTorch's bilinear resize.

OUT/image/<case>.png|.jpg   the files (list: CASES below, in image_expect.h5's
                            attribute "cases", comma-separated)
OUT/image/bad_<name>.*      files to refuse (attribute "bad": name=expected
                            words of the error line, ';'-separated)
image_expect.h5             rgb/<case>  (h, w, 3) float32 0..255: what PIL's
                                        Image.open(f).convert("RGB") gives, or
                                        for the files written here by hand
                                        (16-bit, Adam7) the source pixels
                                        (16-bit: the high byte)
                            resize/<n>/pixels (3, S, S): torch
                                        F.interpolate(bilinear,
                                        align_corners=False, antialias=False)
                                        of rgb/rgb8 to S x S, then
                                        (v / 255 - mean) / std; attrs size,
                                        and mean, std (3 each)
PIL decodes with its own code for PNG (its zlib inflate and unfiltering)
and drives libjpeg-turbo for JPEG with its own colour handling: JPEG
pixels must agree exactly (the same IDCT and upsampling, ISLOW).
"""
import argparse
import base64
import io
import os
import struct
import zlib

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def png_raw(w, h, depth, ctype, scanlines, interlace=0):
    """A PNG from already-filtered scanline bytes (filter byte 0 on each row)."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(scanlines)) + chunk(b"IEND", b"")


def png_16(arr, ctype):
    """arr (h, w, c) uint16 -> 16-bit PNG, filter 0 (big-endian samples)."""
    h, w = arr.shape[:2]
    rows = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))
    return png_raw(w, h, 16, ctype, rows)


def png_adam7(arr):
    """arr (h, w, 3) uint8 -> interlaced (Adam7) 8-bit RGB PNG."""
    h, w = arr.shape[:2]
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    out = b""
    for x0, y0, dx, dy in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        out += b"".join(b"\x00" + sub[y].tobytes() for y in range(sub.shape[0]))
    return png_raw(w, h, 8, 2, out, interlace=1)


def pil_bytes(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = os.path.join(a.out, "image")
    os.makedirs(d, exist_ok=True)
    torch.set_num_threads(1)
    rng = np.random.default_rng(20)
    # A smooth picture with noise: JPEG keeps it recognisable, PNG exact.
    H, W = 23, 37
    yy, xx = np.mgrid[0:H, 0:W]
    base = np.stack([xx * 255 // (W - 1), yy * 255 // (H - 1), (xx + yy) * 255 // (W + H - 2)], -1)
    rgb = np.clip(base + rng.integers(-40, 40, (H, W, 3)), 0, 255).astype(np.uint8)
    alpha = rng.integers(0, 256, (H, W), dtype=np.uint8)
    gray = rgb[..., 1].copy()

    files = {}   # case -> (bytes, reference rgb or None to take PIL's)
    files["rgb8.png"] = (pil_bytes(Image.fromarray(rgb, "RGB"), "PNG"), None)
    files["rgba8.png"] = (pil_bytes(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG"), None)
    files["gray8.png"] = (pil_bytes(Image.fromarray(gray, "L"), "PNG"), None)
    files["graya8.png"] = (pil_bytes(Image.fromarray(np.dstack([gray, alpha]), "LA"), "PNG"), None)
    files["gray1.png"] = (pil_bytes(Image.fromarray(gray > 128), "PNG"), None)
    pal = Image.fromarray(rgb, "RGB").quantize(colors=13)
    files["pal8.png"] = (pil_bytes(pal, "PNG"), None)
    files["pal4_trns.png"] = (pil_bytes(pal, "PNG", bits=4, transparency=3), None)
    r16 = rng.integers(0, 65536, (H, W, 3), dtype=np.uint16)
    files["rgb16.png"] = (png_16(r16, 2), (r16 >> 8).astype(np.uint8))
    g16 = rng.integers(0, 65536, (H, W, 1), dtype=np.uint16)
    files["gray16.png"] = (png_16(g16, 0), np.repeat(g16 >> 8, 3, -1).astype(np.uint8))
    ra16 = rng.integers(0, 65536, (H, W, 4), dtype=np.uint16)
    files["rgba16.png"] = (png_16(ra16, 6), (ra16[..., :3] >> 8).astype(np.uint8))
    files["adam7.png"] = (png_adam7(rgb), rgb)
    files["q90.jpg"] = (pil_bytes(Image.fromarray(rgb), "JPEG", quality=90), None)
    files["q75_420.jpg"] = (pil_bytes(Image.fromarray(rgb), "JPEG", quality=75, subsampling=2), None)
    files["progressive.jpg"] = (pil_bytes(Image.fromarray(rgb), "JPEG", quality=85, progressive=True), None)
    files["gray.jpg"] = (pil_bytes(Image.fromarray(gray, "L"), "JPEG", quality=90), None)

    with h5py.File(os.path.join(a.out, "image_expect.h5"), "w") as f:
        for name, (data, ref) in files.items():
            with open(os.path.join(d, name), "wb") as o:
                o.write(data)
            if ref is None:
                ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            f["rgb/" + name] = ref.astype(np.float32)
        f.attrs["cases"] = ",".join(files)
        # Python's base64 of two files, for the server's data-URL decoder
        # (the JPEG's wrapped at 76 characters by encodebytes: whitespace is skipped).
        with open(os.path.join(d, "rgb8.png.b64"), "wb") as o:
            o.write(base64.b64encode(files["rgb8.png"][0]))
        with open(os.path.join(d, "q90.jpg.b64"), "wb") as o:
            o.write(base64.encodebytes(files["q90.jpg"][0]))

        # Files to refuse, with words their error line must hold.
        png, jpg = files["rgb8.png"][0], files["q90.jpg"][0]
        bad = {}
        bad["bad_empty.png"] = (b"", "empty")
        bad["bad_text.png"] = (b"hello, I am not an image\n", "not a PNG or JPEG")
        bad["bad_trunc.png"] = (png[: len(png) // 2], "truncated PNG")
        bad["bad_noiend.png"] = (png[:-12], "truncated PNG")
        i = png.index(b"IDAT") + 20
        bad["bad_crc.png"] = (png[:i] + bytes([png[i] ^ 0x55]) + png[i + 1:], "corrupt PNG")
        bomb = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
        bad["bad_bomb.png"] = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", bomb) +
                               chunk(b"IDAT", zlib.compress(b"\0" * 300001)) + chunk(b"IEND", b""), "100000x100000")
        zero = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
        bad["bad_zero.png"] = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", zero) + chunk(b"IEND", b""), "corrupt PNG")
        bad["bad_sig.png"] = (png[:8] + b"garbage after a PNG signature", "corrupt PNG")
        bad["bad_trunc.jpg"] = (jpg[: len(jpg) * 2 // 3], "truncated JPEG")
        s = jpg.index(b"\xff\xda")   # start of scan: garble the entropy-coded data after its header
        garbled = bytearray(jpg)
        for k in range(s + 40, len(jpg) - 10, 7):
            garbled[k] = 0xFF if garbled[k] != 0xFF else 0x00
        bad["bad_garbled.jpg"] = (bytes(garbled), "corrupt JPEG")
        sof = jpg.index(b"\xff\xc0")  # SOF0: FF C0 len(2) precision(1) height(2) width(2)
        big = jpg[:sof + 5] + struct.pack(">HH", 60000, 60000) + jpg[sof + 9:]
        bad["bad_bomb.jpg"] = (big, "60000x60000")
        zh = jpg[:sof + 5] + struct.pack(">H", 0) + jpg[sof + 7:]
        bad["bad_zero.jpg"] = (zh, "JPEG")
        bad["bad_soi.jpg"] = (b"\xff\xd8\xff" + b"\x00" * 40, "corrupt JPEG")
        cmyk = Image.fromarray(np.dstack([rgb, gray]), "CMYK")
        bad["bad_cmyk.jpg"] = (pil_bytes(cmyk, "JPEG"), "CMYK")
        for name, (data, _) in bad.items():
            with open(os.path.join(d, name), "wb") as o:
                o.write(data)
        f.attrs["bad"] = ";".join("%s=%s" % (k, v[1]) for k, v in bad.items())

        # PyTorch's bilinear resize of rgb8 (down, up, anisotropic are all in these two).
        x = torch.tensor(rgb, dtype=torch.float32).permute(2, 0, 1)[None]
        mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
        for k, size in enumerate((16, 50)):
            y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
            y = (y / 255.0 - mean) / std
            g = f.create_group("resize/%d" % k)
            g["pixels"] = y[0].numpy().astype(np.float32)
            g.attrs["size"] = size
        f.attrs["n_resize"] = 2
        f["mean"] = np.array(CLIP_MEAN, dtype=np.float32)
        f["std"] = np.array(CLIP_STD, dtype=np.float32)
    print("fixtures_image: %d images, %d refusals, image_expect.h5 in %s" % (len(files), len(bad), a.out))


if __name__ == "__main__":
    main()
