"""fastloop.Checkpointer: round trips, retention, every save written at its step and in order,
errors raised (never lost) and naming the file, load() falling back past damaged files, a
process killed mid-write never leaves a torn latest, and exits finish the pending save.
(The file format against the safetensors package: test_checkpoint_format.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings

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
    for key, want in saved.items():
        assert type(loaded[key]) is type(want), key  # numbers come back as numbers
        if isinstance(want, np.ndarray):
            assert loaded[key].shape == want.shape and loaded[key].dtype == want.dtype, key
        np.testing.assert_array_equal(loaded[key], want, err_msg=key)


def test_save_load_roundtrip_and_latest_right_after_save(tmp_path):
    with fastloop.Checkpointer(tmp_path / "ckpts", keep=3) as ckpt:
        ckpt.save(state_at(7), step=7)
        latest = ckpt.latest()  # no wait(): latest() waits for the pending save itself
        assert latest == fastloop.Checkpoint(7, str(tmp_path / "ckpts" / "ckpt-000000000007.safetensors"))
        assert_same_state(ckpt.load(), state_at(7))
        assert_same_state(ckpt.load(7), state_at(7))
    assert_same_state(fastloop.read_checkpoint(latest.path), state_at(7))


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
    with pytest.raises(TypeError, match=r"state\['opt'\]\[0\]\['fn'\] is a builtins.function.*nothing is pickled"):
        ckpt.save({"opt": [{"fn": lambda: 1}]}, 1)
    with pytest.raises(TypeError, match=r"state\['x'\] is an array of Python objects"):
        ckpt.save({"x": np.array([{}, 1], dtype=object)}, 1)
    with pytest.raises(TypeError, match=r"state has a key of type tuple.*keys must be str, int"):
        ckpt.save({(1, 2): np.zeros(2)}, 1)
    with pytest.raises(TypeError, match=r"state\['s'\] is a builtins.set"):
        ckpt.save({"s": {1, 2}}, 1)
    with pytest.raises(ValueError, match="'step' must be >= 0"):
        ckpt.save({"a": np.zeros(2)}, -1)
    with pytest.raises(fastloop.CheckpointError, match="no checkpoint in"):
        ckpt.load()
    with pytest.raises(ValueError, match="need a period"):
        ckpt.maybe_save({}, 1)
    with pytest.raises(ValueError, match="'every_steps' must be an int >= 1"):
        fastloop.Checkpointer(tmp_path, every_steps=0)
    with pytest.raises(ValueError, match="'every_s' must be > 0"):
        fastloop.Checkpointer(tmp_path, every_s=-1)
    with pytest.raises(TypeError, match="'state_fn' must be callable"):
        fastloop.Checkpointer(tmp_path, every_s=1, state_fn={"a": 1})
    stateless = fastloop.Checkpointer(tmp_path / "n", every_steps=2)
    assert not stateless.maybe_save(step=5) and not stateless.maybe_save(step=0)  # multiples of 2, 0 excluded
    with pytest.raises(TypeError, match="no state and the Checkpointer has no state_fn"):
        stateless.maybe_save(step=6)
    with pytest.raises(TypeError, match="missing required argument 'step'"):
        stateless.maybe_save({"a": np.zeros(2)})  # the step is never guessed
    with pytest.raises(TypeError, match="missing required argument 'step'"):
        stateless.maybe_save()
    with pytest.raises(ValueError, match="'num_workers' must be an int >= 1 or None"):
        fastloop.Checkpointer(tmp_path, num_workers=0)
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
    ckpt.save({"a": np.zeros(10)}, 4)  # nobody waits: the next save waits for it, then reports it
    with pytest.raises(fastloop.CheckpointError, match="checkpoint 4 not written"):
        ckpt.save({"a": np.zeros(10)}, 5)
    ckpt.close(timeout=0)



def damage(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how == "flipped":  # a byte of the data: the header still parses, the CRC-32 does not match
        with open(path, "r+b") as f:
            f.seek(size - 3)
            byte = f.read(1)
            f.seek(size - 3)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif how == "truncated":
        os.truncate(path, size // 2)
    elif how == "empty":
        os.truncate(path, 0)


@pytest.mark.parametrize("how, reason", [("flipped", "CRC-32 .* the file is damaged"),
                                         ("truncated", "header length of .* in a file of|tensors cover"),
                                         ("empty", "0 bytes: too short")])
def test_reading_a_damaged_file_raises_checkpoint_error_naming_it(tmp_path, how, reason):
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state_at(1), 1)
    path = ckpt.latest().path
    damage(path, how)
    with pytest.raises(fastloop.CheckpointError, match=rf"checkpoint {path} cannot be read: .*({reason})"):
        fastloop.read_checkpoint(path)
    with pytest.raises(fastloop.CheckpointError, match=rf"checkpoint {path} cannot be read"):
        ckpt.load(1)  # a step asked for by number: its own file or an error, never another step
    with pytest.raises(fastloop.CheckpointError, match=rf"no readable checkpoint in .*{path} cannot be read"):
        with pytest.warns(RuntimeWarning):
            ckpt.load()  # nothing older to fall back on


def test_load_falls_back_to_the_newest_valid_checkpoint_warning_what_it_skipped(tmp_path):
    with fastloop.Checkpointer(tmp_path, keep=10) as ckpt:
        for step in (10, 20, 30, 40):
            ckpt.save(state_at(step), step)
        ckpt.wait()
        paths = {c.step: c.path for c in ckpt.checkpoints()}
        damage(paths[40], "empty")
        damage(paths[30], "truncated")
        damage(paths[20], "flipped")
        with pytest.warns(RuntimeWarning) as caught:
            latest = ckpt.latest()  # header and size checks: the flipped byte is found by load()
        assert latest.step == 20
        assert [str(w.message) for w in caught] == [
            f"checkpoint {paths[40]} skipped: 0 bytes: too short for a safetensors file (8-byte header length, "
            "header, data)",
            f"checkpoint {paths[30]} skipped: the tensors cover {os.path.getsize(paths[20]) - 8 - header_len(paths[20])}"
            f" bytes of data; the file holds {os.path.getsize(paths[30]) - 8 - header_len(paths[30])}"]
        with pytest.warns(RuntimeWarning) as caught:
            state = ckpt.load()
        assert_same_state(state, state_at(10))
        messages = [str(w.message) for w in caught]
        assert len(messages) == 3 and all(m.endswith("trying the one before it") for m in messages)
        for message, step, reason in zip(messages, (40, 30, 20), ("too short", "tensors cover", "CRC-32")):
            assert message.startswith(f"checkpoint {paths[step]} cannot be read: ") and reason in message


def header_len(path: str) -> int:
    with open(path, "rb") as f:
        return int.from_bytes(f.read(8), "little")


def test_nested_numpy_state_round_trips_with_its_types_and_numpy_reads_the_arrays(tmp_path):
    state = {
        "model": {"w": np.arange(6.0).reshape(2, 3), "b": np.float32(0.5), "c": np.float64(0.1)},
        "history": [0.1, 0.25, float("nan"), float("inf")],
        "shape": (3, 4),
        "by_id": {0: np.ones(2, np.int8), 1: None},
        "flags": [True, False, None],
        "name": "run-a", "blob": b"\x00\xff", "big": 2**70, "lr": 1e-3 / 3,
        "a.b": np.zeros(1), "a": {"b": np.ones(1)},  # one path twice: a member name is made up
        "nul\0key": np.ones(1), "\udc80": np.ones(1),  # no tensor name in UTF-8: made up too
    }
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 5)
        back = ckpt.load()  # waits for the pending save: no "no checkpoint" right after save()
    assert back["shape"] == (3, 4) and type(back["shape"]) is tuple
    assert back["by_id"][1] is None and list(back["by_id"]) == [0, 1]
    assert back["by_id"][0].dtype == np.int8 and back["model"]["b"] == np.float32(0.5)
    assert type(back["model"]["b"]) is np.float32 and type(back["model"]["c"]) is np.float64
    assert back["history"][:2] == [0.1, 0.25] and np.isnan(back["history"][2])
    assert back["lr"] == state["lr"] and back["big"] == 2**70 and back["blob"] == b"\x00\xff"
    assert back["flags"] == [True, False, None] and back["name"] == "run-a"
    assert back["a.b"].tolist() == [0.0] and back["a"]["b"].tolist() == [1.0]
    assert back["nul\0key"].tolist() == [1.0] and back["\udc80"].tolist() == [1.0]
    assert fastloop.read_checkpoint(ckpt.latest().path)["name"] == "run-a"


def test_close_with_a_timeout_leaves_the_writer_finishing_and_a_later_close_waits_for_it(tmp_path):
    ckpt = fastloop.Checkpointer(tmp_path, keep=10, max_pending=3)
    for step in (1, 2, 3):
        ckpt.save({"w": np.full(1 << 20, step, np.float64)}, step)  # 8 MB each
    with pytest.raises(ValueError, match="'timeout' must be >= 0"):
        ckpt.close(timeout=-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'wait'"):
        ckpt.close(wait=False)
    ckpt.close(timeout=0)  # returns at once; what was saved is still written
    with pytest.raises(fastloop.Closed):
        ckpt.save({"w": np.zeros(1)}, 4)
    ckpt.close(timeout=None)  # waits for the writer
    assert ckpt._core.wait_closed(0) and ckpt.stats()["written"] == 3 and ckpt.stats()["pending"] == 0
    assert [c.step for c in ckpt.checkpoints()] == [1, 2, 3]
    assert float(ckpt.load(3)["w"][0]) == 3.0


def test_maybe_save_saves_every_steps_and_only_calls_state_fn_when_due(tmp_path):
    calls = []

    def state_fn():
        calls.append(1)
        return {"w": np.full(4, len(calls))}

    with fastloop.Checkpointer(tmp_path, keep=100, every_steps=10, state_fn=state_fn) as ckpt:
        saved = [step for step in range(0, 41) if ckpt.maybe_save(step=step)]
        assert saved == [10, 20, 30, 40] and len(calls) == 4  # state_fn only runs when due
        assert [c.step for c in ckpt.checkpoints()] == [10, 20, 30, 40]
        assert not ckpt.maybe_save(step=40)  # already saved
        assert ckpt.maybe_save({"w": np.zeros(1)}, 50) and ckpt.load(50)["w"].shape == (1,)
        assert ckpt.maybe_save(lambda: {"w": np.ones(3)}, step=60) and ckpt.load(60)["w"].shape == (3,)


@pytest.mark.parametrize("max_pending", [1, 3])
def test_saving_every_10_steps_for_300_steps_gives_exactly_10_to_300_in_order(tmp_path, max_pending):
    weights = np.zeros(1_000_000)  # 8 MB: the writer falls behind the loop, which must not skip
    ckpt = fastloop.Checkpointer(tmp_path, keep=1000, every_steps=10, max_pending=max_pending)
    saved = []
    for step in range(1, 301):
        weights[:] = step  # one training step
        if ckpt.maybe_save(lambda: {"w": weights, "step": step}, step):
            saved.append(step)
    ckpt.close()
    assert saved == list(range(10, 301, 10))
    assert [c.step for c in ckpt.checkpoints()] == list(range(10, 301, 10))
    stats = ckpt.stats()
    assert stats["written"] == 30 and stats["last_step"] == 300 and stats["pending"] == 0
    for checkpoint in ckpt.checkpoints():
        state = fastloop.read_checkpoint(checkpoint.path)
        assert state["step"] == checkpoint.step and (state["w"] == checkpoint.step).all()


def test_max_pending_is_checked(tmp_path):
    with pytest.raises(ValueError, match="max_pending must be 1 to 64, not 0"):
        fastloop.Checkpointer(tmp_path, max_pending=0)
    with pytest.raises(TypeError, match="'max_pending' must be an int"):
        fastloop.Checkpointer(tmp_path, max_pending=1.5)


def test_a_period_without_maybe_save_calls_warns_at_close(tmp_path):
    ckpt = fastloop.Checkpointer(tmp_path, every_s=600, state_fn=lambda: {"w": np.zeros(1)})
    with pytest.warns(RuntimeWarning, match="never called"):
        ckpt.close()


def test_a_checkpointer_with_a_period_opened_only_to_load_does_not_warn_at_close(tmp_path):
    import warnings

    with fastloop.Checkpointer(tmp_path) as writer:
        writer.save({"w": np.arange(3)}, 10)
    reader = fastloop.Checkpointer(tmp_path, every_steps=5)
    assert reader.load()["w"].tolist() == [0, 1, 2]
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        reader.close()
    assert [str(w.message) for w in recorded] == []
    trainer = fastloop.Checkpointer(tmp_path, every_steps=5)  # loaded, then saved without maybe_save
    trainer.load()
    trainer.save({"w": np.zeros(1)}, 11)
    with pytest.warns(RuntimeWarning, match="never called"):
        trainer.close()


def test_maybe_save_by_time_from_a_loop_trained_in_another_thread_is_never_torn(tmp_path):
    params = [np.zeros(20_000) for _ in range(8)]
    done = threading.Event()
    saved: list[int] = []

    def train() -> None:  # every parameter holds the step number between steps
        ckpt = fastloop.Checkpointer(tmp_path, keep=1000, every_s=0.001)
        step = 0
        while len(saved) < 4 and step < 1_000_000:  # until a few periods passed, however slow
            step += 1
            for p in params:
                p[:] = step
            if ckpt.maybe_save(lambda: {"params": params, "step": step}, step):
                saved.append(step)
        ckpt.close()
        done.set()

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(timeout=120)
    assert done.is_set() and len(saved) == 4
    for checkpoint in fastloop.Checkpointer(tmp_path).checkpoints():
        state = fastloop.read_checkpoint(checkpoint.path)
        assert state["step"] == checkpoint.step
        assert all((p == checkpoint.step).all() for p in state["params"]), checkpoint


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


def test_a_second_checkpointer_on_the_directory_leaves_a_write_in_flight_alone(tmp_path):
    """Opening a Checkpointer removes temp files only of writers that are gone: a second one of
    this process (or of another host, on a shared filesystem) must not delete the first one's
    write in flight (it did: the first save failed with "cannot rename ... No such file")."""
    first = fastloop.Checkpointer(tmp_path, keep=100)
    caught = 0
    for step in range(1, 9):
        first.save({"w": np.full(1 << 20, step, np.float64)}, step)  # 8 MB: a write that takes a while
        while not [n for n in os.listdir(tmp_path) if n.startswith(".ckpt-")] and first.stats()["pending"]:
            pass  # until its temp file shows (or the write is done)
        caught += first.stats()["pending"]
        fastloop.Checkpointer(tmp_path).close()
        assert first.wait(30)  # no CheckpointError
        np.testing.assert_array_equal(first.load(step)["w"], np.full(1 << 20, step, np.float64))
    assert caught, "no second Checkpointer was opened while a write was in flight"
    first.close()


def test_a_process_killed_mid_write_leaves_every_published_checkpoint_readable(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0"  # one checkpoint is published
        deadline = time.monotonic() + 30
        temps = []
        while not temps and time.monotonic() < deadline:  # until a later one is part-way written
            temps = [n for n in os.listdir(tmp_path) if n.startswith(".ckpt-")]
            time.sleep(0.001)  # paces the polling only
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to skip: the published files are all whole
        assert reader.latest() == latest
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
