"""DataLoader's keywords on fastloop.Loader: generator, multiprocessing_context,
pin_memory_device and in_order taken with torch's meaning or refused saying what to use, and
the argument checks DataLoader makes (batch_sampler with batch_size, a negative timeout,
worker options with no workers), each a ValueError naming the argument."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import fastloop
import synthetic

X = np.arange(10, dtype=np.float32)


@pytest.mark.parametrize("kwargs, named", [
    (dict(batch_sampler=[[0, 1], [2]], batch_size=4), "batch_size=4"),
    (dict(batch_sampler=[[0, 1], [2]], batch_size=None), "batch_size=None"),
    (dict(batch_sampler=[[0, 1], [2]], drop_last=True), "drop_last=True"),
    (dict(timeout=-1), "'timeout'"),
    (dict(prefetch_factor=2), "'prefetch_factor'"),
    (dict(persistent_workers=True), "'persistent_workers'"),
    (dict(multiprocessing_context="spawn"), "multiprocessing_context='spawn'"),
    (dict(multiprocessing_context=multiprocessing.get_context("forkserver")), "'forkserver'"),
    (dict(pin_memory_device="xpu"), "pin_memory_device='xpu'"),
])
def test_what_dataloader_refuses_raises_a_value_error_naming_the_argument(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        fastloop.Loader(synthetic.Samples(4, lambda i: np.float32(i)), **kwargs)


@pytest.mark.parametrize("kwargs", [dict(generator=5), dict(in_order=1), dict(pin_memory_device=0),
                                    dict(persistent_workers="yes", num_workers=1), dict(timeout="1")])
def test_a_keyword_of_the_wrong_type_raises_a_type_error_naming_it(kwargs):
    with pytest.raises(TypeError, match=f"'{next(iter(kwargs))}'"):
        fastloop.Loader(X, **kwargs)


def test_the_keywords_torch_code_passes_are_taken():
    loader = fastloop.Loader(X, batch_size=5, timeout=0, in_order=False, pin_memory_device="cuda:0",
                             multiprocessing_context=multiprocessing.get_context("fork"), num_workers=1,
                             prefetch_factor=2, persistent_workers=False)
    assert [b.tolist() for b in loader] == [X[:5].tolist(), X[5:].tolist()]
    assert loader.timeout is None and not loader.persistent_workers
    assert fastloop.Loader(X, multiprocessing_context="fork", in_order=True).in_order


def test_persistent_workers_defaults_to_keeping_workers_only_when_there_are_some():
    assert not fastloop.Loader(X).persistent_workers
    assert fastloop.Loader(X, num_workers=1).persistent_workers


def test_a_batch_sampler_with_dataloaders_default_batch_size_is_taken():
    loader = fastloop.Loader(X, batch_size=1, batch_sampler=[[0, 1, 2], [9]])
    assert [b.tolist() for b in loader] == [[0.0, 1.0, 2.0], [9.0]]


def test_a_generator_seeds_the_shuffle_as_one_draw_from_it():
    torch = pytest.importorskip("torch")

    def order(generator):
        return [b.tolist() for b in fastloop.Loader(X, batch_size=4, shuffle=True, generator=generator)]

    first = order(torch.Generator().manual_seed(3))
    assert first == order(torch.Generator().manual_seed(3))
    assert first != order(torch.Generator().manual_seed(4))
    assert sorted(v for b in first for v in b) == X.tolist()
    generator = torch.Generator().manual_seed(3)
    drawn = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3)).item())
    assert fastloop.Loader(X, shuffle=True, generator=generator).seed == drawn
    with pytest.raises(ValueError, match="'seed' or 'generator'"):
        fastloop.Loader(X, seed=1, generator=torch.Generator())


def test_every_dataloader_keyword_is_a_loader_keyword_and_in_docs_torch_table():
    import inspect
    from pathlib import Path

    torch = pytest.importorskip("torch")
    theirs = [p for p in inspect.signature(torch.utils.data.DataLoader.__init__).parameters if p not in ("self",
                                                                                                         "dataset")]
    ours = inspect.signature(fastloop.Loader.__init__).parameters
    assert [p for p in theirs if p not in ours] == []
    text = (Path(__file__).parent.parent / "docs" / "torch.md").read_text()
    section = text[text.index("## DataLoader → Loader"):text.index("### Workers and torch")]
    table = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ")]
    assert [p for p in theirs if not any(f"`{p}" in cell for cell in table)] == []
