"""Loader(device="cuda"): which pipelines move to the GPU and the draws they use (runs
everywhere), and the device batches against the CPU pipeline (where a GPU exists)."""

from __future__ import annotations

import numpy as np
import pytest

import fastloop
from fastloop._device_feed import GpuPlan, draws, gpu_plan
from fastloop.ops import Cast, CenterCrop, Normalize, Pipeline, RandomCrop, RandomHFlip

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGES_HWC = np.random.default_rng(0).integers(0, 256, (40, 20, 24, 3), dtype=np.uint8)
LABELS = np.arange(40)


def test_gpu_plan_takes_crop_flip_normalize_pipelines():
    plan = gpu_plan(Pipeline([RandomCrop((16, 12)), RandomHFlip(0.25), Normalize(MEAN, STD, layout="HWC->CHW")]), IMAGES_HWC)
    assert plan == GpuPlan(crop=(16, 12), random_crop=True, flip_p=0.25, mean=tuple(MEAN), std=tuple(STD), layout="HWC->CHW")
    plan = gpu_plan(Pipeline([CenterCrop(8), Normalize(0.5, 0.25)], layout="CHW"), IMAGES_HWC)
    assert plan == GpuPlan(crop=(8, 8), random_crop=False, flip_p=0.0, mean=0.5, std=0.25, layout="CHW")
    assert gpu_plan(Pipeline([Normalize(MEAN, STD)]), IMAGES_HWC).layout == "HWC"


@pytest.mark.parametrize("pipeline", [
    Pipeline([RandomCrop(8)]),  # no Normalize: the output stays uint8
    Pipeline([Normalize(MEAN, STD), Cast(np.float16)]),
    Pipeline([RandomHFlip(), RandomCrop(8), Normalize(MEAN, STD)]),  # flip before crop
])
def test_other_pipelines_stay_on_the_cpu(pipeline):
    assert gpu_plan(pipeline, IMAGES_HWC) is None
    assert gpu_plan(Pipeline([Normalize(MEAN, STD)]), IMAGES_HWC.astype(np.float32)) is None
    assert gpu_plan(None, IMAGES_HWC) is None


def test_draws_are_reproducible_and_in_range():
    plan = GpuPlan(crop=(16, 12), random_crop=True, flip_p=0.5, mean=0.0, std=1.0, layout="HWC")
    offsets, flips = draws(plan, (20, 24), 1000, seed=3, epoch=2, batch=5)
    again, flips_again = draws(plan, (20, 24), 1000, seed=3, epoch=2, batch=5)
    np.testing.assert_array_equal(offsets, again)
    np.testing.assert_array_equal(flips, flips_again)
    assert offsets.dtype == np.int32 and offsets.shape == (1000, 2)
    assert offsets[:, 0].min() == 0 and offsets[:, 0].max() == 4 and offsets[:, 1].max() == 12
    assert 0.4 < flips.mean() < 0.6
    other, _ = draws(plan, (20, 24), 1000, seed=3, epoch=3, batch=5)
    assert not np.array_equal(offsets, other)
    with pytest.raises(ValueError, match="larger than the images"):
        draws(plan, (10, 24), 4, seed=0, epoch=0, batch=0)


def test_bad_device_strings():
    for bad in ("gpu", "cuda:x", -1, True):
        with pytest.raises(ValueError, match="'device' must be"):
            fastloop.Loader(LABELS, device=bad)


needs_gpu = pytest.mark.skipif(not fastloop.cuda.is_available(), reason=f"no usable GPU: {fastloop.cuda.is_available().reason}")


@needs_gpu
def test_device_batches_match_the_cpu_pipeline():
    aug = Pipeline([CenterCrop((16, 12)), Normalize(MEAN, STD, layout="HWC->CHW")])
    cpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, workers=2)
    gpu = fastloop.Loader((IMAGES_HWC, LABELS), batch_size=8, transform=aug, workers=2, device="cuda")
    assert gpu._feed.plan is not None
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert isinstance(dx, fastloop.cuda.DeviceArray) and dx.shape == x.shape and dx.dtype == np.float32
        np.testing.assert_allclose(dx.to_numpy(), x, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(dy.to_numpy(), y)
    gpu.close()


@needs_gpu
def test_random_crops_and_flips_on_the_gpu_follow_the_draws():
    aug = Pipeline([RandomCrop((16, 12)), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    with fastloop.Loader(IMAGES_HWC, batch_size=10, transform=aug, seed=7, device="cuda") as loader:
        for index, dx in enumerate(loader):
            plan = loader._feed.plan
            offsets, flips = draws(plan, (20, 24), 10, seed=7, epoch=0, batch=index)
            host = IMAGES_HWC[index * 10:(index + 1) * 10]
            expected = fastloop.ops.crop(host, (16, 12), offsets=offsets, layout="HWC")
            expected = fastloop.ops.normalize(fastloop.ops.hflip(expected, flip=flips, layout="HWC"), MEAN, STD, layout="HWC->CHW")
            np.testing.assert_allclose(dx.to_numpy(), expected, rtol=1e-6, atol=1e-6)


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
