"""fastloop.Queue: queue.Queue semantics, close(), C event records, and interruptible waits."""

from __future__ import annotations

import gc
import queue
import signal
import sys
import threading
import time
import weakref

import pytest

import fastloop
from fastloop import _core
from hooks import needs_core_hooks


class Payload:
    """An object we can watch being freed."""


def test_fifo_order_and_snapshot_methods():
    q = fastloop.Queue(maxsize=3)
    assert q.maxsize == 3 and q.empty() and not q.full() and q.qsize() == 0
    for item in ("a", 2, None):
        q.put(item)
    assert q.full() and q.qsize() == 3
    assert [q.get(), q.get(), q.get()] == ["a", 2, None]
    assert q.empty()


def test_nowait_calls_raise_fastloop_errors_that_are_also_queue_errors():
    q = fastloop.Queue(maxsize=1)
    with pytest.raises(fastloop.Empty) as empty:
        q.get_nowait()
    assert isinstance(empty.value, queue.Empty) and isinstance(empty.value, fastloop.Error)
    q.put_nowait(1)
    with pytest.raises(queue.Full):
        q.put_nowait(2)
    with pytest.raises(fastloop.QueueFull):
        q.put(2, block=False)
    assert q.get(block=False) == 1


def test_timed_waits_raise_when_nothing_comes_and_take_what_comes_in_time():
    q = fastloop.Queue(maxsize=1)
    with pytest.raises(fastloop.Empty):  # no item comes: the timeout ends the wait
        q.get(timeout=0.2)
    q.put(1)
    with pytest.raises(fastloop.QueueFull):  # no room comes
        q.put(2, timeout=0.2)
    assert q.qsize() == 1
    producer = threading.Thread(target=q.put, args=(2,), kwargs={"timeout": 60})  # waits for the room we make
    producer.start()
    assert q.get(timeout=60) == 1
    producer.join(60)
    assert not producer.is_alive() and q.get(timeout=60) == 2
    got: list = []
    consumer = threading.Thread(target=lambda: got.append(q.get(timeout=60)))  # waits for the item we put
    consumer.start()
    q.put(3)
    consumer.join(60)
    assert got == [3]


def test_maxsize_zero_or_negative_means_unbounded():
    for maxsize in (0, -5):
        q = fastloop.Queue(maxsize)
        for i in range(10_000):
            q.put_nowait(i)
        assert q.qsize() == 10_000 and q.maxsize == 0 and not q.full()
        assert [q.get_nowait() for _ in range(10_000)] == list(range(10_000))


def test_a_blocked_get_is_woken_by_a_put_from_another_thread():
    q = fastloop.Queue()
    threading.Timer(0.1, q.put, args=("late",)).start()
    assert q.get(timeout=5) == "late"


def test_close_wakes_blocked_getters_and_putters():
    empty, full = fastloop.Queue(), fastloop.Queue(maxsize=1)
    full.put(0)
    results = []

    def wait(call):
        try:
            call()
        except fastloop.Closed as error:
            results.append(error)

    threads = [threading.Thread(target=wait, args=(empty.get,)) for _ in range(3)]
    threads += [threading.Thread(target=wait, args=(lambda: full.put(1),)) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # paces only: a call that starts after close() raises Closed just the same
    empty.close()
    full.close()
    for t in threads:
        t.join(timeout=2)
        assert not t.is_alive()
    assert len(results) == 6


def test_closed_queue_refuses_puts_but_hands_out_what_it_holds():
    q = fastloop.Queue()
    q.put(1)
    q.put(2)
    q.close()
    assert q.closed
    with pytest.raises(fastloop.Closed):
        q.put(3)
    assert q.get() == 1 and q.get_nowait() == 2
    with pytest.raises(fastloop.Closed):
        q.get()
    with pytest.raises(fastloop.Closed):
        q.get_nowait()


def holding_one_payload() -> tuple[fastloop.Queue, weakref.ref]:
    """A queue holding the only reference to a fresh Payload, and a weak reference to it: what
    a test of when the queue drops its items watches."""
    q = fastloop.Queue()
    payload = Payload()
    ref = weakref.ref(payload)
    q.put(payload)
    return q, ref


def test_close_immediate_discards_items_and_releases_join():
    q, ref = holding_one_payload()
    q.close(immediate=True)
    assert ref() is None and q.qsize() == 0
    assert q.join(timeout=0.5) is True


def test_task_done_and_join_follow_queue_queue():
    q = fastloop.Queue()
    for i in range(3):
        q.put(i)

    def worker():
        for _ in range(3):
            q.get()
            time.sleep(0.01)
            q.task_done()

    threading.Thread(target=worker).start()
    assert q.join() is True
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()
    q.put(1)
    assert q.join(timeout=0.05) is False


def test_iteration_stops_when_closed_and_empty_and_with_closes():
    with fastloop.Queue() as q:
        for i in range(5):
            q.put(i)
    assert q.closed
    assert list(q) == [0, 1, 2, 3, 4]


def test_get_many_takes_what_is_queued_up_to_max_items():
    q = fastloop.Queue()
    for i in range(10):
        q.put(i)
    assert q.get_many(4) == [0, 1, 2, 3]
    assert q.get_many(100) == [4, 5, 6, 7, 8, 9]
    assert q.get_many(5, timeout=0.05) == []
    q.close()
    with pytest.raises(fastloop.Closed):
        q.get_many(1)


def test_items_are_neither_leaked_nor_freed_early():
    q, ref = holding_one_payload()
    gc.collect()
    assert ref() is not None  # the queue holds it
    got = q.get()
    assert got is ref()
    del got
    assert ref() is None
    before = sys.getrefcount(ref)  # a freed queue drops what it holds
    q2 = fastloop.Queue()
    q2.put(ref)
    assert sys.getrefcount(ref) == before + 1
    del q2
    assert sys.getrefcount(ref) == before


def test_a_queue_that_holds_itself_is_collected():
    q = fastloop.Queue()
    q.put(q)
    ref = weakref.ref(q)
    del q
    gc.collect()
    assert ref() is None


@needs_core_hooks
def test_event_records_put_by_c_threads_arrive_as_events():
    q = fastloop.Queue(maxsize=16)  # smaller than the count: producers must block and resume
    received = []
    consumer = threading.Thread(target=lambda: received.extend(q.get(timeout=5) for _ in range(300)))
    consumer.start()
    assert _core._emit_events(q, 100, producers=3, name="gpu0/mem_used") == 300
    consumer.join(timeout=5)
    assert len(received) == 300
    first = received[0]
    assert isinstance(first, fastloop.Event) and isinstance(first, tuple)
    assert first.name == "gpu0/mem_used" and first.kind == "scalar"
    assert abs(first.wall_time - time.time()) < 60
    by_source = {}
    for event in received:
        by_source.setdefault(event.source, []).append(event.step)
        assert event.value == float(event.step)
    assert sorted(by_source) == [0, 1, 2]
    assert all(steps == list(range(100)) for steps in by_source.values())  # FIFO per producer


@needs_core_hooks
def test_python_objects_and_c_events_share_one_queue():
    q = fastloop.Queue()
    q.put("from python")
    _core._emit_events(q, 2, name="from C")
    q.put({"done": True})
    items = [q.get_nowait() for _ in range(4)]
    assert items[0] == "from python" and items[3] == {"done": True}
    assert [e.name for e in items[1:3]] == ["from C", "from C"]


@needs_core_hooks
def test_event_producers_stop_when_the_queue_closes():
    q = fastloop.Queue(maxsize=4)
    threading.Timer(0.1, q.close).start()
    put = _core._emit_events(q, 1_000_000, producers=2)
    assert put == 4  # the slots filled before close; nobody consumed


def test_python_threads_4_producers_4_consumers_lose_nothing():
    q = fastloop.Queue(maxsize=64)
    n, producers = 5000, 4
    seen = []
    lock = threading.Lock()

    def produce(p):
        for i in range(n):
            q.put((p, i))

    def consume():
        mine = list(q)  # until closed and empty
        with lock:
            seen.extend(mine)

    consumers = [threading.Thread(target=consume) for _ in range(4)]
    workers = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in consumers + workers:
        t.start()
    for t in workers:
        t.join()
    q.close()
    for t in consumers:
        t.join(timeout=10)
    assert sorted(seen) == [(p, i) for p in range(producers) for i in range(n)]


@needs_core_hooks
def test_c_threads_4x4_with_close_during_traffic_lose_nothing():
    result = _core._queue_load(4, 4, 50_000, maxsize=256, close_early=True)
    assert result["duplicates"] == result["missing"] == result["reordered"] == 0
    result = _core._queue_load(4, 4, 50_000, maxsize=256)
    assert result["received"] == 200_000 and result["missing"] == 0


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
@pytest.mark.parametrize("blocking_call", ["get", "put", "join", pytest.param("emit", marks=needs_core_hooks)])
def test_ctrl_c_interrupts_a_blocked_call_promptly(blocking_call, sigint_raises):
    q = fastloop.Queue(maxsize=1)
    if blocking_call in ("put", "join", "emit"):
        q.put("occupied")
    call = {
        "get": lambda: fastloop.Queue().get(timeout=30),
        "put": lambda: q.put("more", timeout=30),
        "join": lambda: q.join(timeout=30),
        "emit": lambda: _core._emit_events(q, 10),
    }[blocking_call]
    main = threading.main_thread().ident
    sent = []

    def interrupt():
        time.sleep(0.2)
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        call()
    latency = time.monotonic() - sent[0]
    assert latency < 2.0, f"took {latency:.3f}s to see Ctrl-C"  # 50 ms slices; margin for load


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError):
        fastloop.Queue("ten")
    q = fastloop.Queue()
    with pytest.raises(ValueError, match="timeout"):
        q.get(timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        q.put(1, timeout=float("nan"))
    with pytest.raises(TypeError):
        q.get(timeout="soon")
    with pytest.raises(ValueError, match="max_items"):
        q.get_many(0)


@needs_core_hooks
def test_the_c_event_hook_refuses_a_queue_that_is_not_fastloops():
    with pytest.raises(TypeError, match="fastloop.Queue"):
        _core._emit_events(queue.Queue(), 1)


def test_queue_is_generic_for_type_hints_and_has_a_useful_repr():
    alias = fastloop.Queue[int]
    assert alias.__origin__ is fastloop.Queue
    q = fastloop.Queue(maxsize=2)
    q.put(1)
    assert repr(q) == "<fastloop.Queue maxsize=2 qsize=1>"
    q.close()
    assert repr(q).endswith(" closed>")
    assert weakref.ref(q)() is q
