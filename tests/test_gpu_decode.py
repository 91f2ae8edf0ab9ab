"""Loader(decode="gpu"): on a GPU, nvJPEG's batches against the CPU path, the images it cannot
take, a file it refuses mid-batch, every output form, the counters saying which decoder ran
(skipped, with the reason, where there is no GPU or no nvJPEG). Everywhere: where libnvjpeg
is searched for, and decode="auto"'s rule. The staging side is tests/test_gpu_stage.py; the
decoder's host decisions are tests/c/test_jpeg_plan.c."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastloop
from fastloop.ops import Normalize, Pipeline, RandomHFlip, RandomResizedCrop, Resize, CenterCrop
from synthetic import natural_image

Image = pytest.importorskip("PIL.Image")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _nvjpeg_reason() -> str | None:
    if not fastloop.cuda.is_available():
        return f"no usable GPU: {fastloop.cuda.is_available().reason}"
    try:
        fastloop.cuda.load_nvjpeg()
    except fastloop.CudaUnavailable as error:
        return str(error)
    return None


needs_nvjpeg = pytest.mark.skipif(_nvjpeg_reason() is not None, reason=str(_nvjpeg_reason()))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    for c in range(2):
        (root / f"c{c}").mkdir()
    for i in range(40):
        image = Image.fromarray(natural_image(200 + 7 * i, 300 - 3 * i, i))
        image.save(root / f"c{i % 2}" / f"{i:02d}.jpg", quality=90, subsampling=[0, 1, 2][i % 3])
    Image.fromarray(natural_image(150, 120, 50)).save(root / "c0" / "50_progressive.jpg", progressive=True, quality=85)
    Image.fromarray(natural_image(90, 110, 51)).save(root / "c1" / "51.png")
    return root


def _pair(source, steps, **gpu_kwargs):
    aug = Pipeline([*steps, Normalize(MEAN, STD, layout="HWC->CHW")])
    cpu = fastloop.Loader(source, batch_size=14, transform=aug, seed=2, num_workers=2)
    gpu = fastloop.Loader(source, batch_size=14, transform=aug, seed=2, num_workers=2, device="cuda", decode="gpu",
                          **gpu_kwargs)
    return cpu, gpu


@needs_nvjpeg
@pytest.mark.parametrize("steps", [
    [RandomResizedCrop(64, reduced_decode=False), RandomHFlip()],
    [Resize(72, reduced_decode=False), CenterCrop(64)],
])
def test_gpu_decoded_batches_match_the_cpu_path_up_to_the_idct(folder: Path, steps):
    torch = pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, steps, output="torch")
    assert gpu._jpeg is not None
    diffs = []
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert dx.is_cuda and dx.dtype == torch.float32 and tuple(dx.shape) == x.shape
        assert dy.cpu().tolist() == y.tolist()
        diffs.append(np.abs(dx.cpu().numpy() - x))
    diff = np.concatenate(diffs)
    assert diff.mean() < 0.02 and diff.max() < 0.5  # a few levels of 255 where the IDCTs differ
    stats = gpu._jpeg.decode_stats
    assert stats["hardware"] + stats["fallback"] == 40 and stats["cpu_workers"] == 2  # progressive and PNG
    assert stats["cpu_main"] == 0 and stats["cpu"] == 2
    assert stats["engine_errors"] == 0 and stats["demotions"] == 0
    if stats["has_engine"]:  # each image asked: only the ones the engine refuses leave it
        assert stats["hardware"] > 0 and stats["regions"] <= stats["hardware"]
    else:
        assert stats["hardware"] == 0 and stats["regions"] == 0
    major, minor = stats["nvjpeg_version"]
    assert bool(stats["fallback_flags"] & 32) == ((major, minor) >= (12, 1)), stats  # interpolated upsampling
    gpu.close()


@needs_nvjpeg
def test_what_the_cpu_decodes_is_exactly_the_cpu_paths(folder: Path):
    pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(32), RandomHFlip()], output="torch")
    names = [Path(p).name for p, _ in source.samples]
    on_cpu = [i for i, n in enumerate(names) if n.endswith(("progressive.jpg", ".png"))]
    x = np.concatenate([b for b, _ in cpu])
    dx = np.concatenate([b.cpu().numpy() for b, _ in gpu])
    np.testing.assert_allclose(dx[on_cpu], x[on_cpu], rtol=0, atol=2e-6)


@needs_nvjpeg
@pytest.mark.parametrize("dtype, memory_format", [("bfloat16", "channels_last"), ("float16", None)])
def test_gpu_decode_into_bf16_channels_last_and_fp16(folder: Path, dtype, memory_format):
    torch = pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(48, reduced_decode=False)], output="torch", dtype=dtype,
                     memory_format=memory_format)
    for (x, _), (dx, _) in zip(cpu, gpu):
        assert dx.dtype == getattr(torch, dtype)
        if memory_format:
            assert dx.is_contiguous(memory_format=torch.channels_last)
        assert np.abs(dx.float().cpu().numpy() - x).mean() < 0.03


@needs_nvjpeg
def test_gpu_decode_into_device_arrays(folder: Path):
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(40, reduced_decode=False)])
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert isinstance(dx, fastloop.cuda.DeviceArray) and dx.shape == x.shape
        assert np.abs(dx.to_numpy() - x).mean() < 0.02
        np.testing.assert_array_equal(dy.to_numpy(), y)


@needs_nvjpeg
def test_a_jpeg_nvjpeg_refuses_is_decoded_by_the_cpu_path_or_fails_as_it_does(folder: Path, tmp_path: Path):
    """Valid headers, corrupt entropy-coded data: nvJPEG refuses it mid-batch; the image then
    takes the CPU path, which decodes it (libjpeg's warnings) or raises naming the sample."""
    pytest.importorskip("torch")
    (tmp_path / "a").mkdir()
    for i in range(6):
        data = (folder / "c0" / f"{2 * i:02d}.jpg").read_bytes()
        if i == 3:
            sos = data.index(b"\xff\xda")
            data = data[:sos + 40] + bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)) + b"\xff\xd9"
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    source = fastloop.ImageFolder(tmp_path)
    steps = [RandomResizedCrop(32, reduced_decode=False)]
    cpu, gpu = _pair(source, steps, output="torch")
    try:
        expected = next(iter(cpu))[0]
    except ValueError as error:
        with pytest.raises(ValueError, match="sample 3"):
            next(iter(gpu))
        skipping = _pair(source, steps, output="torch", on_error="skip")[1]
        assert len(next(iter(skipping))[0]) == 5, error
        return
    got = next(iter(gpu))[0].cpu().numpy()
    assert np.abs(got - expected).mean() < 0.05


@needs_nvjpeg
def test_many_batches_reuse_the_decoder_states_and_never_demote_on_refusals(folder: Path):
    """Batches of varying size (the last one short) through both double-buffered states: every
    image decoded, no engine error, the engine still on."""
    pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    gpu = _pair(source, [RandomResizedCrop(32, reduced_decode=False)], output="torch")[1]
    for _ in range(3):
        assert sum(len(x) for x, _ in gpu) == 42
    stats = gpu._jpeg.decode_stats
    assert stats["hardware"] + stats["fallback"] + stats["cpu"] == 3 * 42
    assert stats["demotions"] == 0 and stats["engine_on"] == stats["has_engine"]
    gpu.close()


# ---- no GPU needed ----

def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_nvjpeg_is_searched_in_wheels_torch_and_the_toolkit(tmp_path: Path):
    from fastloop.cuda import _libsearch

    site = tmp_path / "site-packages"
    wheel = _touch(site / "nvidia" / "nvjpeg" / "lib" / "libnvjpeg.so.12")
    cu13 = _touch(site / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13")
    torch_copy = _touch(site / "torch" / "lib" / "libnvjpeg.so.12")
    home = _touch(tmp_path / "cuda-home" / "lib64" / "libnvjpeg.so.12")
    path = _touch(tmp_path / "cuda-path" / "targets" / "x86_64-linux" / "lib" / "libnvjpeg.so.12")
    _touch(tmp_path / "cuda-home" / "lib64" / "libnvjpeg_static.a")  # not a shared library
    env = {"CUDA_HOME": str(tmp_path / "cuda-home"), "CUDA_PATH": str(tmp_path / "cuda-path"), "PATH": ""}
    found = _libsearch.candidates("nvjpeg", env=env, sites=[str(site)])
    paths = [p for p, _ in found]
    where = dict(found)
    # the newest major first, then wheels, torch, the toolkit
    assert paths == [str(cu13), str(wheel), str(torch_copy), str(home), str(path)]
    assert where[str(wheel)].startswith("nvidia-* wheel in") and where[str(torch_copy)].startswith("torch in")
    assert where[str(home)] == f"$CUDA_HOME ({tmp_path / 'cuda-home'})"
    assert where[str(path)] == f"$CUDA_PATH ({tmp_path / 'cuda-path'})"


def test_nvjpeg_search_finds_nothing_in_an_empty_layout_and_dedupes_links(tmp_path: Path):
    from fastloop.cuda import _libsearch

    empty = _libsearch.candidates("nvjpeg", env={"PATH": ""}, sites=[str(tmp_path)])
    assert not [p for p, _ in empty if p.startswith(str(tmp_path))]
    real = _touch(tmp_path / "cuda" / "lib64" / "libnvjpeg.so.12.4.0")
    (tmp_path / "cuda" / "lib64" / "libnvjpeg.so.12").symlink_to(real.name)
    found = _libsearch.candidates("nvjpeg", env={"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""}, sites=[])
    assert len([p for p, _ in found if p.startswith(str(tmp_path))]) == 1


def test_the_search_runs_as_a_script_without_fastloop_built(tmp_path: Path):
    import subprocess
    import sys

    _touch(tmp_path / "lib64" / "libnvjpeg.so.12")
    script = Path(fastloop.__file__).parent / "cuda" / "_libsearch.py"
    env = {"CUDA_HOME": str(tmp_path), "PATH": "", "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([sys.executable, "-S", str(script), "nvjpeg"], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert f"{tmp_path / 'lib64' / 'libnvjpeg.so.12'}\t$CUDA_HOME ({tmp_path})" in out.splitlines()


def test_auto_takes_the_engine_else_the_faster_of_the_fallback_and_the_workers(monkeypatch):
    if not fastloop.cuda.is_built():
        pytest.skip(f"no CUDA extension: {fastloop.cuda.is_built().reason}")
    from fastloop.data import _gpu_decode

    rate, fallback = _gpu_decode.CPU_RATE_PER_WORKER, _gpu_decode.FALLBACK_RATE
    assert _gpu_decode.auto_prefers_gpu(True, 64)
    fewest = int(fallback // rate)  # the most workers the fallback backend still outruns
    assert _gpu_decode.auto_prefers_gpu(False, fewest - 1 if fallback % rate == 0 else fewest)
    assert not _gpu_decode.auto_prefers_gpu(False, fewest + 1)
    monkeypatch.setenv("FASTLOOP_JPEG_FALLBACK_RATE", str(rate * 100))
    assert _gpu_decode.auto_prefers_gpu(False, 64)
    monkeypatch.setenv("FASTLOOP_JPEG_FALLBACK_RATE", "fast")
    with pytest.raises(ValueError, match="FASTLOOP_JPEG_FALLBACK_RATE must be a number"):
        _gpu_decode.auto_prefers_gpu(False, 1)
