"""examples/ddp_train.py under torchrun with 2 CPU ranks (gloo): the Loader's shards cover
every epoch exactly once, disjointly, in a new order each epoch; the all-reduced fastloop.nn
models stay identical; rank 0 alone logs and checkpoints. Skips without torch.distributed."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.run")  # what torchrun runs
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)

import fastloop  # noqa: E402
import fastloop.nn as nn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
RANKS, EPOCHS, SAMPLES, BATCH = 2, 4, 1024, 64  # --quick: 1024 = 2 ranks x 64 x 8 steps, no remainder
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def child_env() -> dict[str, str]:
    """This environment without any torchrun variables, one BLAS/OpenMP thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """The finished torchrun: exit status, output, rank 0's RESULT and the output folder."""

    def __init__(self, proc: subprocess.CompletedProcess, out: str) -> None:
        self.returncode, self.stdout, self.stderr, self.out = proc.returncode, proc.stdout, proc.stderr, out
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        self.result = json.loads(lines[-1][len("RESULT "):]) if lines else None

    def samples(self, rank: int, epoch: int) -> np.ndarray:
        return np.load(os.path.join(self.out, f"samples_rank{rank}_epoch{epoch}.npy"))

    def params(self, rank: int) -> dict[str, np.ndarray]:
        with np.load(os.path.join(self.out, f"params_rank{rank}.npz")) as f:
            return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = str(tmp_path_factory.mktemp("ddp"))
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}",
               EXAMPLE, "--quick", "--device", "cpu", "--out", out]
    proc = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    run = Run(proc, out)
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert run.result is not None, f"no RESULT line in:\n{run.stdout}"
    return run


def test_ddp_example_trains_every_epoch_on_two_gloo_ranks(ddp: Run) -> None:
    result = ddp.result
    assert (result["world_size"], result["backend"], result["device"]) == (RANKS, "gloo", "cpu")
    assert (result["epochs"], result["samples"], result["batch_size"]) == (EPOCHS, SAMPLES, BATCH)
    assert result["steps_per_epoch"] == SAMPLES // (RANKS * BATCH)
    assert result["steps"] == EPOCHS * result["steps_per_epoch"]
    assert ddp.stdout.count("RESULT ") == 1  # rank 0 only


def test_each_epoch_the_two_shards_cover_the_dataset_exactly_once(ddp: Run) -> None:
    for epoch in range(EPOCHS):
        shards = [ddp.samples(rank, epoch) for rank in range(RANKS)]
        assert [len(s) for s in shards] == [SAMPLES // RANKS] * RANKS
        assert not np.intersect1d(shards[0], shards[1]).size, f"epoch {epoch}: the shards overlap"
        both = np.concatenate(shards)
        assert len(np.unique(both)) == len(both), f"epoch {epoch}: a sample was trained on twice"
        np.testing.assert_array_equal(np.sort(both), np.arange(SAMPLES))


def test_shards_are_strided_from_one_epoch_order_shared_by_the_ranks(ddp: Run) -> None:
    """Rank r trains on order[r::2] of the same shuffled order, exactly what a Loader with
    that rank, world size, seed and epoch draws (so the example's shards are reproducible)."""
    ids = np.arange(SAMPLES, dtype=np.int64)
    for epoch in range(EPOCHS):
        for rank in range(RANKS):
            loader = fastloop.Loader(ids, batch_size=BATCH, shuffle=True, seed=ddp.result["seed"], rank=rank,
                                     world_size=RANKS, drop_last=True)
            loader.set_epoch(epoch)
            expected = np.concatenate([batch.copy() for batch in loader])
            np.testing.assert_array_equal(ddp.samples(rank, epoch), expected)


def test_the_shuffle_order_differs_between_epochs(ddp: Run) -> None:
    for rank in range(RANKS):
        orders = [ddp.samples(rank, epoch) for epoch in range(EPOCHS)]
        for a in range(EPOCHS):
            for b in range(a + 1, EPOCHS):
                assert not np.array_equal(orders[a], orders[b]), f"rank {rank}: epochs {a} and {b} in the same order"
        # the shards themselves change, not only their order
        assert set(orders[0].tolist()) != set(orders[1].tolist())


def test_parameters_end_identical_on_every_rank(ddp: Run) -> None:
    assert ddp.result["max_param_difference"] == 0.0 and ddp.result["params_identical"] is True
    rank0, rank1 = ddp.params(0), ddp.params(1)
    assert list(rank0) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    for name in rank0:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)  # bit for bit


def test_the_loss_goes_down_and_the_model_learns(ddp: Run) -> None:
    losses = ddp.result["epoch_losses"]
    assert len(losses) == EPOCHS and all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert ddp.result["final_loss"] == losses[-1]
    assert ddp.result["val_accuracy"] > 0.75  # 4 classes: chance is ~0.3


def test_two_ranks_train_the_model_one_process_trains_on_the_global_batch(ddp: Run) -> None:
    """Rank r's batch k is order[r::2][64k:64k+64], so the two ranks' batches k together are
    order[128k:128k+128] and the averaged gradient is that batch's: 2 ranks x 64 equal one
    process x 128 over the same epoch orders, to float32 rounding."""
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    x, labels, _ = example.make_data(SAMPLES + 1024, ddp.result["seed"])
    nn.manual_seed(ddp.result["seed"])
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    opt = nn.Adam(model, lr=3e-3)
    loader = fastloop.Loader((x[:SAMPLES], labels[:SAMPLES]), batch_size=RANKS * BATCH, shuffle=True,
                             seed=ddp.result["seed"], drop_last=True, rank=0, world_size=1)
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for xb, yb in loader:
            model.backward(xb, yb, loss="cross_entropy")
            opt.step()
    for name, value in ddp.params(0).items():
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=0, atol=1e-5, err_msg=name)


def test_rank0_alone_writes_the_tensorboard_events_and_csv(ddp: Run) -> None:
    events = glob.glob(os.path.join(ddp.out, "events.out.tfevents.*"))
    assert len(events) == 1, os.listdir(ddp.out)  # one writer: rank 0
    assert os.path.getsize(events[0]) > 0
    with open(os.path.join(ddp.out, "metrics.csv")) as f:
        rows = [line.split(",") for line in f.read().splitlines()[1:]]
    loss_steps = [int(row[1]) for row in rows if row[2] == "train/loss"]
    assert loss_steps == list(range(ddp.result["steps"]))
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(events[0], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == loss_steps
    assert len(acc.Scalars("val/accuracy")) == EPOCHS
    assert acc.Scalars("val/accuracy")[-1].value == pytest.approx(ddp.result["val_accuracy"], abs=1e-6)


def test_rank0_checkpoint_loads_into_a_fresh_model_and_optimizer(ddp: Run) -> None:
    ckpt = fastloop.Checkpointer(os.path.join(ddp.out, "checkpoints"))
    assert len(ckpt.checkpoints()) == 3  # one per epoch, the newest 3 kept
    assert os.path.basename(ckpt.latest().path) == os.path.basename(ddp.result["checkpoint"])
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    opt = nn.Adam(model, lr=1.0)
    progress = nn.load_training_state(ckpt.load(), model, opt)
    ckpt.close()
    assert int(progress["epoch"]) == EPOCHS and int(progress["step"]) == ddp.result["steps"]
    assert opt.steps == ddp.result["steps"] and opt.lr == pytest.approx(3e-3)
    for name, value in ddp.params(0).items():
        np.testing.assert_array_equal(model.state_dict()[name], value, err_msg=name)


def test_without_torchrun_it_says_how_to_launch_and_exits_2(tmp_path) -> None:
    proc = subprocess.run([sys.executable, EXAMPLE, "--quick", "--out", str(tmp_path)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torchrun --nproc_per_node=2 examples/ddp_train.py" in proc.stderr
    assert "RANK" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.listdir(tmp_path)  # nothing was started
