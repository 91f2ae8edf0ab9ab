"""fastloop.Checkpointer: numpy-readable files, retention, errors raised (never lost), a
process killed mid-write never leaves a torn latest, and exits finish the pending save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

import fastloop


def state_at(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {
        "layer1.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "layer1.bias": np.full(64, step, np.float32),
        "optimizer.momentum": rng.standard_normal(2048),
        "epoch": step // 10,
        "lr": 0.1 / (step + 1),
        "tokens": np.arange(5, dtype=np.int64),
        "flags": np.array([True, False]),
        "note": np.array("resnet50"),
        "transposed": np.arange(12.0).reshape(3, 4).T,  # a non-contiguous view
    }


def assert_same_state(loaded: dict, saved: dict) -> None:
    assert set(loaded) == set(saved)
    for key, value in saved.items():
        want = np.asarray(value)
        assert loaded[key].shape == want.shape and loaded[key].dtype == want.dtype, key
        np.testing.assert_array_equal(loaded[key], want, err_msg=key)


def test_save_load_roundtrip_and_numpy_reads_the_file(tmp_path):
    with fastloop.Checkpointer(tmp_path / "ckpts", keep=3) as ckpt:
        ckpt.save(state_at(7), step=7)
        assert ckpt.wait(timeout=10)
        latest = ckpt.latest()
        assert latest == fastloop.Checkpoint(7, str(tmp_path / "ckpts" / "ckpt-000000000007.npz"))
        assert_same_state(ckpt.load(), state_at(7))
        assert_same_state(ckpt.load(7), state_at(7))
    with np.load(latest.path) as npz:  # a plain .npz: no fastloop needed to read it
        assert int(npz["epoch"]) == 0 and npz["note"][()] == "resnet50"
    assert zipfile.ZipFile(latest.path).testzip() is None  # every member's CRC-32 checks


def test_keep_prunes_old_checkpoints_and_state_is_snapshotted_at_save(tmp_path):
    ckpt = fastloop.Checkpointer(tmp_path, keep=2)
    weights = np.zeros(1000)
    for step in range(5):
        weights[:] = step
        ckpt.save({"w": weights}, step)
        weights[:] = -1  # changing it after save() must not change the checkpoint
    ckpt.close()
    assert [c.step for c in ckpt.checkpoints()] == [3, 4]
    assert (ckpt.load(4)["w"] == 4).all() and (ckpt.load(3)["w"] == 3).all()
    assert ckpt.stats()["written"] == 5


def test_bad_state_is_refused_with_the_key_named(tmp_path):
    ckpt = fastloop.Checkpointer(tmp_path)
    with pytest.raises(TypeError, match=r"state\['opt'\].*nothing is pickled"):
        ckpt.save({"opt": {"lr": 0.1}}, 1)
    with pytest.raises(TypeError, match="keys must be str"):
        ckpt.save({3: np.zeros(2)}, 1)
    with pytest.raises(TypeError, match="mapping"):
        ckpt.save([np.zeros(2)], 1)
    with pytest.raises(ValueError, match="'step' must be >= 0"):
        ckpt.save({"a": np.zeros(2)}, -1)
    with pytest.raises(fastloop.CheckpointError, match="no checkpoint in"):
        ckpt.load()
    ckpt.save({"a": np.zeros(2)}, 1)
    with pytest.raises(fastloop.CheckpointError, match="no checkpoint for step 2"):
        ckpt.load(2)
    ckpt.close()
    with pytest.raises(fastloop.Closed):
        ckpt.save({"a": np.zeros(2)}, 2)
    (tmp_path / "plain-file").write_text("")
    with pytest.raises(fastloop.CheckpointError, match="plain-file"):
        fastloop.Checkpointer(tmp_path / "plain-file")
    with pytest.raises(ValueError, match="keep"):
        fastloop.Checkpointer(tmp_path, keep=0)


def test_a_background_write_error_is_raised_by_wait_or_the_next_save(tmp_path):
    directory = tmp_path / "vanishing"
    ckpt = fastloop.Checkpointer(directory)
    os.rmdir(directory)
    ckpt.save({"a": np.zeros(10)}, 3)
    with pytest.raises(fastloop.CheckpointError, match="checkpoint 3 not written.*vanishing") as raised:
        ckpt.wait()
    assert isinstance(raised.value, OSError)
    ckpt.save({"a": np.zeros(10)}, 4)  # nobody waits this time: the next save reports it
    time.sleep(0.2)  # writing 80 bytes into a missing directory fails within microseconds
    with pytest.raises(fastloop.CheckpointError, match="checkpoint 4 not written"):
        ckpt.save({"a": np.zeros(10)}, 5)
    ckpt.close(wait=False)



def test_a_damaged_checkpoint_is_reported_not_returned(tmp_path):
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state_at(1), 1)
    path = ckpt.latest().path
    with open(path, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 64)  # flip bytes inside the first array
    with pytest.raises(fastloop.CheckpointError, match=r"ckpt-000000000001\.npz cannot be read"):
        ckpt.load()


def test_periodic_saves_through_a_state_function(tmp_path):
    progress = {"step": 0}

    def state_fn():
        progress["step"] += 1
        return progress["step"], {"w": np.full(4, progress["step"])}

    ckpt = fastloop.Checkpointer(tmp_path, keep=10, every_s=0.05, state_fn=state_fn)
    time.sleep(0.4)
    ckpt.close()
    steps = [c.step for c in ckpt.checkpoints()]
    assert len(steps) >= 3 and steps == sorted(steps)
    assert (ckpt.load(steps[-1])["w"] == steps[-1]).all()

    def broken():
        raise RuntimeError("no state today")

    ckpt = fastloop.Checkpointer(tmp_path / "b", every_s=0.01, state_fn=broken)
    time.sleep(0.1)
    with pytest.raises(fastloop.CheckpointError, match="periodic save failed.*no state today"):
        ckpt.close()
    with pytest.raises(ValueError, match="go together"):
        fastloop.Checkpointer(tmp_path, every_s=1.0)


KILLED_WRITER = """
import sys, numpy as np, fastloop
ckpt = fastloop.Checkpointer(sys.argv[1], keep=100)
big = np.random.default_rng(0).standard_normal(25_000_000)  # 200 MB: writes take a while
step = 0
while True:
    big[0] = step
    ckpt.save({"big": big, "step": step}, step)
    ckpt.wait()
    print(step, flush=True)
    step += 1
"""


def test_a_process_killed_mid_write_leaves_every_published_checkpoint_readable(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0"  # one checkpoint is published
        time.sleep(0.15)  # now the next one is part-way through its write
        temps = [n for n in os.listdir(tmp_path) if n.startswith(".ckpt-")]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL
    reader = fastloop.Checkpointer(tmp_path)  # also removes the dead writer's temp file
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".ckpt-")]
    latest = reader.latest()
    assert latest is not None
    state = reader.load()
    assert state["big"][0] == latest.step == int(state["step"])
    assert temps, "the kill should have caught a write in progress"
    reader.close()


EXIT_WITH_PENDING_SAVE = """
import sys, numpy as np, fastloop
ckpt = fastloop.Checkpointer(sys.argv[1])
ckpt.save({"w": np.ones(5_000_000)}, 1)   # 40 MB, then exit at once without close()
"""


def test_exiting_finishes_the_pending_save(tmp_path):
    out = subprocess.run([sys.executable, "-c", EXIT_WITH_PENDING_SAVE, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    state = fastloop.Checkpointer(tmp_path).load(1)
    assert state["w"].shape == (5_000_000,) and state["w"].sum() == 5_000_000
