"""Writes the corpus of fuzz_jpeg_header (csrc/data/fl_jpeg_header.c): headers built byte by
byte for every process, colour space and sampling the router tells apart, the malformed ones
(truncated, bad lengths, 0xFF runs, no frame, scan first, huge lengths, zero sizes, bad tables),
and the first 2 KiB of JPEGs from Pillow (baseline 4:4:4/4:2:2/4:2:0, progressive, grayscale,
CMYK, RGB, restart markers, EXIF/ICC). With --compare, checks instead that the parser agrees with
Pillow and libjpeg on random JPEGs from Pillow (and cjpeg, where installed).

    python3 tests/fuzz/make_jpeg_header_corpus.py tests/fuzz/corpus/jpeg_header
    python3 tests/fuzz/make_jpeg_header_corpus.py --compare 400 [--seed 0]   # needs cc
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, JpegImagePlugin

from make_image_seeds import natural

ROOT = Path(__file__).resolve().parents[2]
PREFIX = 2048  # bytes kept of each Pillow-made file


# ---- headers by hand ----


def segment(code: int, body: bytes) -> bytes:
    return bytes([0xFF, code]) + struct.pack(">H", len(body) + 2) + body


JFIF = segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
DQT = segment(0xDB, b"\x00" + bytes(range(1, 65)))
DHT = segment(0xC4, b"\x00\x01" + bytes(15) + b"\x00")
SCAN_DATA = b"\x12\x34\xff\x00\x56\xff\xd9"


def adobe(transform: int) -> bytes:
    return segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00" + bytes([transform]))


def frame(code: int = 0xC0, precision: int = 8, width: int = 32, height: int = 16,
          sampling: str = "22 11 11", ids: bytes | None = None) -> bytes:
    factors = sampling.split()
    ids = ids or bytes(range(1, len(factors) + 1))
    body = struct.pack(">BHHB", precision, height, width, len(factors))
    for i, hv in enumerate(factors):
        body += bytes([ids[i], int(hv[0]) << 4 | int(hv[1]), min(i, 1)])
    return segment(code, body)


def scan(ids: bytes) -> bytes:
    return segment(0xDA, bytes([len(ids)]) + b"".join(bytes([c, 0]) for c in ids) + b"\x00\x3f\x00")


def jpeg(code: int = 0xC0, precision: int = 8, width: int = 32, height: int = 16,
         sampling: str = "22 11 11", ids: bytes | None = None, jfif: bool = True,
         before: bytes = b"", after: bytes = b"") -> bytes:
    """SOI, [JFIF], `before`, DQT, SOFn, `after`, DHT, SOS, scan data, EOI."""
    ids = ids or bytes(range(1, len(sampling.split()) + 1))
    return (b"\xff\xd8" + (JFIF if jfif else b"") + before + DQT
            + frame(code, precision, width, height, sampling, ids) + after + DHT + scan(ids)
            + SCAN_DATA)


def valid_headers() -> list[bytes]:
    out = [jpeg(sampling=s) for s in ["11 11 11", "21 11 11", "22 11 11", "12 11 11",
                                      "41 11 11", "42 11 11", "31 11 11", "22 21 11"]]
    out += [jpeg(sampling="11", width=1, height=1), jpeg(sampling="22", width=7, height=5)]
    out += [jpeg(code=c, precision=p) for c, p in [(0xC1, 8), (0xC1, 12), (0xC2, 8), (0xC2, 12),
                                                   (0xC3, 16), (0xC3, 2), (0xC5, 8), (0xC7, 16),
                                                   (0xC9, 8), (0xCA, 12), (0xCB, 8), (0xCD, 8)]]
    out += [
        jpeg(sampling="11 11 11 11", jfif=False, before=adobe(0)),  # CMYK
        jpeg(sampling="22 11 11 22", jfif=False, before=adobe(2)),  # YCCK
        jpeg(sampling="11 11", jfif=False),
        jpeg(sampling="11 11 11", jfif=False, before=adobe(0)),  # RGB
        jpeg(sampling="11 11 11", jfif=False, after=adobe(0)),  # RGB, APP14 after the frame
        jpeg(sampling="11 11 11", jfif=False, ids=b"RGB"),
        jpeg(sampling="11 11 11", before=adobe(0)),  # JFIF wins: YCbCr
        jpeg(width=65535, height=65535),
        b"\xff\xd8" + segment(0xDE, frame(precision=8)[4:]) + jpeg(code=0xC1)[2:],  # DHP
        # fill bytes, standalone markers and the segments skipped on the way
        b"\xff\xd8\xff\xff\xff\xd0\xff\x01" + segment(0xFE, b"comment") + segment(0xCC, b"\x01\x10")
        + segment(0xDD, b"\x00\x04") + segment(0xDC, b"\x00\x10") + jpeg()[2:],
        # two 16-bit quantization tables and two Huffman tables in one segment each
        b"\xff\xd8" + segment(0xDB, b"\x10" + bytes(128) + b"\x11" + bytes(128))
        + segment(0xC4, b"\x00\x00\x02" + bytes(16) + b"\x11\x00\x02" + bytes(16)) + jpeg()[2:],
    ]
    return out


def malformed_headers() -> list[bytes]:
    good = jpeg()
    sof_at = good.index(b"\xff\xc0")
    sos_at = good.index(b"\xff\xda")
    out = [b"", b"\xff", b"\xff\xd8", b"\x89PNG\r\n\x1a\n", b"\xff\xd8" + b"\xff" * 40,
           b"\xff\xd8\xff\xd9", b"\xff\xd8\xff\xd8", good[:2] + good[sos_at:],  # scan first
           good[:sof_at] + good[sof_at + 19:],  # no frame header
           b"\xff\xd8\xff\xe0\x00\x00", b"\xff\xd8\xff\xdb\x00\x01",  # lengths 0 and 1
           b"\xff\xd8\xff\xe1\xff\xff" + bytes(100),  # a huge length
           good[:sof_at] + b"\x00" + good[sof_at:], good[:sof_at] + b"\xff\x00" + good[sof_at:]]
    out += [good[:cut] for cut in (4, 21, sof_at + 5, sof_at + 18, sos_at, sos_at + 13)]
    out += [good[:sof_at] + bytes([0xFF, m]) + good[sof_at:] for m in (0xC8, 0xF7, 0x02, 0xD8)]
    out += [jpeg(height=0), jpeg(width=0), jpeg(precision=12), jpeg(code=0xC3, precision=17)]
    out += [jpeg(sampling="22 01 11"), jpeg(sampling="22 11 15")]
    out += [
        good[:sof_at] + frame()[:9] + b"\x00" + good[sof_at + 10:],  # 0 components
        good[:sof_at] + frame(sampling="11 11 11 11 11") + good[sof_at + 19:],  # 5 components
        good[:sof_at] + frame()[:-1] + b"\x04" + good[sof_at + 19:],  # quantization table 4
        good[:sos_at] + segment(0xDA, b"\x01\x09\x00\x00\x3f\x00") + SCAN_DATA,  # no such id
        good[:sos_at] + segment(0xDA, b"\x02\x02\x00\x02\x11\x00\x3f\x00") + SCAN_DATA,
        good[:sos_at] + segment(0xDA, b"\x00\x00\x3f\x00") + SCAN_DATA,
        good[:sos_at] + segment(0xDA, b"\x04" + b"\x01\x00\x02\x11\x03\x11\x04\x11" + b"\x00\x3f\x00")
        + SCAN_DATA,  # more components than the frame
        good[:sof_at] + segment(0xC0, frame(sampling="11")[4:] + b"\x00") + DHT + scan(b"\x01"),
        jpeg(ids=b"\x01\x01\x03")[:sos_at] + scan(b"\x03") + SCAN_DATA,  # a repeated id
        good[:sof_at] + segment(0xDB, b"\x24" + bytes(64)) + good[sof_at:],
        good[:sof_at] + segment(0xC4, b"\x10" + bytes([17] * 16) + bytes(272)) + good[sof_at:],
        good[:sof_at] + segment(0xDD, b"\x00\x04\x00") + good[sof_at:],
        good[:sof_at + 19] + frame(code=0xC2) + good[sof_at + 19:],  # a second frame
        good[:sof_at + 19] + segment(0xDE, frame()[4:]) + good[sof_at + 19:],  # DHP after it
        good[:sof_at + 19] + b"\xff\xd9",  # EOI before the scan
    ]
    return out


# ---- headers from Pillow ----


def pillow_jpegs() -> list[bytes]:
    rgb = Image.fromarray(natural(48, 64, seed=1))
    icc = b"\x00" * 128 + b"acsp" + bytes(300)
    exif = Image.Exif()
    exif[0x010F] = "fastloop"
    out = []
    for image, options in [
        (rgb, {"quality": 90}),
        (rgb, {"quality": 75, "subsampling": 0}),
        (rgb, {"quality": 50, "subsampling": 1}),
        (rgb, {"progressive": True}),
        (rgb, {"progressive": True, "subsampling": 0, "optimize": True}),
        (rgb.convert("L"), {}),
        (rgb.convert("L"), {"progressive": True}),
        (rgb.convert("CMYK"), {}),
        (rgb, {"keep_rgb": True}),
        (rgb, {"restart_marker_blocks": 2, "comment": "restarts"}),
        (rgb, {"exif": exif.tobytes(), "icc_profile": icc, "dpi": (300, 300)}),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", **options)
        out.append(buffer.getvalue()[:PREFIX])
    return out


def write_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for data in valid_headers() + malformed_headers() + pillow_jpegs():
        (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


# ---- --compare: the parser against Pillow and libjpeg ----


class Header(ctypes.Structure):
    _fields_ = [("width", ctypes.c_uint32), ("height", ctypes.c_uint32),
                ("components", ctypes.c_int), ("precision", ctypes.c_int),
                ("process", ctypes.c_int), ("component_id", ctypes.c_uint8 * 4),
                ("h_sampling", ctypes.c_uint8 * 4), ("v_sampling", ctypes.c_uint8 * 4),
                ("adobe_transform", ctypes.c_int), ("jfif", ctypes.c_int),
                ("frame_offset", ctypes.c_size_t), ("scan_offset", ctypes.c_size_t)]


PROCESSES = ["baseline", "extended", "progressive", "lossless", "hierarchical", "arithmetic"]
ROUTES = ["hardware", "cuda", "cpu"]


def load_parser(tmp: Path) -> ctypes.CDLL:
    lib = tmp / "libjpeg_header.so"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", f"-I{ROOT / 'csrc'}",
                    "-o", str(lib), str(ROOT / "csrc/data/fl_jpeg_header.c"),
                    str(ROOT / "csrc/base/fl_error.c")], check=True)
    parser = ctypes.CDLL(str(lib))
    parser.fl_jpeg_header_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.POINTER(Header)]
    parser.fl_jpeg_route_of.argtypes = [ctypes.POINTER(Header),
                                        ctypes.POINTER(ctypes.c_char_p)]
    parser.fl_error_detail.restype = ctypes.c_char_p
    return parser


def random_pillow(rng: random.Random) -> tuple[bytes, str, str]:
    """A random JPEG from Pillow, what it is, and the route it must take."""
    w, h = rng.randint(1, 700), rng.randint(1, 700)
    mode = rng.choice(["RGB", "RGB", "RGB", "L", "CMYK"])
    image = Image.fromarray(natural(h, w, seed=rng.randrange(1 << 30))).convert(mode)
    options = {"quality": rng.randint(1, 100), "progressive": rng.random() < 0.3,
               "optimize": rng.random() < 0.3, "subsampling": rng.choice([0, 1, 2])}
    if rng.random() < 0.2:
        options["restart_marker_rows"] = rng.randint(1, 4)
    if rng.random() < 0.2:
        options["comment"] = "x" * rng.randint(0, 200)
    keep_rgb = mode == "RGB" and rng.random() < 0.1
    if keep_rgb:
        options.update(keep_rgb=True, subsampling=0)  # Pillow subsamples only YCbCr
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    data = buffer.getvalue()
    if options["progressive"] or mode == "CMYK" or keep_rgb:
        route = "cpu"
    else:
        route = "hardware"
    return data, f"pillow {mode} {options}", route


CJPEG_SAMPLING = {"1x1": "hardware", "2x1": "hardware", "2x2": "hardware", "1x2": "hardware",
                  "4x1": "cuda", "4x2": "cuda", "3x1": "cpu", "1x4": "cpu"}


def random_cjpeg(rng: random.Random, cjpeg: str, tmp: Path) -> tuple[bytes, str, str]:
    """A random JPEG from libjpeg-turbo's cjpeg: the samplings, arithmetic coding, RGB and
    extended (SOF1) frames that Pillow does not write."""
    w, h = rng.randint(1, 500), rng.randint(1, 500)
    source = tmp / "in.ppm"
    Image.fromarray(natural(h, w, seed=rng.randrange(1 << 30))).save(source)
    sampling = rng.choice(list(CJPEG_SAMPLING))
    extended = rng.random() < 0.1  # quality <= 10 without -baseline: 16-bit tables, SOF1
    quality = rng.randint(1, 10) if extended else rng.randint(1, 100)
    args = ["-quality", str(quality), "-sample", sampling] + ([] if extended else ["-baseline"])
    args += rng.choice([[], [], ["-progressive"], ["-arithmetic"], ["-optimize"]])
    args += rng.choice([[], [], [], ["-rgb"], ["-grayscale"]])
    if rng.random() < 0.2:
        args += ["-restart", f"{rng.randint(1, 8)}B"]
    if "-progressive" in args or "-arithmetic" in args or "-rgb" in args:
        route = "cpu"
    elif "-grayscale" in args:
        route = "cuda" if extended else "hardware"
    elif CJPEG_SAMPLING[sampling] == "hardware" and extended:
        route = "cuda"
    else:
        route = CJPEG_SAMPLING[sampling]
    data = subprocess.run([cjpeg, *args, str(source)], check=True, capture_output=True).stdout
    return data, "cjpeg " + " ".join(args), route


def pillow_view(data: bytes) -> dict:
    """What Pillow's own marker reader and libjpeg's decode say about the file."""
    with Image.open(io.BytesIO(data)) as im:
        view = {"size": im.size, "components": len(im.layer), "precision": im.bits,
                "progressive": bool(im.info.get("progressive")),
                "sampling": [(h, v) for _, h, v, _ in im.layer],
                "ids": [c for c, _, _, _ in im.layer],
                "adobe_transform": im.info.get("adobe_transform", -1),
                "jfif": "jfif" in im.info, "get_sampling": JpegImagePlugin.get_sampling(im)}
        im.load()  # libjpeg decodes the whole image at that size
        view["decoded"] = im.size
    return view


def ours_view(parser: ctypes.CDLL, data: bytes) -> tuple[dict | None, str, str]:
    h = Header()
    if parser.fl_jpeg_header_parse(data, len(data), ctypes.byref(h)) != 0:
        return None, parser.fl_error_detail().decode(), ""
    why = ctypes.c_char_p()
    route = ROUTES[parser.fl_jpeg_route_of(ctypes.byref(h), ctypes.byref(why))]
    n = h.components
    view = {"size": (h.width, h.height), "components": n, "precision": h.precision,
            "progressive": data[h.frame_offset + 1] in (0xC2, 0xC6, 0xCA, 0xCE),
            "sampling": [(h.h_sampling[i], h.v_sampling[i]) for i in range(n)],
            "ids": list(h.component_id[:n]), "adobe_transform": h.adobe_transform,
            "jfif": bool(h.jfif), "process": PROCESSES[h.process]}
    return view, why.value.decode(), route


def compare(count: int, seed: int) -> int:
    rng = random.Random(seed)
    # Pillow sizes its progressive encoder's buffer from the pixel count; noisy images at
    # quality 99 outgrow it ("Suspension not allowed here"). Its floor is MAXBLOCK.
    ImageFile.MAXBLOCK = 1 << 24
    cjpeg = shutil.which("cjpeg")
    mismatches, kinds = 0, {}
    with tempfile.TemporaryDirectory() as tmp:
        parser = load_parser(Path(tmp))
        for i in range(count):
            if cjpeg is not None and i % 3 == 2:
                data, what, want_route = random_cjpeg(rng, cjpeg, Path(tmp))
            else:
                data, what, want_route = random_pillow(rng)
            theirs = pillow_view(data)
            ours, why, route = ours_view(parser, data)
            problems = []
            if ours is None:
                problems.append(f"refused: {why}")
            else:
                for key in ["size", "components", "precision", "progressive", "sampling", "ids",
                            "adobe_transform", "jfif"]:
                    if ours[key] != theirs[key]:
                        problems.append(f"{key}: ours {ours[key]}, Pillow's {theirs[key]}")
                if ours["size"] != theirs["decoded"]:
                    problems.append(f"libjpeg decoded {theirs['decoded']}")
                if route != want_route:
                    problems.append(f"route {route} ({why}), wanted {want_route}")
                sampling = ",".join(f"{h}{v}" for h, v in ours["sampling"])
                key = (what.split()[0], ours["process"], sampling, route)
                kinds[key] = kinds.get(key, 0) + 1
            if problems:
                mismatches += 1
                print(f"MISMATCH {what} ({len(data)} bytes): " + "; ".join(problems))
    print(f"{'encoder':8} {'process':12} {'sampling':12} {'route':9} {'images':>6}")
    for (encoder, process, sampling, route), n in sorted(kinds.items()):
        print(f"{encoder:8} {process:12} {sampling:12} {route:9} {n:>6}")
    print(f"{count} JPEGs compared (seed {seed}, cjpeg {'used' if cjpeg else 'not found'}): "
          f"{mismatches} mismatches")
    return 1 if mismatches else 0


def main() -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("folder", nargs="?", type=Path)
    args.add_argument("--compare", type=int, metavar="N")
    args.add_argument("--seed", type=int, default=0)
    options = args.parse_args()
    if options.compare:
        return compare(options.compare, options.seed)
    if options.folder is None:
        args.error("give a folder to write the corpus to, or --compare N")
    write_corpus(options.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
