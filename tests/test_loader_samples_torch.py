"""fastloop.Loader against torch's DataLoader on the samples DataLoader takes: the same batches
(tensors, numbers, strings, nested containers, namedtuples), the same errors for what
default_collate refuses, variable-shape detection samples through a collate_fn, batch_size=None
and uneven batch_sampler batches, at num_workers=0 and in worker processes. The one difference
fastloop keeps: a tuple stays a tuple where default_collate makes it a list."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import fastloop
import synthetic

torch = pytest.importorskip("torch")
DataLoader = torch.utils.data.DataLoader

MODES = [dict(num_workers=0), dict(num_workers=2, mode="processes"), dict(num_workers=2, mode="threads")]
IDS = ["workers0", "processes", "threads"]


class Samples(synthetic.Samples, torch.utils.data.Dataset):
    """synthetic.Samples as a torch Dataset, the type DataLoader documents."""


def canonical(value):
    """A batch in a form both loaders' outputs compare in: tensors as (dtype, shape, values),
    tuples as lists (DataLoader's default_collate turns tuples into lists; fastloop keeps them)."""
    if torch.is_tensor(value):
        return ("tensor", str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, [canonical(v) for v in value])
    if isinstance(value, (tuple, list)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return (type(value).__name__, value)


def both(dataset, mode, **kwargs) -> tuple[list, list]:
    """(fastloop's batches, DataLoader's) of the same dataset and arguments."""
    loader = fastloop.Loader(dataset, output="torch", timeout=60, **mode, **kwargs)
    ours = [canonical(b) for b in loader]
    loader.close()
    theirs = [canonical(b) for b in DataLoader(dataset, **kwargs)]
    return ours, theirs


Box = collections.namedtuple("Box", ["corners", "label"])

DATASETS = {
    "tensor_int_str": lambda i: (torch.full((2,), float(i)), i, f"s{i}"),
    "nested": lambda i: {"image": torch.full((2, 2), i, dtype=torch.uint8),
                         "meta": {"id": i, "name": f"n{i}", "tags": ["a", f"t{i}"], "score": i / 3, "ok": i % 2 == 0},
                         "pair": (np.float32(i), [i, np.arange(2) + i])},
    "numbers": lambda i: (np.float64(i), np.int32(i), i * 0.5, True, b"x" * i),
    "namedtuple": lambda i: Box(torch.arange(4) * i, f"box{i}"),
    "strings": lambda i: f"only {i}",
    "ints_then_floats": lambda i: (i if i < 4 else i + 0.5, torch.tensor(i) if i < 5 else torch.tensor(i + 0.25)),
}


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("name", list(DATASETS))
def test_batches_equal_dataloaders(name, mode):
    ours, theirs = both(Samples(7, DATASETS[name]), mode, batch_size=3)
    assert ours == theirs


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("name", ["tensor_int_str", "nested", "namedtuple"])
def test_batch_size_none_gives_dataloaders_samples(name, mode):
    ours, theirs = both(Samples(4, DATASETS[name]), mode, batch_size=None)
    assert ours == theirs


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_uneven_batch_sampler_batches_equal_dataloaders(mode):
    sampler = [[5, 1], [0], [2, 3, 4, 6]]
    ours, theirs = both(Samples(7, DATASETS["nested"]), mode, batch_sampler=sampler)
    assert ours == theirs and len(ours) == 3


def detection_sample(i: int):
    """A detection dataset's sample: an image of its own size and a varying number of boxes."""
    g = torch.Generator().manual_seed(i)
    h, w, n = 8 + i % 3, 6 + i % 4, i % 3
    return torch.rand(3, h, w, generator=g), {"boxes": torch.rand(n, 4, generator=g), "labels": torch.arange(n),
                                              "image_id": i}


def detection_collate(batch):
    return tuple(zip(*batch))


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_variable_shape_detection_samples_through_a_collate_fn_equal_dataloaders(mode):
    ours, theirs = both(Samples(9, detection_sample), mode, batch_size=4, collate_fn=detection_collate)
    assert ours == theirs and len(ours) == 3


def errors(dataset, mode, **kwargs) -> tuple[BaseException, BaseException]:
    """What iterating each loader over `dataset` raises."""
    caught = []
    for make in (lambda: fastloop.Loader(dataset, output="torch", timeout=60, **mode, **kwargs),
                 lambda: DataLoader(dataset, **kwargs)):
        with pytest.raises(Exception) as info:
            list(make())
        caught.append(info.value)
    return caught[0], caught[1]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("make", [
    lambda i: (torch.zeros(1 + i % 2), i),                    # varying shapes: torch.stack's RuntimeError
    lambda i: (torch.zeros(2), None),                         # None: default_collate's TypeError
    lambda i: {"words": ["a"] * (1 + i % 2)},                  # lists of different lengths
    lambda i: (np.array(["a", "b"]), i),                       # an array of strings
    lambda i: (torch.zeros(2), 2**70),                         # an int beyond 64 bits
], ids=["shapes", "none", "lengths", "str_array", "big_int"])
def test_what_default_collate_refuses_raises_the_same_error_naming_field_and_sample(make, mode):
    ours, theirs = errors(Samples(4, make), mode, batch_size=2)
    assert type(ours) is type(theirs)
    assert str(ours).startswith(str(theirs).rstrip("."))  # torch's words first, then the field and sample
    assert "sample" in str(ours)[len(str(theirs)):]


# ---- random sample structures, compared with DataLoader ----

def as_compared(value):
    """canonical() of what a collate_fn got: NumPy arrays and scalars as the tensors
    fastloop's output='torch' hands out for them."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        return canonical(torch.as_tensor(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, [as_compared(v) for v in value])
    if isinstance(value, (tuple, list)):
        return [as_compared(v) for v in value]
    if isinstance(value, dict):
        return {k: as_compared(v) for k, v in value.items()}
    return canonical(value)


def random_value(rng: np.random.Generator, depth: int, varying: bool):
    """A function i -> a value of one random structure: nested tuples, lists, dicts and
    namedtuples of arrays (of varying shape when `varying`), numbers, strings and bytes."""
    kind = int(rng.integers(0, 9 if depth < 3 else 6))
    if kind == 0:
        dtype = rng.choice(["float32", "int64", "uint8", "bool", "float64"])
        shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 3))))
        grow = varying and rng.random() < 0.5
        return lambda i: (np.arange(int(np.prod(shape)) * (1 + i % 2 if grow else 1)) + i).astype(dtype).reshape(
            (-1,) + shape[1:] if shape else ())
    if kind == 1:
        return lambda i: i * 3
    if kind == 2:
        return lambda i: i / 4
    if kind == 3:
        return lambda i: "s" * (i % 5)
    if kind == 4:
        return lambda i: bytes([i % 256]) * 3
    if kind == 5:
        return lambda i: np.float32(i) / 2
    parts = [random_value(rng, depth + 1, varying) for _ in range(int(rng.integers(1, 4)))]
    if kind == 6:
        return lambda i: tuple(p(i) for p in parts)
    if kind == 7:
        return lambda i: [p(i) for p in parts]
    return lambda i: {f"k{n}": p(i) for n, p in enumerate(parts)}


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("seed", range(8))
def test_random_structures_equal_dataloaders(seed, mode):
    rng = np.random.default_rng(seed)
    make = random_value(rng, 0, varying=False)
    ours, theirs = both(Samples(7, make), mode, batch_size=3)
    assert ours == theirs
    varying = Samples(7, random_value(rng, 0, varying=True))
    loader = fastloop.Loader(varying, batch_size=3, output="torch", collate_fn=list, timeout=60, **mode)
    ours = [as_compared(b) for b in loader]
    loader.close()
    assert ours == [as_compared(b) for b in DataLoader(varying, batch_size=3, collate_fn=list)]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_tensor_numpy_cannot_view_is_refused_naming_its_field_and_sample(mode):
    first = Samples(4, lambda i: {"a": (torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))})
    with pytest.raises(TypeError, match=r"sample field 'a'\[1\] is a torch.bfloat16 tensor.*\.float\(\)"):
        fastloop.Loader(first, batch_size=2, **mode)
    later = Samples(4, lambda i: {"a": (torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16 if i == 3 else None))})
    with pytest.raises(TypeError, match=r"sample 3.*sample field 'a'\[1\] is a torch.bfloat16 tensor"):
        list(fastloop.Loader(later, batch_size=2, timeout=60, **mode))


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_samples_with_fewer_fields_than_the_first_are_collated_whole(mode):
    data = Samples(4, lambda i: (torch.zeros(2), i) if i != 3 else (torch.zeros(2),))
    ours, theirs = errors(data, mode, batch_size=2)
    assert type(ours) is type(theirs) is RuntimeError and "sample 3" in str(ours)
    ours, theirs = both(data, mode, batch_size=2, collate_fn=lambda s: [len(x) for x in s])
    assert ours == theirs == [[("int", 2), ("int", 2)], [("int", 2), ("int", 1)]]
