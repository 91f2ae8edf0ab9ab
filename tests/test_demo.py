"""`python -m fastloop demo`: a quick run leaves logs, checkpoints, a plot and a summary;
Ctrl-C stops it with a checkpoint; --resume continues to exactly where an uninterrupted run
gets; the regression task learns the seed's weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import fastloop


@pytest.fixture(scope="module", autouse=True)
def image_cache(tmp_path_factory):
    """One cache of generated JPEG files for the module's runs (written by the first)."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cache")
        patch.setenv("FASTLOOP_CACHE", str(folder))
        yield folder


def demo(tmp_path, *args, check=True):
    result = subprocess.run([sys.executable, "-m", "fastloop", "demo", "--out", str(tmp_path), "--device", "cpu", *args],
                            capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def summary(folder):
    with open(os.path.join(folder, "summary.json")) as f:
        return json.load(f)


def test_quick_classification_run_writes_everything(tmp_path):
    result = demo(tmp_path, "--quick")
    folder = tmp_path / "classification"
    s = summary(folder)
    assert s["steps"] == 3 * (4096 // 256) and not s["interrupted"]
    assert s["val/accuracy"] > 0.4  # 10 classes: chance is 0.1
    assert (folder / "plot.png").stat().st_size > 10_000
    assert len(os.listdir(folder / "checkpoints")) >= 1
    assert "tensorboard --logdir" in result.stdout
    # a quick run's steps may take under a second on a fast machine: then no rate is printed
    expected = "samples/s" if s["samples_per_s"] is not None else "too short to time a rate"
    assert expected in result.stdout
    rows = (folder / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("wall_time,step,name,value") and any(",train/loss," in r for r in rows)
    tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = tb.EventAccumulator(str(folder))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, s["steps"] + 1))
    assert len(events.Scalars("val/accuracy")) == 3
    again = demo(tmp_path, "--quick", "--epochs", "1")  # a second run gets a folder of its own
    assert "classification-2" in again.stdout


def test_classification_trains_on_jpeg_files_written_once_in_image_folder_layout(tmp_path, image_cache):
    first = demo(tmp_path, "--quick", "--epochs", "1", "--name", "a")
    folder = image_cache / "demo-images-v1-seed0-4096+1024"
    assert "4096 JPEG files" in first.stdout and "fused in Loader threads" in first.stdout
    train = fastloop.ImageFolder(folder / "train")
    assert len(train) == 4096 and train.classes == [f"class_{c}" for c in range(10)]
    assert len(fastloop.ImageFolder(folder / "val")) == 1024
    assert train[0][0].shape == (32, 32, 3)
    stamp = os.stat(train.samples[0][0]).st_mtime_ns
    again = demo(tmp_path, "--quick", "--epochs", "1", "--name", "b")
    assert f"reused from {folder}" in again.stdout
    assert os.stat(train.samples[0][0]).st_mtime_ns == stamp
    assert summary(tmp_path / "a")["val/accuracy"] == summary(tmp_path / "b")["val/accuracy"]


def test_interrupted_run_resumes_to_the_same_model(tmp_path):
    full = demo(tmp_path, "--quick", "--name", "full")
    stopped = demo(tmp_path, "--quick", "--name", "cut", "--stop-after", "21", check=False)
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert summary(tmp_path / "cut")["steps"] == 21 and summary(tmp_path / "cut")["interrupted"]
    resumed = demo(tmp_path, "--quick", "--name", "cut", "--resume")
    assert "resumed from step 21 (epoch 2, batch 5)" in resumed.stdout
    a = fastloop.Checkpointer(tmp_path / "full" / "checkpoints").load()
    b = fastloop.Checkpointer(tmp_path / "cut" / "checkpoints").load()
    assert sorted(a) == sorted(b) and int(a["step"]) == 48
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert full.returncode == 0


def test_ctrl_c_stops_cleanly_with_a_checkpoint(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "fastloop", "demo", "--out", str(tmp_path), "--device", "cpu",
                                "--quick", "--epochs", "40", "--checkpoint-every", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:  # plain lines: not a terminal
        lines.append(line)
        if line.startswith("epoch 1/40:"):
            process.send_signal(signal.SIGINT)
            break
    output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    assert "interrupted at step" in output
    s = summary(tmp_path / "classification")
    assert s["interrupted"] and 16 <= s["steps"] < 40 * 16
    saved = fastloop.Checkpointer(tmp_path / "classification" / "checkpoints").load()
    assert int(saved["step"]) == s["steps"]


def test_regression_task_learns_the_seed_weights(tmp_path):
    result = demo(tmp_path, "--task", "regression", "--quick")
    s = summary(tmp_path / "regression")
    assert s["val/weight_error"] < 0.05 and s["val/mse"] < 0.05
    # its 320 steps take well under the second a rate needs: said so, not a rate of millions
    done = next(line for line in result.stdout.splitlines() if line.startswith("done:"))
    assert "too short to time a rate" in done and "samples/s" not in done, done
    assert s["samples_per_s"] is None and s["seconds"] > 0
    assert f"summary:     {tmp_path / 'regression' / 'summary.json'}" in result.stdout


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path):
    demo(tmp_path, "--task", "regression", "--quick")
    folder = tmp_path / "regression"
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    again = demo(tmp_path, "--task", "regression", "--quick", "--resume")
    assert "the run is complete: 320 steps, 20 epochs" in again.stdout and "summary.json" in again.stdout
    assert "done:" not in again.stdout and "samples/s" not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before  # no second event file, no rewrite


def test_resume_without_checkpoints_says_so(tmp_path):
    result = demo(tmp_path, "--quick", "--resume", check=False)
    assert result.returncode == 2 and "no checkpoints" in result.stdout


def test_bad_options_are_refused_naming_them(tmp_path):
    for option, value in (("--epochs", "0"), ("--batch-size", "-3"), ("--num-workers", "-1")):
        result = demo(tmp_path, "--quick", option, value, check=False)
        assert result.returncode == 2 and option in result.stderr
    result = demo(tmp_path, "--quick", "--task", "segmentation", check=False)
    assert result.returncode == 2 and "--task" in result.stderr
