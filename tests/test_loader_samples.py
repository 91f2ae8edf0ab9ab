"""fastloop.Loader takes the samples torch's DataLoader takes, with NumPy output and no torch:
strings, bytes, None, numbers, nested dicts / lists / tuples / namedtuples and arrays of varying
shape, from worker processes (serialized into the slot, or after it when they do not fit) or at
num_workers=0, collated as default_collate does; batch_size=None; uneven batch_sampler batches; and
the errors for what cannot be batched, naming the sample index and the field."""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest

import fastloop
from fastloop import _core
from synthetic import Samples

# in this process; forked worker processes; worker threads
MODES = [dict(num_workers=0), dict(num_workers=2, mode="processes"), dict(num_workers=2, mode="threads")]
IDS = ["workers0", "processes", "threads"]


def batches(dataset, **kwargs) -> list:
    loader = fastloop.Loader(dataset, timeout=60, **kwargs)
    try:
        return list(loader)
    finally:
        loader.close()


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_an_array_an_int_and_a_str_batch_as_default_collate_does(mode):
    data = Samples(10, lambda i: (np.full(2, i, np.float32), i, f"s{i}"))
    out = batches(data, batch_size=4, **mode)
    assert [len(b) for b in out] == [3, 3, 3] and all(type(b) is tuple for b in out)
    x, y, names = out[2]
    np.testing.assert_array_equal(x, [[8, 8], [9, 9]])
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.tolist() == [8, 9]
    assert names == ("s8", "s9")  # a tuple inside a tuple sample, as default_collate gives it
    assert [n for b in out for n in b[2]] == [f"s{i}" for i in range(10)]


def test_array_fields_stay_zero_copy_views_of_the_slot_beside_strings():
    data = Samples(12, lambda i: (np.full(3, i, np.float32), f"name-{i}"))
    loader = fastloop.Loader(data, batch_size=4, timeout=60, num_workers=2)
    x, names = next(iter(loader))
    assert isinstance(x.base, _core._SlotLease) and names == ("name-0", "name-1", "name-2", "name-3")
    loader.close()


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_nested_dicts_lists_and_tuples_are_collated_per_key_and_position(mode):
    def make(i):
        return {"image": np.full((2, 2), i, np.uint8),
                "meta": {"id": i, "name": f"n{i}", "tags": ["a", "b"], "raw": bytes([i]), "score": i / 4},
                "pair": (np.float32(i), [i, i + 1])}

    out = batches(Samples(6, make), batch_size=3, **mode)
    assert len(out) == 2
    b = out[1]
    assert list(b) == ["image", "meta", "pair"] and b["image"].shape == (3, 2, 2)
    assert b["meta"]["id"].tolist() == [3, 4, 5] and b["meta"]["id"].dtype == np.int64
    assert b["meta"]["name"] == ["n3", "n4", "n5"]  # a list inside a dict, as default_collate gives it
    assert b["meta"]["tags"] == [("a", "a", "a"), ("b", "b", "b")]
    assert b["meta"]["raw"] == [b"\x03", b"\x04", b"\x05"]
    assert b["meta"]["score"].dtype == np.float64 and b["meta"]["score"].tolist() == [0.75, 1.0, 1.25]
    first, second = b["pair"]
    assert type(b["pair"]) is tuple and first.dtype == np.float32 and first.tolist() == [3, 4, 5]
    assert type(second) is list and [s.tolist() for s in second] == [[3, 4, 5], [4, 5, 6]]


Point = collections.namedtuple("Point", ["xy", "label"])


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_namedtuples_keep_their_type(mode):
    out = batches(Samples(4, lambda i: Point(np.array([i, -i]), f"p{i}")), batch_size=2, **mode)
    assert all(type(b) is Point for b in out)
    assert out[1].xy.tolist() == [[2, -2], [3, -3]] and out[1].label == ("p2", "p3")


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_dataset_of_strings_gives_lists_of_strings(mode):
    assert batches(Samples(5, lambda i: "x" * i), batch_size=2, **mode) == [["", "x"], ["xx", "xxx"], ["xxxx"]]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_none_raises_default_collates_error_naming_the_field_and_sample(mode):
    data = Samples(8, lambda i: (np.zeros(2), {"mask": None}))
    with pytest.raises(TypeError, match=r"default_collate: batch must contain tensors, numpy arrays, numbers, "
                                        r"dicts or lists; found <class 'NoneType'> \(field 1\['mask'\] of sample 0\)"):
        batches(data, batch_size=4, **mode)
    out = batches(data, batch_size=4, collate_fn=lambda samples: [s[1]["mask"] for s in samples], **mode)
    assert out == [[None] * 4] * 2


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_arrays_of_varying_shape_raise_default_collates_error_unless_a_collate_fn_takes_them(mode):
    data = Samples(6, lambda i: (np.arange(i + 1, dtype=np.float32), i))
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size, but got \[1\] at entry 0 "
                                           r"and \[2\] at entry 1 \(field 0 of samples 0 and 1"):
        batches(data, batch_size=3, **mode)

    def pad(samples):
        width = max(len(x) for x, _ in samples)
        return np.stack([np.pad(x, (0, width - len(x))) for x, _ in samples]), [y for _, y in samples]

    out = batches(data, batch_size=3, collate_fn=pad, **mode)
    np.testing.assert_array_equal(out[1][0], [[0, 1, 2, 3, 0, 0], [0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 4, 5]])
    assert [y for _, ys in out for y in ys] == list(range(6))  # Python ints, as the dataset gave them


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_batches_whose_shapes_agree_among_themselves_are_stacked_as_default_collate_does(mode):
    # bucketed by length: every batch has one shape, not the first sample's
    data = Samples(8, lambda i: np.full(1 + i // 4, i, np.int16))
    out = batches(data, batch_size=4, **mode)
    assert [b.shape for b in out] == [(4, 1), (4, 2)] and out[1].dtype == np.int16
    assert out[1][:, 0].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_sample_laid_out_differently_is_collated_whole(mode):
    def make(i):  # sample 5 lacks a key, sample 6 has a list of another length
        sample = {"x": np.full(2, i), "words": ["a", "b"], "extra": i}
        if i == 5:
            del sample["extra"]
        if i == 6:
            sample["words"] = ["a"]
        return sample

    data = Samples(8, make)
    with pytest.raises(KeyError, match=r"field 'extra' is missing from sample 5"):
        batches(data, batch_size=2, **mode)
    out = batches(data, batch_size=2, collate_fn=lambda s: [len(x["words"]) for x in s], **mode)
    assert out == [[2, 2], [2, 2], [2, 2], [1, 2]]
    with pytest.raises(RuntimeError, match=r"each element in list of batch should be of equal size \(field "
                                           r"'words' has 2 elements in sample 7, 1 in sample 6"):
        batches(Samples(8, make), batch_size=2, sampler=[0, 1, 6, 7], **mode)


class Opaque:
    def __init__(self, value) -> None:
        self.value = value

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and other.value == self.value


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_any_picklable_object_reaches_the_collate_fn_and_default_collate_names_its_type(mode):
    data = Samples(4, lambda i: (i, Opaque(i)))
    out = batches(data, batch_size=2, collate_fn=lambda s: s, **mode)
    assert out == [[(0, Opaque(0)), (1, Opaque(1))], [(2, Opaque(2)), (3, Opaque(3))]]
    assert all(type(s[0]) is int for b in out for s in b)
    with pytest.raises(TypeError, match=r"found <class '.*Opaque'> \(field 1 of sample 0\)"):
        batches(data, batch_size=2, **mode)


def test_an_object_a_worker_cannot_pickle_names_the_sample_and_field():
    data = Samples(6, lambda i: (i, {"fn": (lambda: i) if i == 3 else "ok"}))
    with pytest.raises(TypeError, match=r"sample 3: sample field 1\['fn'\] is a function, which cannot be sent from "
                                        r"a worker process"):
        batches(data, batch_size=2, num_workers=1, mode="processes", collate_fn=lambda s: s)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_object_values_larger_than_the_slots_room_travel_after_the_batch(mode):
    # the first sample's string sizes the slot's room for them: sample 9's is 4 MB
    data = Samples(16, lambda i: (i, "y" * (4 << 20 if i == 9 else i)))
    out = batches(data, batch_size=4, **mode)
    names = [n for _, ns in out for n in ns]
    assert [len(n) for n in names] == [i if i != 9 else 4 << 20 for i in range(16)]
    whole = batches(Samples(16, lambda i: np.zeros(300_000 if i == 9 else 1, np.uint8)), batch_size=4, **mode,
                    collate_fn=lambda s: [len(x) for x in s])
    assert whole[2] == [1, 300_000, 1, 1]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_more_than_64_arrays_in_a_sample_travel_beyond_the_slot_fields(mode):
    data = Samples(4, lambda i: {f"k{j}": np.full(2, i * 100 + j) for j in range(70)})
    out = batches(data, batch_size=2, **mode)
    assert len(out[1]) == 70 and out[1]["k69"].tolist() == [[269, 269], [369, 369]]


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_batch_size_none_hands_out_samples_one_by_one(mode):
    x, y = np.arange(12).reshape(6, 2), np.arange(6) * 10
    out = batches((x, y), batch_size=None, **mode)
    assert len(out) == 6 and all(type(s) is tuple for s in out)
    assert [s[0].tolist() for s in out] == x.tolist() and [int(s[1]) for s in out] == y.tolist()
    data = Samples(5, lambda i: {"id": i, "name": f"s{i}", "v": np.full(3, i, np.float32), "n": None})
    out = batches(data, batch_size=None, shuffle=True, seed=3, **mode)
    assert sorted(s["id"] for s in out) == list(range(5)) and all(type(s["id"]) is int for s in out)
    assert all(s["name"] == f"s{s['id']}" and s["n"] is None and s["v"].shape == (3,) for s in out)
    seen = batches(data, batch_size=None, collate_fn=lambda s: s["name"], **mode)
    assert seen == [f"s{i}" for i in range(5)]
    assert len(fastloop.Loader(data, batch_size=None, **mode)) == 5


def test_batch_size_none_refuses_drop_last_and_other_types_are_refused_by_name():
    with pytest.raises(ValueError, match="batch_size=None.*drop_last"):
        fastloop.Loader(np.zeros(4), batch_size=None, drop_last=True)
    with pytest.raises(TypeError, match="'batch_size' must be an int >= 1 or None, not str"):
        fastloop.Loader(np.zeros(4), batch_size="4")
    with pytest.raises(TypeError, match="'batch_size' must be an int >= 1 or None, not float"):
        fastloop.Loader(np.zeros(4), batch_size=2.0)
    assert len(fastloop.Loader(np.zeros(4), batch_size=np.int64(2))) == 2


class Bucketed:
    """A batch sampler of uneven batches that change from epoch to epoch (set_epoch)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        splits = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9]] if self.epoch % 2 == 0 else [[9, 8], [7, 6, 5, 4], [3, 2, 1, 0]]
        return iter(splits)

    def __len__(self) -> int:
        return 4 if self.epoch % 2 == 0 else 3


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_uneven_batch_sampler_batches_come_as_drawn_every_epoch(mode):
    data = Samples(10, lambda i: (np.full(2, i), f"s{i}"))
    loader = fastloop.Loader(data, batch_sampler=Bucketed(), timeout=60, **mode)
    assert len(loader) == 4
    first = [(x[:, 0].tolist(), list(n)) for x, n in loader]
    assert first == [([0, 1, 2], ["s0", "s1", "s2"]), ([3], ["s3"]), ([4, 5], ["s4", "s5"]),
                     ([6, 7, 8, 9], ["s6", "s7", "s8", "s9"])]
    second = [x[:, 0].tolist() for x, _ in loader]
    assert second == [[9, 8], [7, 6, 5, 4], [3, 2, 1, 0]] and len(loader) == 3
    loader.load_state_dict({"epoch": 0, "position": 2, "seed": 0})
    assert [x[:, 0].tolist() for x, _ in loader] == [[4, 5], [6, 7, 8, 9]]
    loader.close()


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_batch_sampler_batch_larger_than_the_first_epochs_largest_is_refused_by_epoch_and_batch(mode):
    class Growing(Bucketed):
        def __iter__(self):
            return iter([[0, 1], [2, 3]] if self.epoch == 0 else [[0], [1, 2, 3]])

    loader = fastloop.Loader(Samples(4, lambda i: i), batch_sampler=Growing(), timeout=60, **mode)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match=r"batch of 3 indices \(batch 1 of epoch 1\): the batch slots hold 2"):
        list(loader)
    loader.close()


def test_numpy_output_never_imports_torch(tmp_path):
    import subprocess

    code = ("import sys, numpy as np, fastloop\n"
            "data = [(np.zeros(2), 'a', {'k': [1, None]})] * 6\n"
            "out = list(fastloop.Loader(data, batch_size=None, num_workers=2))\n"
            "out += list(fastloop.Loader(data, batch_size=3, num_workers=2, collate_fn=lambda s: s))\n"
            "assert len(out) == 8 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
