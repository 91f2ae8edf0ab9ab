"""The declaration-driven argument parser (csrc/py/py_args.c), through the bindings that use
it: Queue.put/get, Monitor.scalar/event/close, the loaders' next/start_epoch and the
_Loader/_Monitor constructors. Every mistake is a TypeError (or an OverflowError for an int
out of range) naming the function and the argument."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import fastloop
from fastloop import _core


@pytest.fixture
def queue():
    q = fastloop.Queue(maxsize=8)
    yield q
    q.close(immediate=True)


def test_defaults_positional_and_keyword_mixes_reach_the_call(queue):
    queue.put(1)
    queue.put(2, True)
    queue.put(3, timeout=1.0)
    queue.put(item=4, block=False)
    queue.put(5, True, None)
    assert [queue.get(), queue.get(False), queue.get(block=True, timeout=1.0), queue.get(False, None),
            queue.get(timeout=None)] == [1, 2, 3, 4, 5]


def test_a_keyword_name_built_at_run_time_matches_too(queue):
    name = "".join(["time", "out"])  # not the interned literal: the by-value compare finds it
    queue.put(7, **{name: 1.0})
    assert queue.get(**{name: 1.0}) == 7


def test_missing_required_argument_is_named(queue):
    with pytest.raises(TypeError, match=r"^put\(\) missing required argument 'item' \(pos 1\)$"):
        queue.put()
    with pytest.raises(TypeError, match=r"^put\(\) missing required argument 'item'"):
        queue.put(timeout=1.0)


def test_argument_given_twice_is_named(queue):
    with pytest.raises(TypeError, match=r"^put\(\) got multiple values for argument 'item'$"):
        queue.put(1, item=2)


def test_unexpected_keyword_is_named(queue):
    with pytest.raises(TypeError, match=r"^get\(\) got an unexpected keyword argument 'blocking'$"):
        queue.get(blocking=False)


def test_too_many_positional_arguments(queue):
    with pytest.raises(TypeError, match=r"^put\(\) takes at most 3 positional arguments \(4 given\)$"):
        queue.put(1, True, None, 4)


def test_bool_argument_takes_any_truth_value_and_its_error(queue):
    class Untruthful:
        def __bool__(self):
            raise ValueError("no truth here")

    queue.put(1, block=[])  # falsy: the non-blocking put
    assert queue.get(block=0) == 1
    with pytest.raises(ValueError, match="no truth here"):
        queue.put(1, Untruthful())


@pytest.fixture
def monitor(tmp_path):
    path = tmp_path / "m.csv"
    mon = fastloop.Monitor(interval_s=0, sinks=[fastloop.CSVSink(path)], gpu=False, host=False)
    yield mon, path
    mon.close()


def test_scalar_and_event_parse_floats_ints_and_keywords(monitor):
    mon, path = monitor
    mon.scalar("a", 0.5, 1)
    mon.scalar("b", 2, step=2)  # an int value converts
    mon.scalar(name="c", value=np.float32(1.5), step=3)  # an object with __float__
    mon.event("e", value=4.0)  # step defaults to the latest seen
    mon.event("f", step=5)  # value defaults to 0.0
    mon.event("g", 6.0, 6)  # name, value, step: scalar()'s order
    mon.close()
    with open(path) as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert [(rows[n]["step"], float(rows[n]["value"])) for n in "abcefg"] == [
        ("1", 0.5), ("2", 2.0), ("3", 1.5), ("3", 4.0), ("5", 0.0), ("6", 6.0)]


def test_scalar_value_of_the_wrong_type_is_named(monitor):
    mon, _ = monitor
    with pytest.raises(TypeError, match=r"^scalar\(\) argument 'value' must be a real number, not str$"):
        mon.scalar("loss", "0.5")
    with pytest.raises(TypeError, match=r"^scalar\(\) missing required argument 'value' \(pos 2\)$"):
        mon.scalar("loss")
    with pytest.raises(TypeError, match=r"^event\(\) argument 'value' must be a real number, not list$"):
        mon.event("x", [])
    with pytest.raises(TypeError, match=r"^scalar\(\) takes at most 3 positional arguments \(4 given\)$"):
        mon.scalar("loss", 1.0, 1, 2)


def test_close_keyword(monitor):
    mon, _ = monitor
    with pytest.raises(TypeError, match=r"^close\(\) got an unexpected keyword argument 'block'$"):
        mon._core.close(block=True)
    with pytest.raises(TypeError, match=r"^close\(\) got an unexpected keyword argument 'wait'$"):
        mon._core.close(wait=True)
    assert mon._core.close(timeout=None) is True


def test_constructor_keywords_and_types_are_named():
    with pytest.raises(TypeError, match=r"^_Monitor\(\) argument 'interval_s' must be a real number, not str$"):
        _core._Monitor([], interval_s="1")
    with pytest.raises(TypeError, match=r"^_Monitor\(\) got an unexpected keyword argument 'intervals'$"):
        _core._Monitor([], intervals=1.0)
    with pytest.raises(TypeError, match=r"^_Monitor\(\) argument 'nvml_library' must be str or None, not int$"):
        _core._Monitor([], nvml_library=3)
    with pytest.raises(ValueError, match="embedded null character"):
        _core._Monitor([], nvml_library="a\0b")
    with pytest.raises(TypeError, match=r"^_Loader\(\) missing required argument 'batch_size' \(pos 2\)$"):
        _core._Loader([])
    with pytest.raises(TypeError, match=r"^_Loader\(\) argument 'workers' must be int, not float$"):
        _core._Loader([], 2, workers=1.5)
    with pytest.raises(OverflowError, match=r"^_Loader\(\) argument 'rank' is out of range: 4294967296$"):
        _core._Loader([], 2, rank=2**32)
    with pytest.raises(TypeError, match=r"^_Loader\(\) got multiple values for argument 'batch_size'$"):
        _core._Loader([], 2, batch_size=2)


def test_loader_next_and_start_epoch():
    loader = fastloop.Loader(np.arange(8, dtype=np.float32).reshape(4, 2), batch_size=2, num_workers=1)
    try:
        core = loader._core
        with pytest.raises(TypeError, match=r"^start_epoch\(\) argument 'epoch' must be int, not str$"):
            core.start_epoch("0")
        with pytest.raises(OverflowError, match=r"^start_epoch\(\) argument 'epoch' is out of range: -1$"):
            core.start_epoch(-1)
        with pytest.raises(OverflowError, match=r"^start_epoch\(\) argument 'first_batch' is out of range"):
            core.start_epoch(0, 2**64)
        core.start_epoch(epoch=0, first_batch=1)  # keywords: only the second batch is left
        (batch,) = core.next(timeout=10.0)
        assert batch.tolist() == [[4.0, 5.0], [6.0, 7.0]]
        del batch
        assert core.next(10.0) is None
        with pytest.raises(TypeError, match=r"^next\(\) takes at most 1 positional arguments \(2 given\)$"):
            core.next(1.0, 2.0)
    finally:
        loader.close()
