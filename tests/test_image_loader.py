"""The Loader on encoded images: the fused decode -> crop -> resize -> flip -> normalize in C
threads against a Pillow + NumPy reference, determinism, and bad files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import fastloop
from fastloop import ops
from fastloop._core import _epoch_seed
from test_images import natural

Image = pytest.importorskip("PIL.Image")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class EncodedImages:
    """A test-local image source with the `_encoded_spec` contract (what ImageFolder,
    Images and TarShards expose): files, or byte ranges of one file."""

    def __init__(self, paths: list[str], offsets: list[int] | None = None, lengths: list[int] | None = None,
                 file_index: list[int] | None = None) -> None:
        self.paths = paths
        n = len(file_index) if file_index is not None else len(paths)
        self.file_index = np.asarray(file_index if file_index is not None else range(n), np.int32)
        self.offsets = np.asarray(offsets if offsets is not None else [0] * n, np.int64)
        self.lengths = np.asarray(lengths if lengths is not None else [-1] * n, np.int64)
        self.targets = [i % 3 for i in range(n)]

    def __len__(self) -> int:
        return len(self.file_index)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        with open(self.paths[self.file_index[i]], "rb") as f:
            f.seek(int(self.offsets[i]))
            data = f.read() if self.lengths[i] < 0 else f.read(int(self.lengths[i]))
        return fastloop.images.decode(data), self.targets[i]

    def _encoded_spec(self) -> tuple:
        return [os.fsencode(os.path.abspath(p)) for p in self.paths], self.file_index, self.offsets, self.lengths


def write_images(folder: Path, count: int, fmt: str = "JPEG", big: bool = False) -> list[str]:
    paths = []
    for i in range(count):
        h, w = (600 + 13 * i, 800 - 11 * i) if big else (90 + 17 * (i % 5), 120 + 13 * (i % 7))
        path = folder / f"{i:03d}.{'jpg' if fmt == 'JPEG' else 'png'}"
        Image.fromarray(natural(h, w, seed=i)).save(path, fmt, quality=90)
        paths.append(str(path))
    return paths


def normalize(u8: np.ndarray) -> np.ndarray:
    return ((u8.astype(np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1)


def pillow_eval(path: str, resize: int, crop: int) -> np.ndarray:
    image = Image.open(path).convert("RGB")
    w, h = image.size
    if w <= h:
        size = (resize, int(resize * h / w))
    else:
        size = (int(resize * w / h), resize)
    image = image.resize(size, Image.BILINEAR)
    left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
    return np.asarray(image.crop((left, top, left + crop, top + crop)))


def all_batches(loader: fastloop.Loader) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = zip(*[(np.array(x), np.array(y)) for x, y in loader])
    return np.concatenate(xs), np.concatenate(ys)


TOL = 1.0 / 255 / min(STD) + 1e-5  # one step of uint8 after normalization


def test_eval_pipeline_matches_pillow_resize_and_center_crop(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 10)
    pipeline = ops.Pipeline([ops.Resize(64, reduced_decode=False), ops.CenterCrop(56),
                             ops.Normalize(MEAN, STD, layout="HWC->CHW")])
    with fastloop.Loader(EncodedImages(paths), batch_size=4, num_workers=2, transform=pipeline) as loader:
        x, y = all_batches(loader)
    assert x.shape == (10, 3, 56, 56) and x.dtype == np.float32
    assert y.tolist() == [i % 3 for i in range(10)] and y.dtype == np.int64
    for i, path in enumerate(paths):
        np.testing.assert_allclose(x[i], normalize(pillow_eval(path, 64, 56)), atol=TOL)


def test_train_pipeline_matches_pillow_crop_resize_flip(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 8)
    rrc = ops.RandomResizedCrop(48, reduced_decode=False)
    pipeline = ops.Pipeline([rrc, ops.RandomHFlip(p=1.0), ops.Normalize(MEAN, STD, layout="HWC->CHW")])
    with fastloop.Loader(EncodedImages(paths), batch_size=3, num_workers=2, seed=11, transform=pipeline) as loader:
        x, _ = all_batches(loader)
    seed = _epoch_seed(11, 0)
    for i, path in enumerate(paths):
        image = Image.open(path).convert("RGB")
        top, left, h, w = rrc.params(image.height, image.width, seed=seed, index=i)
        ref = np.asarray(image.crop((left, top, left + w, top + h)).resize((48, 48), Image.BILINEAR))[:, ::-1]
        np.testing.assert_allclose(x[i], normalize(ref), atol=TOL)


def test_results_do_not_depend_on_worker_count_and_change_with_the_epoch(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 12)
    pipeline = ops.Pipeline([ops.RandomResizedCrop(32), ops.RandomHFlip(), ops.Normalize(MEAN, STD)])
    runs = []
    for workers in (0, 1, 3):
        with fastloop.Loader(EncodedImages(paths), batch_size=5, num_workers=workers, shuffle=True, seed=4,
                             transform=pipeline) as loader:
            runs.append([all_batches(loader) for _ in range(2)])  # epochs 0 and 1
    for run in runs[1:]:
        for (x0, y0), (x1, y1) in zip(runs[0], run):
            np.testing.assert_array_equal(x0, x1)
            np.testing.assert_array_equal(y0, y1)
    assert not np.array_equal(runs[0][0][0], runs[0][1][0])


def test_reduced_decode_stays_close_to_the_full_decode(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 3, big=True)  # ~800x600 to 64x64: JPEG decodes at 1/4 or 1/8
    results = {}
    for reduced in (False, True):
        pipeline = ops.Pipeline([ops.RandomResizedCrop(64, scale=(0.5, 1.0), reduced_decode=reduced)])
        with fastloop.Loader(EncodedImages(paths), batch_size=3, transform=pipeline) as loader:
            results[reduced] = all_batches(loader)[0].astype(np.int16)
    difference = np.abs(results[True] - results[False])
    assert difference.mean() < 3 and np.percentile(difference, 99) < 16


def test_png_sources_and_byte_ranges_of_one_file(tmp_path: Path) -> None:
    pngs = write_images(tmp_path, 3, fmt="PNG")
    blob, offsets, lengths = tmp_path / "shard.bin", [], []
    with open(blob, "wb") as out:
        out.write(b"header bytes")
        for path in pngs:
            data = Path(path).read_bytes()
            offsets.append(out.tell())
            lengths.append(len(data))
            out.write(data + b"padding")
    pipeline = ops.Pipeline([ops.Resize((40, 30))])
    with fastloop.Loader(EncodedImages([str(blob)], offsets, lengths, [0, 0, 0]), batch_size=3,
                         transform=pipeline) as loader:
        x, _ = all_batches(loader)
    for i, path in enumerate(pngs):
        ref = np.asarray(Image.open(path).convert("RGB").resize((30, 40), Image.BILINEAR))
        assert np.abs(x[i].astype(int) - ref).max() <= 1


def test_without_a_size_fixing_step_the_error_names_the_steps_to_add(tmp_path: Path) -> None:
    source = EncodedImages(write_images(tmp_path, 2))
    for transform in (None, ops.Pipeline([ops.Normalize(MEAN, STD)]), ops.Pipeline([ops.Resize(64)])):
        with pytest.raises(ValueError, match="different sizes.*RandomResizedCrop"):
            fastloop.Loader(source, batch_size=2, transform=transform, mode="threads")


def test_a_truncated_file_fails_at_its_batch_naming_path_index_and_decoder_message(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 9)
    data = Path(paths[7]).read_bytes()
    Path(paths[7]).write_bytes(data[: len(data) // 2])
    pipeline = ops.Pipeline([ops.RandomResizedCrop(32)])
    with fastloop.Loader(EncodedImages(paths), batch_size=3, num_workers=2, transform=pipeline) as loader:
        it = iter(loader)
        assert next(it)[0].shape == (3, 32, 32, 3)
        assert next(it)[0].shape == (3, 32, 32, 3)  # earlier batches are delivered
        with pytest.raises(fastloop.DecodeError, match=r"sample 7: .*007\.jpg: libjpeg: truncated"):
            next(it)


@pytest.mark.parametrize("content,message", [(b"", "0 bytes"), (b"<html>not an image</html>", "not a JPEG or PNG")])
def test_empty_and_non_image_files_name_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    paths = write_images(tmp_path, 2)
    Path(paths[1]).write_bytes(content)
    with fastloop.Loader(EncodedImages(paths), batch_size=1, transform=ops.Pipeline([ops.RandomResizedCrop(8)])) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(fastloop.DecodeError, match=rf"sample 1: .*001\.jpg: .*{message}"):
            next(it)


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    source = EncodedImages([str(tmp_path / "gone.jpg")])
    with fastloop.Loader(source, batch_size=1, transform=ops.Pipeline([ops.RandomResizedCrop(8)])) as loader:
        with pytest.raises(FileNotFoundError, match="gone.jpg"):
            next(iter(loader))


def test_tiny_and_one_pixel_images_upscale_to_the_crop(tmp_path: Path) -> None:
    paths = []
    for i, shape in enumerate([(1, 1), (5, 3), (20, 30)]):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(natural(*shape, seed=i)).save(paths[-1])
    with fastloop.Loader(EncodedImages(paths), batch_size=3,
                         transform=ops.Pipeline([ops.Resize(24), ops.CenterCrop(24)])) as loader:
        x, _ = all_batches(loader)
    assert x.shape == (3, 24, 24, 3)
    assert (x[0] == natural(1, 1, seed=0)[0, 0]).all()


def test_an_image_over_the_pixel_cap_fails_with_the_cap_in_the_message(tmp_path: Path) -> None:
    from test_images import with_size

    paths = write_images(tmp_path, 1)
    Path(paths[0]).write_bytes(with_size(Path(paths[0]).read_bytes(), 16384, 16384))
    with fastloop.Loader(EncodedImages(paths), batch_size=1, transform=ops.Pipeline([ops.RandomResizedCrop(8)])) as loader:
        with pytest.raises(ValueError, match="sample 0: .*pixel cap"):
            next(iter(loader))


def test_processes_mode_decodes_through_the_sources_getitem(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 4)
    for p in paths:  # same size everywhere so samples stack without a transform
        Image.fromarray(natural(40, 50)).save(p, quality=95)
    with fastloop.Loader(EncodedImages(paths), batch_size=2, num_workers=1, mode="processes") as loader:
        x, y = all_batches(loader)
    assert x.shape == (4, 40, 50, 3) and y.tolist() == [0, 1, 2, 0]


def test_skip_drops_bad_samples_counts_and_logs_them_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = write_images(tmp_path, 10)
    Path(paths[2]).write_bytes(b"")
    Path(paths[5]).write_bytes(Path(paths[5]).read_bytes()[:200])
    source = EncodedImages(paths)
    pipeline = ops.Pipeline([ops.RandomResizedCrop(16)])
    with caplog.at_level("WARNING", logger="fastloop"):
        with fastloop.Loader(source, batch_size=4, num_workers=2, transform=pipeline, on_error="skip") as loader:
            batches = [(np.array(x), np.array(y)) for x, y in loader]
            skipped = loader.stats()["skipped"]
    assert [len(y) for _, y in batches] == [3, 3, 2]  # shorter, not refilled
    assert np.concatenate([y for _, y in batches]).tolist() == [source.targets[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)]
    assert skipped == 2
    assert len([r for r in caplog.records if "skipped a sample" in r.getMessage()]) == 1
    # two workers: whichever bad sample a worker met first is the one named
    assert re.search(r"sample 2: \S*002\.jpg|sample 5: \S*005\.jpg", caplog.text), caplog.text


def test_skip_drops_a_batch_with_nothing_left_and_matches_the_good_samples(tmp_path: Path) -> None:
    paths = write_images(tmp_path, 6)
    for i in (2, 3):
        Path(paths[i]).write_bytes(b"not an image")
    pipeline = ops.Pipeline([ops.Resize(20), ops.CenterCrop(20)])
    with fastloop.Loader(EncodedImages(paths), batch_size=2, transform=pipeline, on_error="skip") as loader:
        x, _ = all_batches(loader)
    good = EncodedImages([paths[i] for i in (0, 1, 4, 5)])
    with fastloop.Loader(good, batch_size=2, transform=pipeline) as loader:
        ref, _ = all_batches(loader)
    np.testing.assert_array_equal(x, ref)


def test_on_error_is_checked(tmp_path: Path) -> None:
    source = EncodedImages(write_images(tmp_path, 2))
    with pytest.raises(ValueError, match="'on_error'"):
        fastloop.Loader(source, transform=ops.Pipeline([ops.RandomResizedCrop(8)]), on_error="ignore")
    with pytest.raises(ValueError, match="mode='threads'"):
        fastloop.Loader(source, num_workers=1, mode="processes", on_error="skip")


@pytest.mark.parametrize("reduced", [False, True])
def test_draws_depend_only_on_seed_epoch_and_index_in_threads_and_processes(tmp_path: Path, reduced: bool) -> None:
    paths = write_images(tmp_path, 7, big=reduced)  # big: the threads decode at a DCT scale
    pipeline = ops.Pipeline([ops.RandomResizedCrop(24, reduced_decode=reduced), ops.RandomHFlip(),
                             ops.Normalize(MEAN, STD, layout="HWC->CHW")])
    runs = {}
    for mode, workers in (("threads", 1), ("threads", 2), ("processes", 2)):
        with fastloop.Loader(EncodedImages(paths), batch_size=3, num_workers=workers, mode=mode, shuffle=True,
                             seed=9, transform=pipeline) as loader:
            runs[mode, workers] = [all_batches(loader) for _ in range(2)]  # epochs 0 and 1
    for key in (("threads", 2), ("processes", 2)):
        for (x0, y0), (x1, y1) in zip(runs["threads", 1], runs[key]):
            np.testing.assert_array_equal(y0, y1)
            if key[0] == "threads" or not reduced:
                np.testing.assert_array_equal(x0, x1)
            else:  # processes decode whole images (src[i]): no DCT scaling, so close, not equal
                assert np.abs(x0 - x1).mean() < 3 * TOL
    assert not np.array_equal(runs["threads", 1][0][0], runs["threads", 1][1][0])


def test_processes_mode_needs_a_fixed_size_from_the_first_step(tmp_path: Path) -> None:
    source = EncodedImages(write_images(tmp_path, 2))
    with pytest.raises(ValueError, match=r"Resize\(32\) gives images of different sizes"):
        fastloop.Loader(source, batch_size=2, num_workers=1, mode="processes", transform=ops.Pipeline([ops.Resize(32)]))


@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (30, 20)])
def test_jpegs_smaller_than_the_crop_upscale_as_pillow_does(tmp_path: Path, shape: tuple[int, int]) -> None:
    path = str(tmp_path / "small.jpg")
    Image.fromarray(natural(*shape, seed=3)).save(path, quality=95)
    rrc = ops.RandomResizedCrop(48)
    with fastloop.Loader(EncodedImages([path]), batch_size=1, seed=2,
                         transform=ops.Pipeline([rrc, ops.Normalize(MEAN, STD, layout="HWC->CHW")])) as loader:
        x, _ = all_batches(loader)
    image = Image.open(path).convert("RGB")
    top, left, h, w = rrc.params(image.height, image.width, seed=_epoch_seed(2, 0), index=0)
    ref = np.asarray(image.crop((left, top, left + w, top + h)).resize((48, 48), Image.BILINEAR))
    np.testing.assert_allclose(x[0], normalize(ref), atol=TOL)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_corrupt_file_fails_at_its_batch_naming_path_index_and_decoder_message(tmp_path: Path, fmt: str) -> None:
    paths = write_images(tmp_path, 4, fmt=fmt)
    data = bytearray(Path(paths[3]).read_bytes())
    if fmt == "JPEG":
        data[data.index(b"\xff\xc0") + 9] = 7  # 7 components: libjpeg refuses the frame header
    else:
        idat = data.index(b"IDAT")
        data[idat + 10: idat + 30] = bytes(20)  # the IDAT's CRC no longer holds
    Path(paths[3]).write_bytes(bytes(data))
    decoder = "libjpeg" if fmt == "JPEG" else "libpng"
    with fastloop.Loader(EncodedImages(paths), batch_size=3, transform=ops.Pipeline([ops.RandomResizedCrop(16)])) as loader:
        it = iter(loader)
        assert next(it)[0].shape == (3, 16, 16, 3)
        with pytest.raises(ValueError, match=rf"sample 3: .*003\.{'jpg' if fmt == 'JPEG' else 'png'}: {decoder}: "):
            next(it)
