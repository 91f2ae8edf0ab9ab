"""fastloop.Loader with torch: no hang in workers after the parent used torch's thread pool,
torch's generator seeded per batch (different draws across workers, equal across runs),
tensors in (tuples of tensors are fields) and out (output="torch"), DataLoader's names
(num_workers, collate_fn, sampler, batch_sampler, dict samples, target_transform), and
state_dict()/load_state_dict() resuming mid-epoch."""

from __future__ import annotations

import numpy as np
import pytest

import fastloop
from recording import RecordsFetches
from waiting import wait_until

torch = pytest.importorskip("torch")
F = torch.nn.functional


class TorchOpsDataset:
    """__getitem__ runs torch ops big enough to use torch's intra-op pool, and draws with torch."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        x = torch.rand(1, 3, 256, 256)
        y = F.interpolate(x, size=(300, 300), mode="bilinear", align_corners=False)
        return y[0, :, :8, :8].contiguous(), torch.tensor([i, int(torch.randint(1 << 30, ()))])


def use_torch_thread_pool() -> None:
    F.interpolate(torch.rand(8, 3, 128, 128), size=(200, 200), mode="bilinear")


def run(loader: fastloop.Loader) -> np.ndarray:
    return np.concatenate([meta.numpy() if torch.is_tensor(meta) else meta for _, meta in loader])


def test_torch_ops_in_worker_processes_do_not_hang_after_the_parent_used_torch():
    use_torch_thread_pool()
    loader = fastloop.Loader(TorchOpsDataset(), batch_size=8, num_workers=2, mode="processes", timeout=60)
    rows = run(loader)
    assert sorted(rows[:, 0]) == list(range(48))
    assert torch.get_num_threads() >= 1  # the parent's setting is restored after the probe


def test_torch_draws_differ_across_samples_and_workers_and_repeat_across_identical_runs():
    def draws(workers: int, seed: int = 3) -> dict:
        loader = fastloop.Loader(TorchOpsDataset(), batch_size=6, shuffle=True, seed=seed, num_workers=workers,
                                 timeout=60)
        epochs = [run(loader) for _ in range(2)]
        loader.close()
        return {e: dict(zip(rows[:, 0], rows[:, 1])) for e, rows in enumerate(epochs)}

    first, again, three_workers = draws(2), draws(2), draws(3)
    assert len(set(first[0].values())) == 48  # no two samples (hence no two workers) drew alike
    assert first == again == three_workers  # per (seed, epoch, sample): not per worker
    assert first[0] != first[1]  # a new epoch draws anew
    assert draws(2, seed=4)[0] != first[0]


def test_a_tuple_of_tensors_is_fields_not_samples():
    x, y = torch.arange(40.0).reshape(20, 2), torch.arange(20)
    loader = fastloop.Loader((x, y), batch_size=4)
    assert len(loader) == 5
    bx, by = next(iter(loader))
    np.testing.assert_array_equal(bx, x[:4].numpy())
    np.testing.assert_array_equal(by, y[:4].numpy())
    single = fastloop.Loader(x, batch_size=8, drop_last=True)
    assert [b.shape for b in single] == [(8, 2), (8, 2)]


def test_tensors_the_loader_cannot_read_are_refused_naming_the_field():
    with pytest.raises(TypeError, match=r"source\[1\] is a tensor on meta.*\.cpu\(\)"):
        fastloop.Loader((torch.zeros(4, 2), torch.zeros(4, device="meta")))
    with pytest.raises(TypeError, match=r"source is a torch.bfloat16 tensor.*source.float\(\)"):
        fastloop.Loader(torch.zeros(4, 2, dtype=torch.bfloat16))


def test_output_torch_gives_tensors_that_keep_their_slot_alive():
    images = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    labels = np.arange(64)
    for kwargs in ({"num_workers": 2}, {"num_workers": 2, "transform": lambda v: v * 2}, {}):
        loader = fastloop.Loader((images, labels), batch_size=8, output="torch", **kwargs)
        kept = [(x, y) for x, y in loader]  # every slot held by a tensor: later batches are copies
        scale = 2 if "transform" in kwargs else 1
        assert all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x, _ in kept)
        np.testing.assert_array_equal(torch.cat([x for x, _ in kept]).numpy(), images * scale)
        np.testing.assert_array_equal(torch.cat([y for _, y in kept]).numpy(), labels)
        loader.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path (a GPU machine pins)")
def test_pin_memory_without_cuda_warns_and_gives_plain_tensors_as_dataloader_does():
    data = np.arange(16, dtype=np.float32).reshape(8, 2)
    with pytest.warns(UserWarning, match="no CUDA device: batches are not pinned"):
        loader = fastloop.Loader(data, batch_size=4, output="torch", pin_memory=True, num_workers=2)
    batches = list(loader)
    assert all(b.device.type == "cpu" and not b.is_pinned() for b in batches)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), data)
    with pytest.warns(UserWarning, match="no accelerator"):  # what DataLoader does here
        next(iter(torch.utils.data.DataLoader(torch.from_numpy(data), batch_size=4, pin_memory=True)))


def test_pin_memory_with_numpy_output_and_no_device_warns_that_nothing_is_pinned():
    with pytest.warns(UserWarning, match="output='torch'.*not pinned"):
        loader = fastloop.Loader(np.ones((8, 2), np.float32), batch_size=4, pin_memory=True)
    assert isinstance(next(iter(loader)), np.ndarray)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_with_cuda_gives_pinned_tensors_for_non_blocking_copies():
    data = np.arange(16, dtype=np.float32).reshape(8, 2)
    loader = fastloop.Loader(data, batch_size=4, output="torch", pin_memory=True)
    batches = list(loader)
    assert all(b.is_pinned() for b in batches)
    on_gpu = torch.cat([b.to("cuda", non_blocking=True) for b in batches])
    torch.cuda.synchronize()
    np.testing.assert_array_equal(on_gpu.cpu().numpy(), data)


class DictDataset:
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return {"image": torch.full((2, 2), float(i)), "label": i, "weight": np.float32(i / 2)}


@pytest.mark.parametrize("workers", [0, 2])
def test_dict_samples_are_batched_per_key(workers):
    loader = fastloop.Loader(DictDataset(), batch_size=4, num_workers=workers, output="torch")
    batch = next(iter(loader))
    assert list(batch) == ["image", "label", "weight"]
    assert batch["image"].shape == (4, 2, 2) and batch["label"].tolist() == [0, 1, 2, 3]
    assert batch["weight"].dtype == torch.float32


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_fn_gets_the_list_of_samples(workers):
    seen = []

    def collate(samples):
        seen.append(len(samples))
        return torch.stack([s["image"] for s in samples]).sum(), [int(s["label"]) for s in samples]

    loader = fastloop.Loader(DictDataset(), batch_size=5, num_workers=workers, output="torch", collate_fn=collate)
    batches = list(loader)
    assert seen == [5, 5, 2]
    assert [labels for _, labels in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert float(batches[0][0]) == 4 * (0 + 1 + 2 + 3 + 4)


class Odds:
    """A sampler: the odd indices, reversed on odd epochs (set_epoch is called)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        odds = list(range(1, 20, 2))
        return iter(odds[::-1] if self.epoch % 2 else odds)

    def __len__(self) -> int:
        return 10


@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_and_batch_sampler_choose_the_indices(workers):
    labels = np.arange(20)
    loader = fastloop.Loader(labels, batch_size=4, num_workers=workers, sampler=Odds())
    assert np.concatenate(list(loader)).tolist() == list(range(1, 20, 2))
    assert np.concatenate(list(loader)).tolist() == list(range(19, 0, -2))
    loader = fastloop.Loader(labels, num_workers=workers, batch_sampler=[[3, 4, 5], [0, 1, 2], [9]])
    assert [b.tolist() for b in loader] == [[3, 4, 5], [0, 1, 2], [9]]


def test_dataloader_names_refuse_what_would_mean_something_else():
    labels = np.arange(20)
    with pytest.raises(ValueError, match="shuffle=False"):
        fastloop.Loader(labels, sampler=Odds(), shuffle=True)
    with pytest.raises(ValueError, match=r"empty batch \(batch 1 of epoch 0\)"):
        fastloop.Loader(labels, batch_sampler=[[1, 2], [], [3, 4, 5]])
    with pytest.raises(TypeError, match="'workers'"):  # one name each, torch's: num_workers, prefetch_factor
        fastloop.Loader(labels, workers=2)
    with pytest.raises(TypeError, match="'prefetch'"):
        fastloop.Loader(labels, num_workers=1, prefetch=3)
    with pytest.raises(ValueError, match="'output'"):
        fastloop.Loader(labels, output="jax")
    with pytest.raises(ValueError, match="target_transform"):
        fastloop.Loader(labels, target_transform=lambda y: y)


@pytest.mark.parametrize("path", ["train.npy", b"train.npy"])
def test_a_path_as_source_points_to_load_npy_and_folder(path):
    with pytest.raises(TypeError, match=r"load_npy\(path\).*Folder\(path\)"):
        fastloop.Loader(path, batch_size=4)
    with pytest.raises(TypeError, match="load_npy"):
        fastloop.Loader((path, np.arange(3)), batch_size=4)


def test_transform_gets_the_input_and_target_transform_the_label():
    images, labels = np.ones((6, 2), np.float32), np.arange(6)
    loader = fastloop.Loader((images, labels), batch_size=6, transform=lambda x: x * 3,
                             target_transform=lambda y: y + 100)
    x, y = next(iter(loader))
    assert (x == 3).all() and y.tolist() == list(range(100, 106))


def resumed(make, consumed: int, epoch_of_cut: int) -> tuple[list, list]:
    """Batches after a cut at (epoch_of_cut, consumed) from an uninterrupted loader and from a
    new one resumed from the first's state."""
    reference = make()
    for _ in range(epoch_of_cut):
        list(reference)
    it = iter(reference)
    for _ in range(consumed):
        next(it)
    state = reference.state_dict()
    assert state == {"epoch": epoch_of_cut, "position": consumed, "seed": 5}
    rest = [b for b in it] + [b for b in reference]
    fresh = make()
    fresh.load_state_dict(state)
    again = [b for b in fresh] + [b for b in fresh]
    reference.close(), fresh.close()
    return rest, again


AUG = fastloop.ops.Pipeline([fastloop.ops.RandomCrop(4), fastloop.ops.RandomHFlip()], layout="CHW")
IMAGES = np.random.default_rng(0).integers(0, 256, (60, 3, 6, 6), dtype=np.uint8)


@pytest.mark.parametrize("kwargs", [{"num_workers": 2}, {"num_workers": 2, "mode": "processes"}, {"num_workers": 0},
                                    {"num_workers": 2, "dataset": True}])
def test_state_dict_resumes_mid_epoch_with_the_same_batches(kwargs):
    kwargs = dict(kwargs)
    dataset = kwargs.pop("dataset", False)

    def make():
        if dataset:
            return fastloop.Loader(TorchOpsDataset(), batch_size=5, shuffle=True, seed=5, timeout=60, **kwargs)
        return fastloop.Loader((IMAGES, np.arange(60)), batch_size=7, shuffle=True, seed=5, transform=AUG,
                               timeout=60, **kwargs)

    rest, again = resumed(make, consumed=3, epoch_of_cut=1)
    assert len(rest) == len(again) > 0
    for a, b in zip(rest, again):
        for fa, fb in zip(a, b):
            np.testing.assert_array_equal(np.asarray(fa), np.asarray(fb))


def test_state_dict_between_epochs_and_bad_states():
    loader = fastloop.Loader(np.arange(10), batch_size=4, seed=5)
    assert loader.state_dict() == {"epoch": 0, "position": 0, "seed": 5}
    list(loader)
    assert loader.state_dict() == {"epoch": 1, "position": 0, "seed": 5}
    loader.load_state_dict({"epoch": 0, "position": 2, "seed": 5})
    assert [b.tolist() for b in loader] == [[8, 9]]
    loader.load_state_dict({"epoch": 0, "position": 9, "seed": 5})
    assert list(loader) == []
    with pytest.raises(ValueError, match="seed=6"):
        loader.load_state_dict({"epoch": 0, "position": 0, "seed": 6})
    with pytest.raises(ValueError, match="not a Loader state"):
        loader.load_state_dict({"epoch": 0})


def test_ops_take_cpu_tensors_through_zero_copy_views():
    x = torch.ones(2, 4, 4, 3, dtype=torch.uint8)
    out = torch.zeros(2, 3, 4, 4)
    result = fastloop.ops.normalize(x, 0.0, 1.0, out=out)
    assert isinstance(result, np.ndarray) and torch.allclose(out, torch.full_like(out, 1 / 255))  # written in place
    assert fastloop.ops.stack([torch.zeros(3), torch.ones(3)]).tolist() == [[0, 0, 0], [1, 1, 1]]
    assert fastloop.ops.Pipeline([fastloop.ops.CenterCrop(2)])(x).shape == (2, 2, 2, 3)
    with pytest.raises(TypeError, match="x is a tensor on meta"):
        fastloop.ops.hflip(torch.zeros(2, 4, 4, 3, device="meta"))


def test_a_pipeline_whose_layout_does_not_match_the_images_says_so():
    hwc = np.zeros((10, 32, 32, 3), np.uint8)
    chw_pipeline = fastloop.ops.Pipeline([fastloop.ops.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])], layout="CHW")
    for workers in (0, 1):
        with pytest.raises(ValueError, match=r"mean has 3 values, but the images have 32 channels.*layout right"):
            next(iter(fastloop.Loader(hwc, batch_size=2, num_workers=workers, transform=chw_pipeline)))
    with pytest.raises(ValueError, match=r"std has 2 values, but the images have 3 channels"):
        fastloop.ops.Pipeline([fastloop.ops.Normalize(0.5, [0.2, 0.2])])(hwc)


def test_state_dict_after_a_pass_cut_short_still_says_where_it_stopped():
    loader = fastloop.Loader(np.arange(20), batch_size=4, seed=5, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    loader.close()
    assert loader.state_dict() == {"epoch": 0, "position": 2, "seed": 5}
    loader.set_epoch(3)
    assert loader.state_dict() == {"epoch": 3, "position": 0, "seed": 5}


# ---- the failures, as a user meets them: an ImageFolder-like torch Dataset of JPEGs
# with torchvision-like transforms written in torch ops (make test has no torchvision)

class RandomResizedCrop:
    """torchvision's RandomResizedCrop with torch ops: a crop of random area and aspect
    ratio drawn with torch's generator, resized by F.interpolate (big enough to use the pool)."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, image):
        _, h, w = image.shape
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            area = h * w * torch.empty(1).uniform_(*self.scale).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            cw, ch = int(round((area * aspect) ** 0.5)), int(round((area / aspect) ** 0.5))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(torch.randint(0, h - ch + 1, (1,)))
                left = int(torch.randint(0, w - cw + 1, (1,)))
                break
        else:
            top, left, ch, cw = 0, 0, h, w
        crop = image[None, :, top:top + ch, left:left + cw]
        return F.interpolate(crop, size=(self.size, self.size), mode="bilinear", antialias=True,
                             align_corners=False)[0]


def to_tensor(pil_image):
    """torchvision's ToTensor: HWC uint8 -> CHW float in [0, 1]."""
    return torch.from_numpy(np.array(pil_image, np.uint8)).permute(2, 0, 1).float().div(255)


class Normalize:
    def __init__(self, mean, std) -> None:
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, x):
        return (x - self.mean) / self.std


class Compose:
    def __init__(self, steps) -> None:
        self.steps = steps

    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        return x


class TorchImageFolder(torch.utils.data.Dataset):
    """torchvision.datasets.ImageFolder's behaviour: root/<class>/<file>.jpg, PIL decode,
    convert('RGB'), transform on the image, (image, class index) samples."""

    def __init__(self, root, transform=None) -> None:
        import os

        self.classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from PIL import Image

        path, target = self.samples[i]
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return (self.transform(image) if self.transform is not None else image), target


TRANSFORM = Compose([to_tensor, RandomResizedCrop(24), Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


def write_jpegs(root, n: int, same: bool = False, classes: int = 2) -> str:
    """n JPEG files 320x240 in root/class_k/ (all of one picture when `same`); big enough that
    ToTensor's ops run on torch's intra-op pool."""
    Image = pytest.importorskip("PIL.Image")
    yy, xx = np.mgrid[0:240, 0:320]
    for i in range(n):
        folder = root / f"class_{i % classes}"
        folder.mkdir(exist_ok=True)
        k = 0 if same else i
        pixels = np.stack([(xx * (1 + k % 3) + yy * (1 + c) + 20 * k) % 256 for c in range(3)], axis=-1)
        noise = np.random.default_rng(k).integers(0, 20, pixels.shape)
        Image.fromarray((pixels + noise).clip(0, 255).astype(np.uint8)).save(folder / f"{i:03d}.jpg", quality=90)
    return str(root)


def test_image_folder_with_torch_transforms_yields_batches_after_the_parent_used_torchs_pool(tmp_path):
    use_torch_thread_pool()  # the pool runs in the parent: a worker keeping it hung (the deadlock)
    dataset = TorchImageFolder(write_jpegs(tmp_path, 40), transform=TRANSFORM)
    loader = fastloop.Loader(dataset, batch_size=8, shuffle=True, num_workers=2, output="torch", timeout=60)
    batches = list(loader)
    loader.close()
    assert [tuple(x.shape) for x, _ in batches] == [(8, 3, 24, 24)] * 5
    assert all(x.dtype == torch.float32 and y.dtype == torch.int64 for x, y in batches)
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == [0] * 20 + [1] * 20


def test_two_workers_draw_different_augmentations_of_the_same_image(tmp_path):
    # every file is the same picture: equal crops would mean equal random draws
    dataset = TorchImageFolder(write_jpegs(tmp_path, 16, same=True), transform=TRANSFORM)
    loader = fastloop.Loader(dataset, batch_size=4, num_workers=2, output="torch", timeout=60)
    images = torch.cat([x for x, _ in loader])  # batches 0, 2 from worker 0; 1, 3 from worker 1
    loader.close()
    flat = images.reshape(16, -1)
    distinct = {tuple(row.tolist()) for row in flat}
    assert len(distinct) == 16, "two samples were augmented alike (a generator not reseeded per worker)"


def train_losses(root, workers: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 24 * 24, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = fastloop.Loader(TorchImageFolder(root, transform=TRANSFORM), batch_size=8, shuffle=True, seed=1,
                             num_workers=workers, output="torch", timeout=60)
    losses = []
    for _ in range(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    loader.close()
    return losses


def test_identical_runs_give_identical_losses_whatever_the_worker_count(tmp_path):
    root = write_jpegs(tmp_path, 24)
    first = train_losses(root, workers=2)
    assert len(first) == 6 and len(set(first)) == 6
    assert train_losses(root, workers=2) == first
    assert train_losses(root, workers=1) == first  # draws depend on (seed, epoch, sample), not the worker


class BFloat16Samples:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.zeros(2), torch.full((3,), float(i), dtype=torch.bfloat16)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bfloat16_sample_field_is_refused_naming_the_field_and_dtype(workers):
    with pytest.raises(TypeError, match=r"sample field 1 is a torch.bfloat16 tensor.*\.float\(\)"):
        fastloop.Loader(BFloat16Samples(), batch_size=4, num_workers=workers)


def test_prefetch_batches_per_worker_stay_in_flight_while_the_consumer_holds_one():
    dataset = RecordsFetches(40, lambda i: np.float32(i))
    loader = fastloop.Loader(dataset, batch_size=4, num_workers=1, prefetch_factor=2, timeout=60)
    it = iter(loader)
    held = next(it)  # batch 0, still in use: batches 1 and 2 must be made meanwhile (prefetch 2)
    assert wait_until(lambda: dataset.fetched[:12].all()), f"fetched {np.flatnonzero(dataset.fetched)}"
    assert held.tolist() == [0, 1, 2, 3]
    del held
    assert [b.tolist() for b in it][-1] == [36, 37, 38, 39]
    loader.close()


def test_a_dropped_batch_frees_its_slot_for_the_next_batch_at_once():
    dataset = RecordsFetches(40, lambda i: np.float32(i))
    loader = fastloop.Loader(dataset, batch_size=4, num_workers=1, prefetch_factor=1, timeout=60)
    it = iter(loader)
    held = next(it)
    held = next(it)  # batch 0 dropped now: its slot must go to the worker without waiting for next()
    assert wait_until(lambda: dataset.fetched[:12].all()), f"fetched {np.flatnonzero(dataset.fetched)}"
    assert held.tolist() == [4, 5, 6, 7]
    loader.close()
