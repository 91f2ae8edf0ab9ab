"""fastloop.Monitor: every sink format, callbacks on their own thread, GPU sources, the
queue-full policy, errors reported (never swallowed) and clean exits."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import fastloop
from fastloop import monitor as monitor_module
from test_metrics import assert_checks_name_and_value
from waiting import wait_for


@pytest.fixture(autouse=True)
def no_gpu_notice(monkeypatch):
    """Most tests do not care that this machine has no GPU."""
    monkeypatch.setattr(monitor_module, "_gpu_notice_given", True)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def wait_for_rounds(mon, rounds: int, timeout: float = 10.0) -> None:
    """Waits until `rounds` whole sampling rounds ran after the call: the round in progress
    when it is called may have started before, so it does not count (its samples can
    predate what the test just did)."""
    target = mon.stats()["samples"] + 1 + rounds
    wait_for(lambda: mon.stats()["samples"] >= target, timeout)


def test_csv_rows_for_scalars_markers_and_samples(tmp_path):
    path = tmp_path / "m.csv"
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.CSVSink(path)], gpu=False) as mon:
        for step in range(5):
            mon.scalar("train/loss", 1.0 / (step + 1), step)
        mon.event("epoch_end", step=4)
        wait_for_rounds(mon, 2)  # a whole round after step 4 was given
    rows = read_csv(path)
    losses = [r for r in rows if r["name"] == "train/loss"]
    assert [(int(r["step"]), float(r["value"])) for r in losses] == [(s, 1.0 / (s + 1)) for s in range(5)]
    assert {r["kind"] for r in losses} == {"scalar"}
    assert [r["kind"] for r in rows if r["name"] == "epoch_end"] == ["marker"]
    sampled = {r["name"] for r in rows if r["name"].startswith(("host/", "monitor/"))}
    assert {"host/rss_bytes", "host/mem_available_bytes", "monitor/dropped"} <= sampled
    rss_steps = [int(r["step"]) for r in rows if r["name"] == "host/rss_bytes"]
    assert rss_steps[-1] == 4  # samples carry the latest step given (0 before any)
    with fastloop.Monitor(interval_s=0, sinks=[fastloop.CSVSink(path)]) as mon:  # appending
        mon.scalar("train/loss", 0.1, 5)
    with open(path) as f:
        assert f.read().count("wall_time,step,name") == 1


def test_jsonl_lines_parse_including_nan(tmp_path):
    path = tmp_path / "m.jsonl"
    with fastloop.Monitor(interval_s=0, sinks=[fastloop.JSONLSink(path)]) as mon:
        mon.scalar("acc", 0.5, 1)
        mon.scalar("weird \"name\"", float("nan"), 2)
    lines = [json.loads(line) for line in open(path)]
    assert lines[0] == {"wall_time": lines[0]["wall_time"], "step": 1, "name": "acc", "value": 0.5,
                        "kind": "scalar", "source": -1}
    assert lines[1]["name"] == 'weird "name"' and math.isnan(lines[1]["value"])
    assert abs(lines[0]["wall_time"] - time.time()) < 60


def test_tensorboard_reads_the_event_file(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logdir = tmp_path / "runs" / "a"
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.TensorBoardSink(logdir)], gpu=False) as mon:
        for step in range(100):
            mon.scalar("train/loss", 1.0 / (step + 1), step)
            mon.scalar("lr", 0.01, step)
        mon.event("epoch_end", step=99)  # not a scalar: TensorBoard skips it
        wait_for_rounds(mon, 1)
    files = os.listdir(logdir)
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "lr", "host/rss_bytes"} <= set(tags) and "epoch_end" not in tags
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(100))
    assert all(abs(e.value - 1.0 / (e.step + 1)) < 1e-6 for e in loss)
    assert abs(loss[0].wall_time - time.time()) < 60


def test_callback_runs_on_its_own_thread_and_a_slow_one_blocks_nothing(tmp_path):
    seen, threads = [], set()
    release = threading.Event()

    def slow(event):
        threads.add(threading.current_thread().name)
        release.wait(60)  # stuck until the test lets go
        seen.append(event)

    path = tmp_path / "m.csv"
    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.CallbackSink(slow), fastloop.CSVSink(path)])
    for step in range(1000):
        mon.scalar("x", step, step)
    assert mon.flush(timeout=30)  # the CSV is written although the callback is stuck
    assert len(read_csv(path)) == 1000 and not seen  # ... still on its first record: nothing waited for it
    release.set()
    mon.close()
    assert [e.step for e in seen] == list(range(1000))
    assert threads == {"fastloop-callback"}


def test_a_failing_callback_is_reported_once_and_others_keep_going(tmp_path):
    def boom(event):
        raise RuntimeError(f"webhook down at step {event.step}")

    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.CallbackSink(boom), fastloop.CSVSink(tmp_path / "m.csv")])
    mon.scalar("x", 1, 1)
    deadline, calls = time.monotonic() + 5, 1
    with pytest.raises(fastloop.SinkError, match="webhook down at step 1"):
        while time.monotonic() < deadline:
            calls += 1  # the call that raises has recorded its value too
            mon.scalar("x", 2, 2)
            time.sleep(0.01)
    mon.scalar("x", 3, 3)  # reported once: later calls go on
    mon.close()
    assert len(read_csv(tmp_path / "m.csv")) == calls + 1


def test_a_full_disk_raises_sink_error_naming_the_file():
    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.JSONLSink("/dev/full")])
    mon.scalar("x", 1.0, 0)
    with pytest.raises(fastloop.SinkError, match="/dev/full") as raised:
        mon.flush()
    assert isinstance(raised.value, OSError)
    mon.scalar("x", 2.0, 1)  # reported once; logging carries on (the sink is off)
    mon.close()


def test_errors_past_the_room_are_counted_in_the_next_sink_error():
    mon = fastloop.Monitor(interval_s=0, gpu=False)
    for i in range(40):  # as 40 failing callbacks would: 32 wait to be raised, 8 are counted
        mon._report(f"callback {i} raised")
    with pytest.raises(fastloop.SinkError, match=r"callback 0 raised.*8 more errors were dropped"):
        mon.scalar("x", 1.0)
    raised = []
    for _ in range(31):
        with pytest.raises(fastloop.SinkError) as error:
            mon.scalar("x", 1.0)
        raised.append(str(error.value))
    assert raised == [f"callback {i} raised" for i in range(1, 32)]
    mon.scalar("x", 1.0)  # all reported: logging goes on
    mon._report("a later one")  # the room is back
    with pytest.raises(fastloop.SinkError, match="^a later one$"):
        mon.close()


def test_sinks_create_their_directory_and_unopenable_ones_fail_at_construction(tmp_path):
    fastloop.Monitor(interval_s=0, sinks=[fastloop.CSVSink(tmp_path / "new" / "dir" / "m.csv")]).close()
    assert (tmp_path / "new" / "dir" / "m.csv").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(fastloop.SinkError, match="file"):
        fastloop.Monitor(sinks=[fastloop.CSVSink(tmp_path / "file" / "m.csv")])
    with pytest.raises(fastloop.SinkError, match="file"):
        fastloop.Monitor(sinks=[fastloop.TensorBoardSink(tmp_path / "file" / "run")])
    with pytest.raises(TypeError, match="CSVSink"):
        fastloop.Monitor(sinks=["m.csv"])


def test_scalars_from_many_threads_are_all_written(tmp_path):
    path = tmp_path / "m.csv"
    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.CSVSink(path)], queue_size=1 << 16)

    def log(worker):
        for i in range(5000):
            mon.scalar(f"worker{worker}", i, i)

    threads = [threading.Thread(target=log, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mon.close()
    rows = read_csv(path)
    for w in range(4):
        assert [int(r["step"]) for r in rows if r["name"] == f"worker{w}"] == list(range(5000))
    assert mon.stats()["records"] == 20000 and mon.stats()["dropped_records"] == 0


def test_a_full_queue_drops_records_and_counts_every_one(tmp_path):
    # a one-slot queue and a writer that cannot keep up with a tight loop
    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.CSVSink(tmp_path / "m.csv")], queue_size=1, record_wait_s=0)
    for i in range(20000):
        mon.scalar("x", i, i)
    mon.close()
    stats = mon.stats()
    assert stats["records"] + stats["dropped_records"] == 20000
    assert len(read_csv(tmp_path / "m.csv")) == stats["records"]


def test_watched_metrics_are_reported_as_rates_and_means(tmp_path):
    path = tmp_path / "m.csv"
    metrics = fastloop.Metrics()
    with fastloop.Monitor(interval_s=0.05, sinks=[fastloop.CSVSink(path)], gpu=False, metrics=metrics) as mon:
        for _ in range(6):
            metrics.add("loader/samples", 256)
            metrics.add("loss", 0.5)
            wait_for_rounds(mon, 1)  # each round sees new samples
    rows = read_csv(path)
    rates = [float(r["value"]) for r in rows if r["name"] == "loader/samples/per_s"]
    assert rates and max(rates) > 0
    assert {float(r["value"]) for r in rows if r["name"] == "loss/mean"} == {0.5}
    with pytest.raises(TypeError, match="Metrics"):
        fastloop.Monitor(interval_s=0).attach(object())


def test_gpu_metrics_through_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOOP_NVML_LIBRARY", str(tmp_path / "missing-libnvidia-ml.so"))
    monkeypatch.setenv("FASTLOOP_NVIDIA_SMI", "printf '1024, 81559, 37\\n512, 81559, 3\\n'; true")
    path = tmp_path / "m.csv"
    sampled = threading.Event()  # a whole sample written: both GPUs' rows
    watch = fastloop.CallbackSink(lambda e: e.name == "gpu1/utilization_percent" and sampled.set())
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.CSVSink(path), watch]) as mon:
        assert mon.gpu_source == "nvidia-smi" and "missing-libnvidia-ml.so" in mon.gpu_reason
        wait_for_rounds(mon, 2)  # a whole round, GPUs included
        assert sampled.wait(10), "no GPU sample within 10 s"
    rows = {(r["name"], r["source"]): float(r["value"]) for r in read_csv(path)}
    assert rows[("gpu0/memory_used_bytes", "0")] == 1024 * 2**20
    assert rows[("gpu1/utilization_percent", "1")] == 3


FAKE_NVML = r"""
typedef struct { unsigned long long total, free, used; } mem;
typedef struct { unsigned int gpu, memory; } util;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, mem *m) { m->total = 80ull << 30; m->used = (long)d << 30; m->free = 0; return 0; }
int nvmlDeviceGetUtilizationRates(void *d, util *u) { u->gpu = 40 + (long)d; u->memory = 0; return 0; }
const char *nvmlErrorString(int rc) { return "fake"; }
"""


def test_gpu_metrics_through_nvml_loaded_at_run_time(tmp_path, monkeypatch):
    source = tmp_path / "fake_nvml.c"
    source.write_text(FAKE_NVML)
    library = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv("FASTLOOP_NVML_LIBRARY", str(library))
    path = tmp_path / "m.csv"
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.CSVSink(path)]) as mon:
        assert mon.gpu_source == "nvml"
        wait_for_rounds(mon, 2)  # a whole round, GPUs included
    rows = {r["name"]: float(r["value"]) for r in read_csv(path)}
    assert rows["gpu0/memory_used_bytes"] == 2**30 and rows["gpu1/memory_used_bytes"] == 2 * 2**30
    assert rows["gpu1/memory_total_bytes"] == 80 * 2**30 and rows["gpu0/utilization_percent"] == 41


def test_no_gpu_gives_one_info_notice_and_no_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(monitor_module, "_gpu_notice_given", False)
    monkeypatch.setenv("FASTLOOP_NVML_LIBRARY", str(tmp_path / "none.so"))
    monkeypatch.setenv("FASTLOOP_NVIDIA_SMI", "false")
    caplog.set_level(logging.INFO, logger="fastloop")
    with warnings_recorded() as recorded:
        warnings.simplefilter("always")
        mon = fastloop.Monitor(interval_s=1)
        mon.close()
        fastloop.Monitor(interval_s=1).close()
    assert [str(w.message) for w in recorded] == []
    notices = [r for r in caplog.records if "no GPU metrics" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO
    assert "host metrics only" in notices[0].getMessage() and "no GPU metrics" in mon.gpu_reason


def warnings_recorded():
    return warnings.catch_warnings(record=True)


def test_a_scalar_of_several_elements_raises_a_type_error_naming_value():
    torch = pytest.importorskip("torch")
    with fastloop.Monitor(interval_s=0) as mon:
        for value in (torch.tensor([1.0, 2.0]), np.array([1.0, 2.0])):
            with pytest.raises(TypeError, match="'value' must be a real number"):
                mon.scalar("loss", value)
        with pytest.raises(TypeError, match="'values'\\['loss'\\] must be a real number"):
            mon.scalars({"loss": torch.tensor([1.0, 2.0])})
        mon.scalar("loss", torch.tensor(1.5))  # a 0-d tensor is a number
        with pytest.raises(OverflowError):
            mon.scalar("loss", 10**400)


def test_bad_records_and_closed_monitor():
    mon = fastloop.Monitor(interval_s=0)
    assert_checks_name_and_value(mon.scalar)
    with pytest.raises(ValueError, match="'step' must be >= 0"):
        mon.scalar("x", 1.0, -3)
    with pytest.raises(TypeError):
        mon.scalar("x")
    mon.scalar(name="x", value=1.0, step=3)  # keywords work too
    mon.event("done", value=2.0)
    mon.close()
    with pytest.raises(fastloop.Closed):
        mon.scalar("x", 1.0)
    with pytest.raises(ValueError, match="interval"):
        fastloop.Monitor(interval_s=-1)


def test_close_without_waiting_returns_at_once_and_still_writes(tmp_path):
    path, release, seen = tmp_path / "m.csv", threading.Event(), []

    def stuck(event):
        release.wait(60)  # until the test lets go
        seen.append(event)

    mon = fastloop.Monitor(interval_s=0.01, sinks=[fastloop.CallbackSink(stuck), fastloop.CSVSink(path)], gpu=False)
    for i in range(10000):
        mon.scalar("x", i, i)
    mon.close(timeout=0)
    assert not seen  # it returned while a sink was stuck on its first record: it waited for nothing
    release.set()
    assert mon._core.wait_closed(30)
    assert len([r for r in read_csv(path) if r["name"] == "x"]) == 10000


def test_close_with_a_timeout_returns_while_the_writer_is_stuck_and_a_later_close_finishes(tmp_path):
    """The JSONL sink writes into a pipe nobody reads: once its buffer is full the C writer
    blocks in write(), so close(timeout=0.2) must come back with the writer still running;
    once the pipe is drained, close() (no timeout) waits for every record."""
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the sink open it for writing
    mon = fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.JSONLSink(path)], record_wait_s=5.0)
    for i in range(20000):  # far over a pipe's 64 KiB
        mon.scalar("x", i, i)
    mon.close(timeout=0.2)
    assert not mon._core.wait_closed(0)  # returned with the writer still blocked on the pipe
    received = bytearray()

    def drain():
        os.set_blocking(reader, True)
        while chunk := os.read(reader, 1 << 16):  # until the sink closes its end
            received.extend(chunk)

    drainer = threading.Thread(target=drain)
    drainer.start()
    mon.close()  # no timeout: waits until everything is written and the sink closed
    drainer.join(30)
    os.close(reader)
    assert len(received.splitlines()) == 20000


def test_close_checks_its_timeout(tmp_path):
    mon = fastloop.Monitor(interval_s=0, gpu=False)
    with pytest.raises(ValueError, match="'timeout' must be >= 0"):
        mon.close(timeout=-1)
    with pytest.raises(TypeError, match="'timeout' must be a number"):
        mon.close(timeout="1")
    with pytest.raises(TypeError, match="unexpected keyword argument 'wait'"):
        mon.close(wait=True)
    mon.close(timeout=5)
    mon.close()  # idempotent


class CountingSource:
    """An object with stats(), as a Loader or a Checkpointer has: counts, a gauge, a nested
    distribution and a string that the Monitor leaves out."""

    def __init__(self):
        self.batches = 0

    def stats(self):
        self.batches += 10
        return {"batches": self.batches, "wait_s": 0.25, "latency_s": {"p50": 0.5}, "state": "running"}


def test_attach_samples_any_object_with_stats_and_the_rates_of_its_counts(tmp_path):
    path = tmp_path / "m.csv"
    source = CountingSource()
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.CSVSink(path)], gpu=False, host=False) as mon:
        mon.attach(source)
        mon.attach(CountingSource(), name="val_loader")
        wait_for(lambda: source.batches >= 40, 10)  # several rounds read it
    rows = read_csv(path)
    names = {r["name"] for r in rows}
    assert {"countingsource/batches", "countingsource/batches/per_s", "countingsource/wait_s",
            "countingsource/latency_s/p50", "val_loader/batches"} <= names
    assert not any("state" in name for name in names)  # not a number
    assert "countingsource/wait_s/per_s" not in names  # a float is not a count: no rate
    assert {float(r["value"]) for r in rows if r["name"] == "countingsource/wait_s"} == {0.25}
    rates = [float(r["value"]) for r in rows if r["name"] == "countingsource/batches/per_s"]
    assert rates and min(rates) > 0


def test_attach_refuses_what_has_no_stats_and_reports_a_failing_stats_as_sink_error(tmp_path):
    mon = fastloop.Monitor(interval_s=0.01, gpu=False, sinks=[fastloop.CSVSink(tmp_path / "m.csv")])
    with pytest.raises(TypeError, match=r"fastloop.Metrics or an object with a stats\(\) method.*not object"):
        mon.attach(object())

    class NotADict:
        def stats(self):
            return [1, 2]

    with pytest.raises(TypeError, match=r"NotADict.stats\(\) returned list"):
        mon.attach(NotADict())
    with pytest.raises(TypeError, match="'name' applies to a stats"):
        mon.attach(fastloop.Metrics(), name="x")

    class Breaks:
        calls = 0

        def stats(self):
            Breaks.calls += 1
            if Breaks.calls > 1:
                raise RuntimeError("gone")
            return {"n": 1}

    mon.attach(Breaks())
    wait_for(lambda: Breaks.calls >= 3, 10)  # keeps being read after it failed
    with pytest.raises(fastloop.SinkError, match=r"Breaks.stats\(\) of attached 'breaks' raised RuntimeError: gone"):
        mon.close()


EXIT_SCRIPT = """
import sys, time, fastloop
mon = fastloop.Monitor(interval_s=0.01, sinks=[fastloop.CSVSink(sys.argv[1])], gpu=False)
for i in range(50000):
    mon.scalar("x", i, i)
print(time.monotonic(), flush=True)
# no close(): the exit handler must write everything and not hang
"""


def test_exiting_with_a_live_monitor_writes_everything_quickly(tmp_path):
    path = tmp_path / "m.csv"
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(path)], capture_output=True, text=True, timeout=60)
    ended = time.monotonic()
    assert out.returncode == 0, out.stderr
    exit_took = ended - float(out.stdout.strip())
    assert exit_took < 5.0, f"exit took {exit_took:.2f} s"
    assert len([r for r in read_csv(path) if r["name"] == "x"]) == 50000


def test_start_step_stamps_sampled_records_of_a_resumed_run(tmp_path):
    path = tmp_path / "m.csv"
    with fastloop.Monitor(interval_s=0.01, sinks=[fastloop.CSVSink(path)], gpu=False, start_step=500) as mon:
        wait_for_rounds(mon, 2)  # samples before the first scalar
        mon.scalar("loss", 1.0, 501)
    rows = list(csv.DictReader(open(path)))
    host_steps = {int(r["step"]) for r in rows if r["name"].startswith("host/")}
    assert host_steps and min(host_steps) >= 500
    with pytest.raises(ValueError, match="start_step"):
        fastloop.Monitor(start_step=-1)
