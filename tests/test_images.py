"""fastloop.images: JPEG/PNG decoding in C against Pillow, and the bad inputs."""

from __future__ import annotations

import io
import struct
import threading
import zlib

import numpy as np
import pytest

import fastloop
from fastloop import images

Image = pytest.importorskip("PIL.Image")


def natural(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients, edges and noise: content whose decode looks like a photo's."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 127 // max(h + w - 2, 1))], -1)
    base[(x // 17 + y // 23) % 2 == 0] //= 2
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode(image: "Image.Image", fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def pillow_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


JPEG_CASES = {
    "rgb_q90": lambda: encode(Image.fromarray(natural(375, 500)), "JPEG", quality=90),
    "rgb_444": lambda: encode(Image.fromarray(natural(101, 67)), "JPEG", quality=95, subsampling=0),
    "progressive": lambda: encode(Image.fromarray(natural(120, 160)), "JPEG", progressive=True),
    "grayscale": lambda: encode(Image.fromarray(natural(64, 80)[..., 0]), "JPEG"),
    "cmyk": lambda: encode(Image.fromarray(natural(48, 40)).convert("CMYK"), "JPEG"),
    "one_pixel": lambda: encode(Image.fromarray(natural(1, 1)), "JPEG"),
}


@pytest.mark.parametrize("case", sorted(JPEG_CASES))
def test_jpeg_decodes_as_pillow_converts_to_rgb(case: str) -> None:
    data = JPEG_CASES[case]()
    got = images.decode(data)
    ref = pillow_rgb(data)
    assert got.shape == ref.shape and got.dtype == np.uint8
    # libjpeg-turbo (2.1.5 linked into the wheels, 3.x in Pillow) gives the same pixels, to 1 level
    assert np.abs(got.astype(int) - ref).max() <= 1
    assert np.mean(got == ref) > 0.999


def png_16bit_gray() -> bytes:
    return encode(Image.fromarray((np.arange(40 * 30, dtype=np.uint16).reshape(30, 40) * 7)), "PNG")


def png_raw(width: int, height: int, depth: int, color: int, rows: bytes) -> bytes:
    """A PNG written by hand, for formats Pillow does not write (16-bit RGB, gray+alpha 16)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def png_16bit_rgb() -> bytes:
    pixels = np.random.default_rng(1).integers(0, 65535, (9, 7, 3), dtype=np.uint16).astype(">u2")
    return png_raw(7, 9, 16, 2, b"".join(b"\x00" + row.tobytes() for row in pixels))


PNG_CASES = {
    "rgb": lambda: encode(Image.fromarray(natural(60, 70)), "PNG"),
    # (Pillow infers RGBA and LA from the shape; its mode argument is deprecated since 11.3)
    "rgba": lambda: encode(Image.fromarray(np.dstack([natural(33, 21), natural(33, 21, 5)[..., :1]])), "PNG"),
    "palette": lambda: encode(Image.fromarray(natural(50, 50)).convert("P"), "PNG"),
    "palette_transparency": lambda: encode(Image.fromarray(natural(20, 20)).convert("P"), "PNG", transparency=3),
    "grayscale": lambda: encode(Image.fromarray(natural(31, 17)[..., 1]), "PNG"),
    "gray_alpha": lambda: encode(Image.fromarray(natural(12, 9)[..., :2].copy()), "PNG"),
    "one_bit": lambda: encode(Image.fromarray(natural(16, 19)[..., 0] > 100), "PNG"),
    "gray_16bit": png_16bit_gray,
    "rgb_16bit": png_16bit_rgb,
    "interlaced": lambda: encode(Image.fromarray(natural(45, 38)), "PNG", interlace=1),
    "one_pixel": lambda: encode(Image.fromarray(natural(1, 1)), "PNG"),
}


@pytest.mark.parametrize("case", sorted(PNG_CASES))
def test_png_decodes_exactly_as_pillow_converts_to_rgb(case: str) -> None:
    data = PNG_CASES[case]()
    np.testing.assert_array_equal(images.decode(data), pillow_rgb(data))


def test_decode_reads_a_path_and_size_reads_the_header(tmp_path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(JPEG_CASES["rgb_q90"]())
    assert images.decode(path).shape == (375, 500, 3)
    assert images.size(str(path)) == (375, 500)


def test_info_names_the_decoders_and_where_they_come_from() -> None:
    info = images.info()
    assert "libjpeg-turbo" in info["jpeg"]["decoder"] and info["jpeg"]["path"]
    assert info["png"]["decoder"].startswith("libpng 1.6.")


def test_zero_byte_file_names_the_path(tmp_path) -> None:
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    with pytest.raises(fastloop.DecodeError, match=r"empty\.jpg.*0 bytes"):
        images.decode(path)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_image_raises_with_the_decoders_message(fmt: str) -> None:
    data = encode(Image.fromarray(natural(80, 90)), fmt)
    with pytest.raises(fastloop.DecodeError, match="truncated"):
        images.decode(data[: len(data) // 2])


def test_non_image_names_what_it_starts_with(tmp_path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("just some text")
    with pytest.raises(fastloop.DecodeError, match=r"notes\.png.*not a JPEG or PNG.*6a 75 73 74"):
        images.decode(path)


def test_corrupt_jpeg_raises_libjpegs_message() -> None:
    data = bytearray(JPEG_CASES["rgb_q90"]())
    sof = data.index(b"\xff\xc0")
    data[sof + 9] = 7  # component count 7: libjpeg refuses the frame header
    with pytest.raises(fastloop.DecodeError, match="libjpeg"):
        images.decode(bytes(data))


@pytest.mark.parametrize("call", [images.decode, images.size])
def test_decode_error_is_a_value_error_with_the_library_code(tmp_path, call) -> None:
    path = tmp_path / "cut.jpg"
    path.write_bytes(JPEG_CASES["rgb_q90"]()[:5])
    for data in (path, path.read_bytes()):  # a path is named in the message; the code stays
        with pytest.raises(fastloop.DecodeError) as raised:
            call(data)
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, fastloop.Error)
        assert raised.value.code == -14, raised.value.code  # FL_EDECODE


def test_an_image_over_the_pixel_cap_is_a_value_error_not_a_decode_error() -> None:
    huge = with_size(JPEG_CASES["rgb_q90"](), 16384, 16384)  # a valid header: the cap is a choice
    with pytest.raises(ValueError, match="pixel cap") as raised:
        images.decode(huge)
    assert not isinstance(raised.value, fastloop.DecodeError)


def with_size(data: bytes, height: int, width: int) -> bytes:
    """A JPEG whose frame header claims another size (nothing that large is ever decoded)."""
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9:]


def test_16k_by_16k_image_is_refused_by_the_pixel_cap_before_decoding() -> None:
    huge = with_size(JPEG_CASES["rgb_q90"](), 16384, 16384)
    with pytest.raises(ValueError, match=r"16384x16384 \(width x height\), more than the 134217728-pixel cap"):
        images.decode(huge)
    with pytest.raises(ValueError, match="pixel cap"):
        images.size(huge)


def test_set_max_pixels_lowers_and_restores_the_cap() -> None:
    data = JPEG_CASES["rgb_q90"]()
    try:
        images.set_max_pixels(100 * 100)
        with pytest.raises(ValueError, match="500x375"):
            images.decode(data)
    finally:
        images.set_max_pixels(images.MAX_PIXELS)
    assert images.decode(data).shape == (375, 500, 3)
    with pytest.raises(ValueError, match="'n'"):
        images.set_max_pixels(0)


def test_threads_decode_at_once_with_their_own_decoders() -> None:
    datas = [JPEG_CASES["rgb_q90"](), PNG_CASES["rgb"](), JPEG_CASES["cmyk"]()]
    refs = [images.decode(d) for d in datas]
    failures: list[str] = []

    def work() -> None:
        for _ in range(20):
            for d, r in zip(datas, refs):
                if not np.array_equal(images.decode(d), r):
                    failures.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_codec_unavailable_is_a_fastloop_error_and_a_runtime_error() -> None:
    assert issubclass(fastloop.CodecUnavailable, fastloop.Error)
    assert issubclass(fastloop.CodecUnavailable, RuntimeError)


def png_with_size(width: int, height: int) -> bytes:
    """A valid PNG signature and IHDR claiming width x height (its CRC right), then 1 row."""
    return png_raw(width, height, 8, 2, b"\x00" + b"\x80" * 3 * min(width, 64))


def test_16k_by_16k_png_is_refused_by_the_pixel_cap_before_decoding() -> None:
    huge = png_with_size(16384, 16384)
    with pytest.raises(ValueError, match=r"16384x16384 \(width x height\), more than the 134217728-pixel cap"):
        images.decode(huge)
    with pytest.raises(ValueError, match="pixel cap"):
        images.size(huge)


def test_corrupt_png_raises_libpngs_message() -> None:
    data = bytearray(PNG_CASES["rgb"]())
    idat = data.index(b"IDAT")
    data[idat + 10: idat + 30] = bytes(20)  # zeroed deflate stream: the IDAT CRC no longer holds
    with pytest.raises(ValueError, match="libpng"):
        images.decode(bytes(data))


def test_exif_orientation_is_ignored_as_torchvisions_loader_ignores_it() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": PIL.Image.open does not apply it either
    pixels = natural(40, 64)
    data = encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes())
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6
    got = images.decode(data)
    assert got.shape == (40, 64, 3)
    assert np.abs(got.astype(int) - pillow_rgb(data)).max() <= 1


def test_without_any_codec_fastloop_imports_and_image_use_says_what_to_install(tmp_path) -> None:
    import subprocess
    import sys

    jpeg = tmp_path / "a.jpg"
    jpeg.write_bytes(JPEG_CASES["rgb_q90"]())
    # A build with no codec linked in and a machine with no system libjpeg/libpng.
    code = f"""
import os, numpy as np, fastloop
from fastloop import images, ops
images.candidates = lambda fmt: [("the system library", "/nonexistent/lib" + fmt + ".so")]
info = images.info()
assert info["jpeg"] is None and info["png"] is None, info
assert "fastloop wheel" in info["jpeg_missing"] and "/nonexistent/libjpeg.so" in info["jpeg_missing"], info
for call in (lambda: images.decode({str(jpeg)!r}), lambda: images.size({str(jpeg)!r})):
    try:
        call()
    except fastloop.CodecUnavailable as error:
        assert "no JPEG or PNG decoder is installed" in str(error) and "fastloop wheel" in str(error), error
    else:
        raise AssertionError("decoded without a codec")

class Files:
    targets = [0]
    def __len__(self): return 1
    def _encoded_spec(self):
        return [os.fsencode({str(jpeg)!r})], np.zeros(1, np.int32), np.zeros(1, np.int64), np.full(1, -1, np.int64)
try:
    fastloop.Loader(Files(), batch_size=1, transform=ops.Pipeline([ops.RandomResizedCrop(8)]))
except fastloop.CodecUnavailable as error:
    assert "fastloop wheel" in str(error), error
else:
    raise AssertionError("a Loader over images started without a codec")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
