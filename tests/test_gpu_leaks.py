"""GPU memory does not leak with batches: Loader(device="cuda") runs for a few batches and for
many, each in its own process under compute-sanitizer's memcheck with --leak-check full (the two
at once); what is still allocated at exit must not grow with the batches, and no access may be
invalid (where a GPU and compute-sanitizer exist: `benchmarks/gpu_check.sh --sanitize` runs this
file). The parser of the sanitizer's report is tested everywhere.

The workload (this file run as a script, `--run N [--torch]`): uint8 images through a Pipeline
(crop, flip, Normalize on the GPU) handed out as fastloop.cuda.DeviceArrays (fastloop's own
allocations), JPEG files decoded by nvJPEG (decode="gpu", where it loads); with --torch also torch
CUDA tensors in bf16 channels_last (torch's allocator, its cache emptied at the end). Without
--torch it never imports torch (its last line says so, and the test checks it): torch's start
under compute-sanitizer alone takes minutes, so the test leaves it out unless
FASTLOOP_LEAKS_TORCH=1. What the CUDA libraries allocate once may be reported as leaked in every
run: a leak is what grows with the batches. `--parse LOG` prints the report of a sanitizer log
(exit status 1 on an error other than a leak, or a log without the sanitizer's summary).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
LEAKED = re.compile(r"^=+ Leaked ([\d,]+) bytes", re.MULTILINE)
ERRORS = re.compile(r"^=+ ERROR SUMMARY: ([\d,]+) error", re.MULTILINE)
RUN_TIMEOUT_S = 100.0  # the two sanitized runs, side by side (gpu_check.sh --sanitize gives the test 130 s)
FEW, MANY = 4, 16  # batches


@dataclass
class Report:
    """What compute-sanitizer said about one run."""

    leaked_bytes: int
    leaks: int  # allocations still held at exit
    other_errors: int  # invalid accesses, API errors: anything but a leak
    finished: bool  # False: the output has no ERROR SUMMARY (a crash, a timeout)

    def __str__(self) -> str:
        if not self.finished:
            return "no ERROR SUMMARY: the run did not finish"
        return f"{self.leaked_bytes:,} bytes leaked in {self.leaks} allocations, {self.other_errors} other errors"


def parse(output: str) -> Report:
    """The leaks and the other errors in compute-sanitizer's output."""
    leaked = [int(n.replace(",", "")) for n in LEAKED.findall(output)]
    summary = ERRORS.findall(output)  # one per sanitized process (pytest -n runs several)
    errors = sum(int(n.replace(",", "")) for n in summary)
    return Report(sum(leaked), len(leaked), max(0, errors - len(leaked)), bool(summary))


def _use(loader: Any, batches: int, use: Callable[[Any], object]) -> None:
    """use(batch) on `batches` batches, epoch after epoch; none is kept."""
    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    for batch in itertools.islice(forever(), batches):
        use(batch)


def workload(batches: int, with_torch: bool) -> None:
    """`batches` batches as DeviceArrays, then (with_torch) as torch tensors; everything dropped
    and closed. Its last line says whether torch was imported."""
    import fastloop
    from fastloop.ops import Normalize, Pipeline, RandomCrop, RandomHFlip

    images = np.random.default_rng(0).integers(0, 256, (64, 40, 40, 3), dtype=np.uint8)
    aug = Pipeline([RandomCrop(32), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    loader = fastloop.Loader(images, batch_size=16, shuffle=True, transform=aug, num_workers=2, device="cuda")
    _use(loader, batches, lambda batch: batch.to_numpy())
    loader.close()
    _nvjpeg(batches, aug)
    if with_torch:
        _torch_tensors(batches, images, aug)
    print(f"torch imported: {'torch' in sys.modules}")


def _torch_tensors(batches: int, images: np.ndarray, aug: Any) -> None:
    import fastloop

    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        loader = fastloop.Loader(images, batch_size=16, shuffle=True, transform=aug, num_workers=2, device="cuda",
                                 output="torch", dtype="bfloat16", memory_format="channels_last")
        _use(loader, batches, lambda batch: batch.float().sum().item())
        loader.close()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what stays allocated now is held by something alive


def _nvjpeg(batches: int, aug: Any) -> None:
    """`batches` batches of JPEG files decoded by nvJPEG, as DeviceArrays (skipped, saying so,
    where nvJPEG does not load)."""
    import tempfile

    import fastloop
    from fastloop.ops import Pipeline, RandomResizedCrop

    try:
        fastloop.cuda.load_nvjpeg()
    except fastloop.CudaUnavailable as error:
        print(f"nvJPEG part skipped: {error}")
        return
    from PIL import Image

    with tempfile.TemporaryDirectory() as root:
        for i in range(24):
            os.makedirs(os.path.join(root, f"c{i % 2}"), exist_ok=True)
            pixels = np.random.default_rng(i).integers(0, 256, (48 + i, 64 - i, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(root, f"c{i % 2}", f"{i}.jpg"), quality=90)
        decode = Pipeline([RandomResizedCrop(32), *aug.steps[1:]])
        loader = fastloop.Loader(fastloop.ImageFolder(root), batch_size=8, shuffle=True, transform=decode,
                                 num_workers=2, device="cuda", decode="gpu")
        _use(loader, batches, lambda batch: batch[0].to_numpy())
        loader.close()


def sanitized(batch_counts: list[int], with_torch: bool) -> list[tuple[Report, str]]:
    """(report, output) of the workload under memcheck, one process per batch count, all at once."""
    runs = [subprocess.Popen(["compute-sanitizer", "--tool", "memcheck", "--leak-check", "full", sys.executable,
                              __file__, "--run", str(n), *(["--torch"] if with_torch else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for n in batch_counts]
    results, deadline = [], time.monotonic() + RUN_TIMEOUT_S
    for run in runs:
        try:
            output, _ = run.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            run.kill()
            output, _ = run.communicate()
            output = f"{output}\n(stopped after {RUN_TIMEOUT_S:.0f} s)"
        results.append((parse(output), output))
    return results


# ---- tests ----

SAMPLE = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at preprocess_kernel+0x70
=========
========= Leaked 4,092 bytes at 0x7b95b4000000
=========     Saved host backtrace up to driver entry point at allocation time
========= Leaked 64 bytes at 0x400200200
=========
========= LEAK SUMMARY: 4156 bytes leaked in 2 allocations
========= ERROR SUMMARY: 3 errors
"""


def test_the_report_tells_leaks_from_other_errors():
    report = parse(SAMPLE)
    assert (report.leaked_bytes, report.leaks, report.other_errors, report.finished) == (4156, 2, 1, True)
    clean = parse("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert (clean.leaked_bytes, clean.leaks, clean.other_errors, clean.finished) == (0, 0, 0, True)
    assert str(clean) == "0 bytes leaked in 0 allocations, 0 other errors"
    two = parse(SAMPLE + "========= Leaked 8 bytes at 0x400200300\n========= ERROR SUMMARY: 2 errors\n")
    assert (two.leaked_bytes, two.leaks, two.other_errors) == (4164, 3, 2)  # two processes' summaries
    cut = parse("========= COMPUTE-SANITIZER\nSegmentation fault (core dumped)\n")
    assert not cut.finished and "did not finish" in str(cut)


def test_no_leak_grows_with_batches_under_memcheck():
    import pytest

    import fastloop

    if not fastloop.cuda.is_available():
        pytest.skip(f"no usable GPU: {fastloop.cuda.is_available().reason}")
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer is not on PATH (it comes with the CUDA Toolkit)")
    with_torch = os.environ.get("FASTLOOP_LEAKS_TORCH") == "1"
    (few, few_output), (many, many_output) = sanitized([FEW, MANY], with_torch)
    for n, report, output in ((FEW, few, few_output), (MANY, many, many_output)):
        torch_line = next((line for line in output.splitlines() if line.startswith("torch imported: ")), "")
        print(f"{n} batches: {report}; {torch_line or 'no torch line'}")
        assert report.finished and report.other_errors == 0, output[-6000:]
        if not with_torch:
            assert torch_line == "torch imported: False", output[-6000:]
    assert many.leaked_bytes == few.leaked_bytes, (few, many)


def _main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "--run" and argv[2:] in ([], ["--torch"]):
        workload(int(argv[1]), with_torch=argv[2:] == ["--torch"])
        return 0
    if len(argv) == 2 and argv[0] == "--parse":
        with open(argv[1], errors="replace") as f:
            report = parse(f.read())
        print(f"memcheck: {report}")
        return 0 if report.finished and report.other_errors == 0 else 1
    print(f"usage: {sys.argv[0]} --run BATCHES [--torch] | --parse SANITIZER_LOG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
