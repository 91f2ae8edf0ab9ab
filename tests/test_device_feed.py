"""Loader(device="cuda"): which part of a Pipeline the C workers keep and what the GPU
finishes, and that the split draws the same augmentations as the CPU path (runs
everywhere); the device batches themselves against the CPU pipeline (where a GPU exists)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fastloop
from fastloop._core import _SlotLease
from fastloop.data._device_feed import DeviceFeed, GpuFinish, dtype_name, memory_format_name, split_for_device
from fastloop.ops import (Cast, CenterCrop, Normalize, Pipeline, RandomCrop, RandomHFlip, RandomResizedCrop,
                          Resize)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGES_HWC = np.random.default_rng(0).integers(0, 256, (40, 20, 24, 3), dtype=np.uint8)
LABELS = np.arange(40)


# ---------------------------------------------------------------- the split (no GPU needed)

def test_the_workers_keep_the_uint8_steps_and_the_gpu_normalizes():
    pipeline = Pipeline([RandomCrop((16, 12)), RandomHFlip(0.25), Normalize(MEAN, STD, layout="HWC->CHW")])
    host, finish = split_for_device(pipeline, np.uint8, None)
    assert host.steps == (RandomCrop((16, 12)), RandomHFlip(0.25)) and host.layout == "HWC"
    assert finish == GpuFinish(tuple(MEAN), tuple(STD), "HWC->CHW", "float32")
    assert finish.channels_first and finish.source_layout == "HWC"
    host, finish = split_for_device(Pipeline([CenterCrop(8), Normalize(0.5, 0.25)], layout="CHW"), np.uint8, "bfloat16")
    assert host.steps == (CenterCrop(8),) and finish == GpuFinish((0.5,), (0.25,), "CHW", "bfloat16")
    host, finish = split_for_device(Pipeline([Normalize(MEAN, STD), Cast(np.float16)]), np.uint8, None)
    assert host is None and finish == GpuFinish(tuple(MEAN), tuple(STD), "HWC", "float16")


def test_image_pipelines_keep_the_fused_decode_and_flip_in_the_workers():
    pipeline = Pipeline([RandomResizedCrop(224), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    host, finish = split_for_device(pipeline, np.uint8, "float16")
    assert host.geometry == pipeline.geometry and host.fixed_size() == (224, 224)
    assert host.steps == (RandomResizedCrop(224), RandomHFlip()) and finish.dtype == "float16"
    host, finish = split_for_device(Pipeline([Resize(256), CenterCrop(224), Normalize(MEAN, STD)]), np.uint8, None)
    assert host.fixed_size() == (224, 224) and finish.layout == "HWC"


@pytest.mark.parametrize("pipeline", [
    Pipeline([RandomCrop(8)]),  # no Normalize: the uint8 batch is copied as it is
    Pipeline([Normalize(MEAN, STD), RandomCrop(8)]),  # a step after Normalize works on floats
    Pipeline([Normalize(MEAN, STD), Cast(np.uint8)]),  # the CPU's saturating cast
    Pipeline([Cast(np.float32), Normalize(MEAN, STD)]),
])
def test_other_pipelines_stay_on_the_cpu(pipeline):
    assert split_for_device(pipeline, np.uint8, None) == (pipeline, None)
    assert split_for_device(Pipeline([Normalize(MEAN, STD)]), np.float32, None)[1] is None
    assert split_for_device(None, np.uint8, None) == (None, None)


def test_a_cast_and_the_loaders_dtype_must_agree():
    with pytest.raises(ValueError, match="casts to float16 but the Loader was given dtype='bfloat16'"):
        split_for_device(Pipeline([Normalize(MEAN, STD), Cast(np.float16)]), np.uint8, "bfloat16")
    with pytest.raises(ValueError, match="follows a step that yields CHW"):
        split_for_device(Pipeline([Normalize(MEAN, STD, layout="HWC->CHW")], layout="CHW"), np.uint8, None)


def test_dtype_and_memory_format_names():
    assert [dtype_name(v) for v in ("float32", np.float16, np.dtype("float32"), "half", None)] == \
        ["float32", "float16", "float32", "float16", None]
    assert memory_format_name(None) == "contiguous" and memory_format_name("channels_last") == "channels_last"
    torch = sys.modules.get("torch")
    if torch is not None:
        assert dtype_name(torch.bfloat16) == "bfloat16" and memory_format_name(torch.channels_last) == "channels_last"
        assert memory_format_name(torch.contiguous_format) == "contiguous"
    with pytest.raises(ValueError, match="'dtype' must be float32, float16 or bfloat16"):
        dtype_name(np.int8)
    with pytest.raises(ValueError, match="'memory_format'"):
        memory_format_name("nhwc")


def test_bad_device_arguments_name_themselves():
    for bad in ("gpu", "cuda:x", -1, True):
        with pytest.raises(ValueError, match="'device' must be"):
            fastloop.Loader(LABELS, device=bad)
    with pytest.raises(ValueError, match="pass device='cuda' too"):
        fastloop.Loader(IMAGES_HWC, dtype="bfloat16")
    with pytest.raises(ValueError, match="pass device='cuda' too"):
        fastloop.Loader(IMAGES_HWC, memory_format="channels_last")
    with pytest.raises(ValueError, match="'dtype' must be"):
        fastloop.Loader(IMAGES_HWC, dtype="int8")


def _finish_like_the_gpu(u8: np.ndarray, finish: GpuFinish) -> np.ndarray:
    """The kernel's arithmetic in NumPy: x * ((1/255)/std) + (-mean/std) in float32."""
    a = np.float32(1 / 255) / np.asarray(finish.std, np.float32)
    b = -np.asarray(finish.mean, np.float32) / np.asarray(finish.std, np.float32)
    x = u8.astype(np.float32)
    y = x * a + b if finish.source_layout == "HWC" else x * a[:, None, None] + b[:, None, None]
    if finish.layout == "HWC->CHW":
        y = y.transpose(0, 3, 1, 2)
    return y


@pytest.mark.parametrize("workers", [0, 2])
def test_the_split_draws_the_same_crops_and_flips_as_the_cpu_pipeline(workers):
    full = Pipeline([RandomCrop((16, 12)), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    host, finish = split_for_device(full, np.uint8, None)
    cpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, shuffle=True, seed=5, transform=full, num_workers=workers)
    split = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, shuffle=True, seed=5, transform=host,
                            num_workers=workers)
    for epoch in range(2):
        for (x, y), (u8, y2) in zip(cpu, split):
            assert u8.dtype == np.uint8 and u8.shape == (8, 16, 12, 3)
            np.testing.assert_array_equal(y, y2)
            np.testing.assert_allclose(_finish_like_the_gpu(u8, finish), x, rtol=0, atol=2e-6)


def test_image_sources_draw_the_same_resized_crops_and_flips_split_or_not(tmp_path: Path):
    Image = pytest.importorskip("PIL.Image")
    for i in range(12):
        folder = tmp_path / f"c{i % 2}"
        folder.mkdir(exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (60 + 7 * i, 80 - 3 * i, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    full = Pipeline([RandomResizedCrop(32), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    host, finish = split_for_device(full, np.uint8, None)
    source = fastloop.ImageFolder(tmp_path)
    cpu = fastloop.Loader(source, batch_size=4, shuffle=True, seed=3, transform=full, num_workers=2)
    split = fastloop.Loader(source, batch_size=4, shuffle=True, seed=3, transform=host, num_workers=2)
    for (x, y), (u8, y2) in zip(cpu, split):
        np.testing.assert_array_equal(y, y2)
        np.testing.assert_allclose(_finish_like_the_gpu(u8, finish), x, rtol=0, atol=2e-6)


# ---------------------------------------------------------------- on a GPU

needs_gpu = pytest.mark.skipif(not fastloop.cuda.is_available(), reason=f"no usable GPU: {fastloop.cuda.is_available().reason}")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@needs_gpu
def test_device_arrays_match_the_cpu_pipeline():
    aug = Pipeline([RandomCrop((16, 12)), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    cpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, num_workers=2, seed=1)
    gpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, num_workers=2, seed=1, device="cuda")
    assert gpu._feed.finish is not None
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert isinstance(dx, fastloop.cuda.DeviceArray) and dx.shape == x.shape and dx.dtype == np.float32
        np.testing.assert_allclose(dx.to_numpy(), x, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(dy.to_numpy(), y)
    gpu.close()
    half = fastloop.Loader(IMAGES_HWC, batch_size=8, transform=aug, seed=1, device="cuda", dtype="float16")
    for x, dx in zip(fastloop.Loader(IMAGES_HWC, batch_size=8, transform=aug, seed=1), half):
        assert dx.dtype == np.float16
        np.testing.assert_array_equal(dx.to_numpy(), x.astype(np.float16))


@needs_gpu
@pytest.mark.parametrize("dtype, memory_format", [("float32", None), ("bfloat16", "channels_last"),
                                                  ("float16", "contiguous")])
@pytest.mark.parametrize("kernel", [True, False])
def test_torch_cuda_batches_match_the_cpu_pipeline(dtype, memory_format, kernel):
    torch = _torch_cuda()
    aug = Pipeline([RandomCrop((16, 12)), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    cpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, num_workers=2, seed=1)
    gpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, num_workers=2, seed=1, device="cuda",
                          output="torch", dtype=dtype, memory_format=memory_format)
    gpu._feed.kernel = kernel  # False: the same math in torch ops (a fastloop build without CUDA)
    want = getattr(torch, dtype)
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert dx.is_cuda and dx.dtype == want and dx.shape == x.shape and dy.is_cuda
        if memory_format == "channels_last":
            assert dx.is_contiguous(memory_format=torch.channels_last)
        expected = torch.from_numpy(x).to(want).float().numpy()
        np.testing.assert_allclose(dx.float().cpu().numpy(), expected, rtol=0, atol=2e-6 if dtype == "float32" else 1e-2)
        np.testing.assert_array_equal(dy.cpu().numpy(), y)
    gpu.close()


@needs_gpu
def test_torch_cuda_batches_are_ready_on_the_consumers_stream_and_slots_are_pinned_once():
    torch = _torch_cuda()
    images = np.random.default_rng(2).integers(0, 256, (64, 64, 64, 3), dtype=np.uint8)
    aug = Pipeline([Normalize(MEAN, STD, layout="HWC->CHW")])
    loader = fastloop.Loader(images, batch_size=16, transform=aug, num_workers=2, device="cuda", output="torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the batches follow whichever stream is current at hand-out
        sums = [x.double().sum().item() for x in loader]  # two epochs: every slot reused
        sums += [x.double().sum().item() for x in loader]
    expected = [fastloop.ops.normalize(images[i:i + 16], MEAN, STD).astype(np.float64).sum() for i in range(0, 64, 16)]
    np.testing.assert_allclose(sums, expected * 2, rtol=1e-6)
    assert loader._feed.pinner.pinned <= len(loader) + 2  # one registration per slot, not per batch
    loader.close()


@needs_gpu
def test_image_folder_to_torch_cuda_tensors(tmp_path: Path):
    torch = _torch_cuda()
    Image = pytest.importorskip("PIL.Image")
    for i in range(10):
        (tmp_path / "a").mkdir(exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (70, 90, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "a" / f"{i}.jpg", quality=90)
    aug = Pipeline([RandomResizedCrop(32), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    source = fastloop.ImageFolder(tmp_path)
    cpu = fastloop.Loader(source, batch_size=5, transform=aug, seed=4, num_workers=2)
    gpu = fastloop.Loader(source, batch_size=5, transform=aug, seed=4, num_workers=2, device="cuda", output="torch")
    for (x, y), (dx, dy) in zip(cpu, gpu):
        np.testing.assert_allclose(dx.cpu().numpy(), x, rtol=0, atol=2e-6)
        assert dy.tolist() == y.tolist()


@needs_gpu
def test_device_batches_train_a_model():
    x = np.random.default_rng(1).standard_normal((256, 10)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True)).astype(np.float32)
    model = fastloop.nn.Sequential(fastloop.nn.Linear(10, 1), device="cuda")
    opt = fastloop.nn.SGD(model, lr=0.05)
    loader = fastloop.Loader((x, y), batch_size=32, shuffle=True, device="cuda")
    for _ in range(30):
        losses = [model.train_step(bx, by, loss="mse", opt=opt) for bx, by in loader]
    assert losses[-1] < 1e-3
    loader.close()


# ---------------------------------------------------------------- pinning, without a GPU (fake CUDA calls)

class FakeRegistry:
    """Stands for cudaHostRegister/Unregister: records what would be page-locked."""

    def __init__(self) -> None:
        self.pinned: dict[int, int] = {}

    def __call__(self, address: int, nbytes: int):
        assert address not in self.pinned, "pinned twice"
        self.pinned[address] = nbytes
        return lambda: self.pinned.pop(address)


def test_each_slot_is_pinned_once_for_the_rows_it_holds_and_copies_are_left_alone():
    from fastloop.data._pinning import SlotPinner

    data = np.arange(10 * 6, dtype=np.float32).reshape(10, 6)
    loader = fastloop.Loader(data, batch_size=4, num_workers=0)
    registry = FakeRegistry()
    pinner = SlotPinner(4, registry)
    for _ in range(3):  # three epochs of 3 batches (4, 4, 2 rows) from at most 3 slots
        for batch in loader:
            assert pinner.pin(batch)
    assert 2 <= len(registry.pinned) <= 3 and set(registry.pinned.values()) == {4 * 6 * 4}
    assert pinner.pinned == len(registry.pinned)
    small = fastloop.Loader(data[:3], batch_size=4)  # a slot sized for the 3 rows its epoch makes
    for batch in small:
        assert pinner.pin(batch) and registry.pinned[batch.__array_interface__["data"][0]] == 3 * 6 * 4
    assert not pinner.pin(data[:4]) and not pinner.pin(np.array(data[:4]))  # not slot views
    pinner.close()
    assert registry.pinned == {}


class FakeEvent:
    done = False

    def record(self, stream=None) -> None:
        self.stream = stream

    def query(self) -> bool:
        return FakeEvent.done

    def synchronize(self) -> None:
        FakeEvent.done = True


class FakeTorch:
    """The torch calls PinnedBatches makes, without CUDA: tensors are the NumPy arrays."""

    class cuda:
        Event = FakeEvent

        @staticmethod
        def current_stream():
            return "current"

    @staticmethod
    def from_numpy(array):
        return array


def test_a_pinned_slot_goes_back_only_after_the_copies_queued_from_it():
    from fastloop.data._torch_feed import PinnedBatches

    data = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    loader = fastloop.Loader(data, batch_size=4, num_workers=0)
    registry = FakeRegistry()
    pinned = PinnedBatches(4, torch=FakeTorch, register=registry)
    core = loader._core
    core.start_epoch(0)
    FakeEvent.done = False
    (tensor,) = pinned.tensors(core.next(10))
    np.testing.assert_array_equal(tensor, data[:4])
    assert len(registry.pinned) == 1 and core.lent == 1
    del tensor  # the user dropped the batch right after queuing its copy
    assert core.lent == 1 and len(pinned.held) == 1  # held until the event passes
    pinned.release_copied()
    assert core.lent == 1
    FakeEvent.done = True
    pinned.release_copied()
    assert core.lent == 0 and not pinned.held
    (tensor,) = pinned.tensors(core.next(10))
    np.testing.assert_array_equal(tensor, data[4:8])
    del tensor
    pinned.close()
    assert core.lent == 0 and registry.pinned == {}


class FakeFeed(DeviceFeed):
    """A DeviceFeed whose "device" is the host and whose GPU runs `lag` batches behind: an
    upload's host fields stay in flight until `lag` later uploads were queued, unless the
    feed waits for them (wait_oldest, counted in `waits`)."""

    def __init__(self, lag: int) -> None:
        super().__init__(0, None, False, 4)
        self.lag, self.in_flight, self.views, self.waits = lag, [], [], 0

    def upload(self, fields: tuple) -> tuple:
        self.views.append(all(isinstance(f.base, _SlotLease) for f in fields))
        self.in_flight.append(fields)
        return tuple(np.array(f) for f in fields)

    def release_copied(self) -> None:
        del self.in_flight[:max(0, len(self.in_flight) - self.lag)]

    def held(self) -> int:
        return len(self.in_flight)

    def wait_oldest(self) -> None:
        self.waits += 1
        del self.in_flight[0]

    def synchronize(self) -> None:
        self.in_flight.clear()


class PairDataset:
    """A map-style dataset of (x, y) samples: processes mode reads it in forked workers."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


FEED_DATA = np.arange(64 * 5, dtype=np.float32).reshape(64, 5)
MODES = [("threads", 0), ("threads", 2), ("processes", 2)]


def _fed_loader(mode: str, workers: int, lag: int, **kwargs) -> fastloop.Loader:
    """A Loader of FEED_DATA (16 batches of 4) whose device feed is a FakeFeed(lag)."""
    source = (FEED_DATA, np.arange(64)) if mode == "threads" else PairDataset(FEED_DATA, np.arange(64))
    loader = fastloop.Loader(source, batch_size=4, num_workers=workers, mode=mode, **kwargs)
    loader._feed = FakeFeed(lag)
    return loader


@pytest.mark.parametrize("mode, workers", MODES)
@pytest.mark.parametrize("lag", [0, 1, 2, 5])
def test_the_feed_never_makes_the_loader_copy_a_batch_out(mode, workers, lag):
    """Held host batches count against the loader's two lendable slots: the feed lets go of
    the ones already copied, and waits for the oldest copies when the GPU is further behind,
    before taking the next, so every batch stays a view (a copy-out would be a memcpy of the
    whole batch in the main thread, into unpinned memory)."""
    loader = _fed_loader(mode, workers, lag)
    feed = loader._feed
    for epoch in range(2):
        got = [x for x, _ in loader]
        np.testing.assert_array_equal(np.concatenate(got), FEED_DATA)
    assert loader._core.copied_out == 0
    assert len(feed.views) == 32 and all(feed.views)
    assert (feed.waits > 0) == (lag > 1)  # it holds one batch besides the one it takes
    loader.close()


def test_copied_out_counts_the_batches_the_loader_copied():
    """The counter the feed test relies on does count: a user keeping every batch gets copies."""
    loader = fastloop.Loader(FEED_DATA, batch_size=4, num_workers=2)
    kept = list(loader)
    copies = sum(not isinstance(x.base, _SlotLease) for x in kept)
    assert copies > 0 and loader._core.copied_out == copies
    loader.close()


@pytest.mark.parametrize("mode, workers", MODES)
@pytest.mark.parametrize("lag", [0, 2])
def test_state_dict_counts_the_device_batches_handed_out(mode, workers, lag):
    """The feed takes batch i+1 before it hands out batch i: the position still counts the
    batches the user received, the last one included, and a resume from any of them gives
    exactly the rest of the epoch."""
    loader = _fed_loader(mode, workers, lag, shuffle=True, seed=7)
    epoch, states = [], [loader.state_dict()]
    for x, _ in loader:
        epoch.append(x)
        states.append(loader.state_dict())
    assert [s["position"] for s in states] == list(range(17)) and {s["epoch"] for s in states} == {0}
    assert loader.state_dict() == {"epoch": 1, "position": 0, "seed": 7}  # the epoch ended
    loader.close()
    for k in (1, 5, 15, 16):
        resumed = _fed_loader(mode, workers, lag, shuffle=True, seed=7)
        resumed.load_state_dict(states[k])
        rest = [x for x, _ in resumed]
        assert len(rest) == 16 - k
        for a, b in zip(rest, epoch[k:]):
            np.testing.assert_array_equal(a, b)
        resumed.close()


@pytest.mark.parametrize("mode, workers", MODES)
def test_a_broken_off_device_epoch_resumes_at_the_first_batch_not_received(mode, workers):
    loader = _fed_loader(mode, workers, 1)
    batches = iter(loader)
    received = [next(batches)[0] for _ in range(3)]
    del batches  # the feed had taken the fourth batch already
    assert loader.state_dict()["position"] == 3
    resumed = _fed_loader(mode, workers, 1)
    resumed.load_state_dict(loader.state_dict())
    np.testing.assert_array_equal(np.concatenate(received + [x for x, _ in resumed]), FEED_DATA)
    loader.close()
    resumed.close()


def lagging_torch(lag: int):
    """FakeTorch whose stream runs `lag` events behind: an event completes once `lag` later
    ones were recorded, or when waited on (counted in `.waits`)."""

    class Event:
        recorded = 0
        waits = 0

        def record(self, stream=None) -> None:
            self.seq, self.done = Event.recorded, False
            Event.recorded += 1

        def query(self) -> bool:
            return self.done or self.seq < Event.recorded - lag

        def synchronize(self) -> None:
            Event.waits += not self.query()
            self.done = True

    class Torch(FakeTorch):
        class cuda(FakeTorch.cuda):
            pass

    Torch.cuda.Event = Event
    return Torch


@pytest.mark.parametrize("mode, workers", MODES)
@pytest.mark.parametrize("lag", [0, 1, 2, 5])
def test_pinned_batches_stay_views_in_a_training_loop(mode, workers, lag):
    """pin_memory without a device: the user's loop copies each batch and drops it; the slot
    comes back once the copy's event passed, and when the GPU runs behind the loader waits
    for the oldest copies before it takes the next batch rather than copy that batch out."""
    from fastloop.data._torch_feed import PinnedBatches

    loader = _fed_loader(mode, workers, 0)
    loader._feed = None
    torch = lagging_torch(lag)
    loader._pinned = pinned = PinnedBatches(4, torch=torch, register=FakeRegistry())
    loader._assemble.pinned, loader._assemble.torch = pinned, True  # as output="torch", pin_memory=True makes it
    views = []
    real_pin = pinned.pinner.pin
    pinned.pinner.pin = lambda array: views.append(real_pin(array)) or views[-1]
    seen = []
    for x, _ in loader:
        seen.append(np.array(x))  # "x.to('cuda', non_blocking=True)"
    np.testing.assert_array_equal(np.concatenate(seen), FEED_DATA)
    assert len(views) == 32 and all(views) and loader._core.copied_out == 0  # both fields of 16 batches
    assert (torch.cuda.Event.waits > 0) == (lag > 0)  # the loop variable holds a slot too
    loader.close()


# ---------------------------------------------------------------- which GPU "cuda" means (no GPU needed)

class StandInTorchCuda:
    """torch.cuda as parse_device sees it: `started` says whether torch started CUDA."""

    def __init__(self, current: int, started: bool = True) -> None:
        self.current, self.started, self.asked = current, started, 0

    def is_initialized(self) -> bool:
        return self.started

    def current_device(self) -> int:
        self.asked += 1
        assert self.started, "current_device() would start torch's CUDA"
        return self.current


class StandInCudaExtension:
    def __init__(self, current: int) -> None:
        self.current = current

    def current_device(self) -> int:
        return self.current


def _stand_in_torch(monkeypatch, cuda) -> None:
    torch = type(sys)("torch")
    torch.cuda = cuda
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_cuda_means_torchs_current_device_when_torch_started_cuda(monkeypatch):
    from fastloop._device import parse_device

    _stand_in_torch(monkeypatch, StandInTorchCuda(3))  # a torchrun rank after torch.cuda.set_device(3)
    monkeypatch.setattr(fastloop._device, "_cuda_extension", lambda: StandInCudaExtension(1))
    assert parse_device("cuda") == ("cuda", 3)
    assert parse_device("cuda:1") == ("cuda", 1) and parse_device(2) == ("cuda", 2) and parse_device(None) == ("cpu", 0)


def test_cuda_means_the_runtimes_current_device_without_torchs_cuda(monkeypatch):
    from fastloop._device import parse_device

    monkeypatch.setattr(fastloop._device, "_cuda_extension", lambda: StandInCudaExtension(2))
    cold = StandInTorchCuda(3, started=False)
    _stand_in_torch(monkeypatch, cold)  # imported, CUDA not started: not started here either
    assert parse_device("cuda") == ("cuda", 2) and cold.asked == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # torch not imported
    assert parse_device("cuda") == ("cuda", 2)
    monkeypatch.setattr(fastloop._device, "_cuda_extension", lambda: None)
    assert parse_device("cuda") == ("cuda", 0)  # no extension: nothing runs on a GPU anyway


# ---------------------------------------------------------------- the torch-ops fallback (CPU torch)

class CountingTorch:
    """torch, counting the tensors made from Python values (torch.tensor)."""

    def __init__(self, torch) -> None:
        self._torch, self.made = torch, 0

    def tensor(self, *args, **kwargs):
        self.made += 1
        return self._torch.tensor(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


@pytest.mark.parametrize("layout", ["HWC->CHW", "HWC"])
def test_the_torch_fallback_makes_mean_and_std_once_per_device_and_dtype(layout):
    torch = pytest.importorskip("torch")
    from fastloop.data._torch_feed import TorchNormalize

    finish = GpuFinish(tuple(MEAN), tuple(STD), layout, "float32")
    counting = CountingTorch(torch)
    normalize = TorchNormalize(counting, finish)
    for start in range(0, 40, 8):  # five batches
        batch = IMAGES_HWC[start:start + 8]
        out = torch.empty((8, 3, 20, 24) if finish.channels_first else (8, 20, 24, 3), dtype=torch.float32)
        normalize(batch, out)
        expected = _finish_like_the_gpu(batch, finish)
        np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=2e-6)  # addcmul may fuse
    assert counting.made == 2 and len(normalize.constants) == 1  # mean and std, for the first batch only
    normalize.scale_and_shift("cpu", torch.float64)
    assert counting.made == 4 and len(normalize.constants) == 2


# ---------------------------------------------------------------- why no GPU is seen (no GPU needed)

class NoVisibleDevice:
    """fastloop._cuda's answers where CUDA_VISIBLE_DEVICES hides the GPUs: a working driver,
    and cudaGetDeviceCount failing with cudaErrorNoDevice (`raises`) or answering 0."""

    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def driver_version(self) -> int:
        return 13000

    def runtime_version(self) -> int:
        return 13000

    def device_count(self) -> int:
        if self.raises:
            raise fastloop.CudaError("cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice, "
                                     "code 100)")
        return 0


@pytest.mark.parametrize("raises", [True, False])
def test_the_unavailability_reason_names_cuda_visible_devices(monkeypatch, raises):
    from fastloop import cuda

    extension = NoVisibleDevice(raises)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    answer = cuda._availability(extension, {})
    assert not answer and "CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU" in answer.reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert "CUDA_VISIBLE_DEVICES='7'" in cuda._availability(extension, {}).reason
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "CUDA_VISIBLE_DEVICES=" not in cuda._availability(extension, {}).reason


# ---------------------------------------------------------------- the real feeds' waits, with stand-in events

class StandInWork:
    """A CUDA event (TorchFeed) or a DeviceArray (DeviceArrayFeed) whose work is done once
    waited on, or when `done` is set."""

    def __init__(self, done: bool = False) -> None:
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    ready = query

    def synchronize(self) -> None:
        self.waited |= not self.done  # a real wait: the work was not done yet
        self.done = True


def test_the_torch_feed_waits_for_the_oldest_copies_only_while_it_holds_more_than_one_batch():
    from collections import deque

    from fastloop.data._torch_feed import TorchFeed

    feed = object.__new__(TorchFeed)  # no torch CUDA here: only the bookkeeping
    events = [StandInWork(), StandInWork(done=True), StandInWork(), StandInWork()]
    feed.in_flight = deque((event, ("slot fields",)) for event in events)
    feed.make_room()
    assert [e.waited for e in events] == [True, False, True, False] and feed.held() == 1
    assert feed.in_flight[0][0] is events[3]  # the batch just queued stays: it is handed out next


def test_the_device_array_feed_waits_for_the_oldest_arrays_only_while_it_holds_more_than_one_batch():
    from collections import deque

    from fastloop.data._device_feed import DeviceArrayFeed

    feed = object.__new__(DeviceArrayFeed)
    batches = [(StandInWork(), StandInWork(done=True)), (StandInWork(done=True),), (StandInWork(),)]
    feed.in_flight = deque(batches)
    feed.make_room()
    assert batches[0][0].waited and batches[0][1].done and not batches[2][0].waited
    assert list(feed.in_flight) == [batches[2]]
