"""Resize and RandomResizedCrop (fastloop.ops) against Pillow's resampling and torchvision's rules."""

from __future__ import annotations

import numpy as np
import pytest

from fastloop import ops
from test_images import natural

Image = pytest.importorskip("PIL.Image")


def pillow_resize(image: np.ndarray, h: int, w: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))


def assert_close_to_pillow(got: np.ndarray, ref: np.ndarray) -> None:
    """Pillow's two-pass resample, rounded the same way: every pixel within 1 (Pillow 13
    rounds its intermediate pass differently from earlier Pillow and from torchvision's
    uint8 kernel, which fastloop follows to 99.7%)."""
    assert got.shape == ref.shape
    assert np.abs(got.astype(int) - ref).max() <= 1


@pytest.mark.parametrize("shape,size", [((375, 500), 256), ((500, 375), 224), ((375, 500), (224, 224)),
                                        ((50, 60), (300, 200)), ((1, 1), (5, 7)), ((31, 17), (7, 3)),
                                        ((285, 251), (224, 224))])
def test_resize_matches_pillow_bilinear_antialiased(shape: tuple[int, int], size) -> None:
    image = natural(*shape)
    got = ops.resize(image, size)
    assert_close_to_pillow(got, pillow_resize(image, *got.shape[:2]))


def test_resize_int_sets_the_shorter_side_as_torchvision_rounds_it() -> None:
    assert ops.resize(natural(375, 500), 256).shape == (256, 341, 3)
    assert ops.resize(natural(500, 375), 256).shape == (341, 256, 3)
    assert ops.resize(natural(10, 10), 3).shape == (3, 3, 3)


def test_resize_rejects_bad_images() -> None:
    with pytest.raises(ValueError, match="uint8"):
        ops.resize(np.zeros((4, 4, 3), np.float32), 2)
    with pytest.raises(ValueError, match="positive"):
        ops.resize(np.zeros((4, 4, 3), np.uint8), (0, 2))


def test_resized_crop_params_follow_torchvision_bounds_and_are_deterministic() -> None:
    rrc = ops.RandomResizedCrop(224)
    seen = set()
    for index in range(200):
        top, left, h, w = rrc.params(375, 500, seed=5, index=index)
        assert rrc.params(375, 500, seed=5, index=index) == (top, left, h, w)
        assert 0 <= top <= 375 - h and 0 <= left <= 500 - w and h >= 1 and w >= 1
        area = h * w / (375 * 500)
        assert 0.08 * 0.9 <= area <= 1.0 and 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1
        seen.add((top, left, h, w))
    assert len(seen) > 190  # draws differ between images
    assert rrc.params(375, 500, seed=6, index=0) != rrc.params(375, 500, seed=5, index=0)


def test_resized_crop_falls_back_to_a_centre_crop_for_extreme_shapes() -> None:
    # a 1 x 1000 strip: no try fits the ratio range, so torchvision's fallback crop applies
    top, left, h, w = ops.RandomResizedCrop(8).params(1, 1000, seed=0, index=0)
    assert (h, w) == (1, round(1 * 4 / 3)) and top == 0 and left == (1000 - w) // 2
    assert ops.RandomResizedCrop(8).params(1, 1, seed=0, index=0) == (0, 0, 1, 1)


def test_random_resized_crop_on_an_image_equals_pillow_crop_then_resize() -> None:
    image = natural(375, 500)
    rrc = ops.RandomResizedCrop(224)
    pipeline = ops.Pipeline([rrc])
    for index in range(6):
        top, left, h, w = rrc.params(375, 500, seed=3, index=index)
        got = pipeline(image, seed=3, ids=[index])
        ref = np.asarray(Image.fromarray(image).crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR))
        assert_close_to_pillow(got, ref)


def test_resize_then_center_crop_equals_pillow_resize_then_crop() -> None:
    image = natural(375, 500)
    got = ops.Pipeline([ops.Resize(256), ops.CenterCrop(224)])(image, seed=0)
    ref = pillow_resize(image, 256, 341)[16:240, 58:282]
    np.testing.assert_array_equal(got, ref)


def test_smaller_than_the_crop_and_one_pixel_images_upscale() -> None:
    for shape in [(1, 1), (10, 7), (100, 150)]:
        out = ops.Pipeline([ops.RandomResizedCrop(224)])(natural(*shape), seed=1, ids=[0])
        assert out.shape == (224, 224, 3)
    out = ops.Pipeline([ops.Resize(256), ops.CenterCrop(224)])(natural(1, 1), seed=0)
    assert out.shape == (224, 224, 3) and (out == natural(1, 1)[0, 0]).all()


def test_geometry_steps_must_come_first_and_take_hwc() -> None:
    with pytest.raises(ValueError, match="first step"):
        ops.Pipeline([ops.RandomHFlip(), ops.RandomResizedCrop(224)])
    with pytest.raises(ValueError, match="HWC"):
        ops.Pipeline([ops.Resize(256)], layout="CHW")
    with pytest.raises(ValueError, match="larger than Resize"):
        ops.Pipeline([ops.Resize(200), ops.CenterCrop(224)])


def test_full_train_pipeline_on_a_batch_gives_normalized_chw() -> None:
    batch = np.stack([natural(120, 160, seed=s) for s in range(4)])
    pipeline = ops.Pipeline([ops.RandomResizedCrop(64), ops.RandomHFlip(), ops.Normalize([0.5] * 3, [0.25] * 3, layout="HWC->CHW")])
    out = pipeline(batch, seed=0)
    assert out.shape == (4, 3, 64, 64) and out.dtype == np.float32


def test_a_bad_resized_crop_or_pipeline_step_raises_value_error_naming_it() -> None:
    """The geometry check and a pipeline step's check in C both raise ValueError with the
    core's message (through the one table that turns core codes into exceptions)."""
    image = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match=r"RandomResizedCrop needs 0 < scale\[0\] <= scale\[1\]"):
        ops.Pipeline([ops.RandomResizedCrop(8, scale=(0.5, 0.1))])(image, seed=0)
    with pytest.raises(ValueError, match=r"flip probability must be in \[0, 1\]"):
        ops.Pipeline([ops.RandomHFlip(p=2.0)])(image, seed=0)
