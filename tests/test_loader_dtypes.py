"""A later sample whose dtype differs from the first sample's (which sizes the batch slots):
its batch is what torch's default_collate makes of the batch's own samples (promoted within
the batch), never the values wrapped or rounded into the first sample's dtype; where the slots
must keep their layout (a Pipeline transform), a sample that does not cast safely raises a
TypeError naming the sample, the field and both dtypes. In every mode."""

from __future__ import annotations

import numpy as np
import pytest

import fastloop
import synthetic
from fastloop.ops import Cast, Pipeline

MODES = [dict(num_workers=0), dict(num_workers=2, mode="threads"), dict(num_workers=2, mode="processes")]
IDS = ["workers0", "threads", "processes"]

# each case: the dataset's sample i, and the batches of 2 default_collate makes (dtype, values)
CASES = {
    "uint8_then_int64": (lambda i: np.array([7], np.uint8) if i == 0 else np.array([300 + i], np.int64),
                         [("int64", [[7], [301]]), ("int64", [[302], [303]])]),
    "int32_then_beyond_32_bits": (lambda i: np.array([1], np.int32) if i == 0 else np.array([2**40 + i], np.int64),
                                  [("int64", [[1], [2**40 + 1]]), ("int64", [[2**40 + 2], [2**40 + 3]])]),
    "float32_then_1e300": (lambda i: np.array([1.0], np.float32) if i == 0 else np.array([1e300], np.float64),
                           [("float64", [[1.0], [1e300]]), ("float64", [[1e300], [1e300]])]),
    "float_label_then_ints": (lambda i: (np.zeros(2, np.float32), 0.5 if i == 0 else i),
                              [("float64", [0.5, 1.0]), ("int64", [2, 3])]),
    "float32_then_float64_fraction": (lambda i: np.array([1.0], np.float32) if i == 0
                                      else np.array([1 + 1e-10], np.float64),
                                      [("float64", [[1.0], [1 + 1e-10]]), ("float64", [[1 + 1e-10], [1 + 1e-10]])]),
}


def _values(batch):
    """The part of a batch each case checks: the array itself, or a (x, label) batch's labels."""
    return batch[1] if isinstance(batch, tuple) else batch


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_later_samples_dtype_gives_default_collates_batch(name, mode):
    make, expected = CASES[name]
    with fastloop.Loader(synthetic.Samples(4, make), batch_size=2, timeout=60, **mode) as loader:
        batches = [_values(b) for b in loader]
    assert [(str(b.dtype), b.tolist()) for b in batches] == expected


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("name", list(CASES))
def test_the_batches_equal_dataloaders(name, mode):
    torch = pytest.importorskip("torch")
    make, _ = CASES[name]
    dataset = synthetic.Samples(4, make)
    with fastloop.Loader(dataset, batch_size=2, timeout=60, output="torch", **mode) as loader:
        ours = [_values(b) for b in loader]
    theirs = [_values(tuple(b) if isinstance(b, list) else b)
              for b in torch.utils.data.DataLoader(dataset, batch_size=2)]
    assert [(b.dtype, b.tolist()) for b in ours] == [(b.dtype, b.tolist()) for b in theirs]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_batch_of_the_first_samples_dtype_still_comes_from_the_slots(mode):
    """A batch whose samples all have the first sample's dtype is a view of the slot, as before."""
    make = lambda i: np.array([i], np.uint8) if i < 2 else np.array([300 + i], np.int64)  # noqa: E731
    with fastloop.Loader(synthetic.Samples(4, make), batch_size=2, timeout=60, **mode) as loader:
        batches = [b.copy() for b in loader]
    assert [(str(b.dtype), b.tolist()) for b in batches] == [("uint8", [[0], [1]]), ("int64", [[302], [303]])]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_with_a_pipeline_a_sample_that_does_not_cast_safely_raises_naming_sample_field_and_dtypes(mode):
    make = lambda i: (np.full((2, 2, 1), 7, np.uint8) if i < 3 else np.full((2, 2, 1), 300, np.int64), i)  # noqa: E731
    loader = fastloop.Loader(synthetic.Samples(4, make), batch_size=2, timeout=60,
                             transform=Pipeline([Cast("float32")]), **mode)
    with pytest.raises(TypeError) as caught:
        list(loader)
    loader.close()
    text = str(caught.value)
    assert "sample 3" in text and "field 0" in text and "int64" in text and "uint8" in text, text


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_with_a_pipeline_a_sample_that_casts_safely_keeps_its_values(mode):
    make = lambda i: np.full((2, 2, 1), 7, np.int16) if i == 0 else np.full((2, 2, 1), i, np.uint8)  # noqa: E731
    with fastloop.Loader(synthetic.Samples(4, make), batch_size=2, timeout=60,
                         transform=Pipeline([Cast("float32")]), **mode) as loader:
        batches = [b.copy() for b in loader]
    assert [b[:, 0, 0, 0].tolist() for b in batches] == [[7.0, 1.0], [2.0, 3.0]]
