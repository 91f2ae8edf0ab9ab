"""The examples in examples/ run end to end (as a user runs them) and do what they claim:
they converge, their TensorBoard/CSV logs and checkpoints are readable, --resume continues
where the checkpoint left off, and --device cuda without CUDA fails clearly."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import math
import os
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest

import fastloop
import fastloop.nn as nn

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class Run:
    """One finished example process: its output, parsed RESULT line and output folder."""

    def __init__(self, proc: subprocess.CompletedProcess, out: str) -> None:
        self.returncode, self.stdout, self.stderr, self.out = proc.returncode, proc.stdout, proc.stderr, out
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        self.result = json.loads(lines[-1][len("RESULT "):]) if lines else None

    def check(self) -> "Run":
        assert self.returncode == 0, f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        assert self.result is not None, f"no RESULT line in:\n{self.stdout}"
        return self


def run_example(name: str, cwd: str, *args: str, out: str = "out") -> Run:
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py"), "--out", out, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    return Run(proc, os.path.join(cwd, out))


def load_example(name: str) -> ModuleType:
    """The example as a module, for its data generator."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def event_files(out: str) -> list[str]:
    files = glob.glob(os.path.join(out, "events.out.tfevents.*"))
    assert files, f"no TensorBoard event file in {out}: {os.listdir(out)}"
    return files


def tensorboard_steps(path: str, tag: str) -> list[int]:
    """Steps of `tag` in one event file, read by TensorBoard's own reader (skips without it)."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert tag in acc.Tags()["scalars"], f"{tag} not in {acc.Tags()['scalars']}"
    return [event.step for event in acc.Scalars(tag)]


def csv_rows(out: str, name: str) -> list[dict[str, str]]:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
        return [row for row in csv.DictReader(f) if row["name"] == name]


# ---- runs shared by several tests (each a few tenths of a second)


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_example("linear_regression", str(tmp_path_factory.mktemp("regression")), "--quick").check()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_example("mlp_classifier", str(tmp_path_factory.mktemp("classifier")), "--quick").check()


# ---- linear regression


def test_linear_regression_converges_to_the_true_weights(regression: Run) -> None:
    result = regression.result
    assert result["start_epoch"] == 0 and result["end_epoch"] == result["epochs"] == 40
    assert result["steps"] == 40 * math.ceil(512 / 64)
    assert result["mse"] < 1.5 * result["noise_variance"]  # down to the noise
    assert result["w_max_abs_error"] < 0.05 and result["b_abs_error"] < 0.05
    assert result["samples_per_s"] > 0
    assert "final MSE" in regression.stdout and "logs:" in regression.stdout


def test_linear_regression_logs_every_step_to_tensorboard_and_csv(regression: Run) -> None:
    steps = regression.result["steps"]
    (events,) = event_files(regression.out)
    assert tensorboard_steps(events, "train/loss") == list(range(steps))
    assert len(tensorboard_steps(events, "train/epoch_loss")) == 40
    rows = csv_rows(regression.out, "train/loss")
    assert [int(row["step"]) for row in rows] == list(range(steps))
    assert all(math.isfinite(float(row["value"])) for row in rows)


def test_linear_regression_checkpoint_loads_into_a_model(regression: Run) -> None:
    ckpt = fastloop.Checkpointer(os.path.join(regression.out, "checkpoints"))
    assert len(ckpt.checkpoints()) == 3  # keep=3
    assert os.path.basename(ckpt.latest().path) == os.path.basename(regression.result["checkpoint"])
    state = ckpt.load()
    assert int(state["epoch"]) == 40 and int(state["step"]) == regression.result["steps"]
    model = nn.Linear(10, 1)
    model.load_state_dict({"weight": state["model.weight"], "bias": state["model.bias"]})
    w_true = np.asarray(regression.result["w_true"], np.float32)
    np.testing.assert_allclose(model.weight[0], w_true, atol=0.05)
    assert float(state["optim.group.lr"]) == pytest.approx(0.01)


def test_linear_regression_resume_continues_from_the_checkpoint(regression: Run, tmp_path) -> None:
    first = run_example("linear_regression", str(tmp_path), "--quick", "--epochs", "25",
                        "--checkpoint-every", "7").check()
    assert first.result["end_epoch"] == 25  # the last epoch is always saved
    second = run_example("linear_regression", str(tmp_path), "--quick", "--resume").check()
    assert "resumed from" in second.stdout
    assert second.result["start_epoch"] == 25 and second.result["end_epoch"] == 40
    assert second.result["steps"] == regression.result["steps"]
    # The loss steps go on from the checkpoint in a second event file, not from 0.
    per_file = sorted(tensorboard_steps(f, "train/loss") for f in event_files(second.out))
    assert per_file == [list(range(200)), list(range(200, 320))]
    # Same shuffling order and state as an uninterrupted run: the same weights.
    resumed = fastloop.Checkpointer(os.path.join(second.out, "checkpoints")).load()
    straight = fastloop.Checkpointer(os.path.join(regression.out, "checkpoints")).load()
    np.testing.assert_allclose(resumed["model.weight"], straight["model.weight"], atol=1e-5)


# ---- MLP classifier


def test_mlp_classifier_reaches_high_validation_accuracy(classifier: Run) -> None:
    result = classifier.result
    assert result["end_epoch"] == result["epochs"] == 8
    assert result["steps"] == 8 * math.ceil(4000 / 128)
    assert result["val_accuracy"] > 0.9
    assert result["best_val_accuracy"] >= result["val_accuracy"]
    assert result["train_loss"] < 0.5


def test_mlp_classifier_with_sgd_momentum_reaches_high_validation_accuracy(tmp_path) -> None:
    run = run_example("mlp_classifier", str(tmp_path), "--quick", "--optimizer", "sgd").check()
    assert run.result["optimizer"] == "sgd" and run.result["val_accuracy"] > 0.9
    state = fastloop.Checkpointer(os.path.join(run.out, "checkpoints")).load()
    assert float(state["optim.group.momentum"]) == 0.9 and bool(state["optim.group.nesterov"])
    assert state["optim.state.0.momentum_buffer"].shape == (256, 32)


def test_mlp_classifier_logs_loss_per_step_and_accuracy_per_epoch(classifier: Run) -> None:
    (events,) = event_files(classifier.out)
    assert tensorboard_steps(events, "train/loss") == list(range(classifier.result["steps"]))
    assert tensorboard_steps(events, "val/accuracy") == [32 * epoch for epoch in range(1, 9)]
    rows = csv_rows(classifier.out, "val/accuracy")
    assert len(rows) == 8
    assert float(rows[-1]["value"]) == pytest.approx(classifier.result["val_accuracy"])
    assert len(csv_rows(classifier.out, "train/loss")) == classifier.result["steps"]


def test_mlp_classifier_best_checkpoint_reproduces_its_accuracy(classifier: Run) -> None:
    example = load_example("mlp_classifier")
    best = fastloop.Checkpointer(os.path.join(classifier.out, "best"))
    assert len(best.checkpoints()) == 1
    assert os.path.basename(best.latest().path) == os.path.basename(classifier.result["best_checkpoint"])
    state = best.load()
    assert float(state["val_accuracy"]) == classifier.result["best_val_accuracy"]
    assert int(state["epoch"]) == classifier.result["best_epoch"]
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    x, labels = example.make_data(4000 + 1000, 0)
    accuracy = float((model(x[4000:]).argmax(axis=1) == labels[4000:]).mean())
    assert accuracy == pytest.approx(classifier.result["best_val_accuracy"], abs=1e-6)
    assert len(fastloop.Checkpointer(os.path.join(classifier.out, "checkpoints")).checkpoints()) == 3


def test_mlp_classifier_resume_matches_an_uninterrupted_run(classifier: Run, tmp_path) -> None:
    first = run_example("mlp_classifier", str(tmp_path), "--quick", "--stop-after", "3").check()
    assert first.result["end_epoch"] == 3 and first.result["steps"] == 96
    second = run_example("mlp_classifier", str(tmp_path), "--quick", "--resume").check()
    assert second.result["start_epoch"] == 3 and second.result["end_epoch"] == 8
    assert second.result["steps"] == classifier.result["steps"]
    assert "epoch   1/" not in second.stdout and "epoch   4/8" in second.stdout
    per_file = sorted(tensorboard_steps(f, "train/loss") for f in event_files(second.out))
    assert per_file == [list(range(96)), list(range(96, 256))]
    resumed = fastloop.Checkpointer(os.path.join(second.out, "checkpoints")).load()
    straight = fastloop.Checkpointer(os.path.join(classifier.out, "checkpoints")).load()
    assert int(resumed["optim.state.0.step"]) == 256  # Adam's step count was restored, not restarted
    for key in straight:
        np.testing.assert_allclose(resumed[key], straight[key], atol=1e-4, err_msg=key)
    assert second.result["val_accuracy"] == pytest.approx(classifier.result["val_accuracy"], abs=0.01)


# ---- devices


@pytest.mark.skipif(bool(fastloop.cuda.is_available()), reason="CUDA is available here")
@pytest.mark.parametrize("name", ["linear_regression", "mlp_classifier"])
def test_device_cuda_without_cuda_exits_2_with_the_reason(name: str, tmp_path) -> None:
    run = run_example(name, str(tmp_path), "--quick", "--device", "cuda")
    assert run.returncode == 2, run.stdout + run.stderr
    assert fastloop.cuda.is_available().reason in run.stderr
    assert "Traceback" not in run.stderr and run.result is None


# ---- torch training script with fastloop.Loader


@pytest.fixture(scope="module")
def torch_train(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One uninterrupted quick run of examples/torch_train.py (a few seconds)."""
    pytest.importorskip("torch", reason="examples/torch_train.py trains a torch model")
    pytest.importorskip("PIL", reason="the example's JPEG files are written with Pillow")
    return run_example("torch_train", str(tmp_path_factory.mktemp("torch_train")), "--quick", out="straight").check()


def test_torch_train_learns_from_jpegs_and_resumes_mid_epoch_to_the_same_weights(torch_train: Run, tmp_path) -> None:
    import torch

    straight = torch_train
    assert straight.result["steps"] == 3 * (2048 // 64)
    assert straight.result["val_accuracy"] > 0.3, straight.stdout  # 10 classes: chance is 0.1
    assert straight.result["loader"] == {"epoch": 3, "position": 0, "seed": 0}
    cut = run_example("torch_train", str(tmp_path), "--quick", "--stop-after", "40", out="cut").check()
    assert cut.result["stopped"] and cut.result["loader"] == {"epoch": 1, "position": 8, "seed": 0}
    resumed = run_example("torch_train", str(tmp_path), "--quick", "--resume", out="cut").check()
    assert "resumed at step 40: epoch 1, batch 8" in resumed.stdout
    assert resumed.result["steps"] == straight.result["steps"]
    a, b = (fastloop.read_checkpoint(os.path.join(os.path.dirname(run.out), run.result["checkpoint"]))
            for run in (straight, resumed))
    assert a["step"] == b["step"] == straight.result["steps"] and a["loader"] == b["loader"]
    for key in a["model"]:  # the same batches, augmentations and order after the cut
        assert isinstance(a["model"][key], torch.Tensor)
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key, value in a["optim"]["state"][0].items():
        assert torch.equal(value, b["optim"]["state"][0][key]), key


def test_torch_train_logs_loss_accuracy_histograms_images_and_text_to_tensorboard(torch_train: Run) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    run = torch_train
    (path,) = event_files(run.out)
    assert tensorboard_steps(path, "train/loss") == list(range(1, run.result["steps"] + 1))
    assert tensorboard_steps(path, "val/accuracy") == [32, 64, 96]
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.IMAGES: 0,
                                                                  event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    assert [image.width for image in acc.Images("train/input")] == [28]
    assert "weights/0.weight" in acc.Tags()["histograms"] and len(acc.Histograms("weights/0.weight")) == 3
    assert any("settings" in tag for tag in acc.Tags()["tensors"]), acc.Tags()
    assert len(csv_rows(run.out, "train/loss")) == run.result["steps"]


def test_the_image_classifier_example_decodes_jpegs_in_the_fronts_pool_and_answers_top_5(tmp_path):
    pytest.importorskip("uvicorn")
    pytest.importorskip("PIL")
    run = run_example("serve_image_classifier", str(tmp_path)).check()
    assert run.result["correct"] == 4, run.stdout
    assert all(len(answer) == 5 and answer == sorted(answer, key=lambda a: -a["p"])
               for answer in run.result["answers"].values())
    assert run.result["decoded_on"] and all(name.startswith("fastloop-http") for name in run.result["decoded_on"])
