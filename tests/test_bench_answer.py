"""The bench report's answer section and side-by-side table, from given rows (no timing)."""

from __future__ import annotations

from fastloop.bench import answer
from fastloop.bench.loader import Row as LoaderRow
from fastloop.bench.model import Row as ModelRow
from fastloop.bench.preprocess import Row as PreprocessRow
from fastloop.bench.targets import Result


def loader_row(loader, dataset, workers, rate):
    return LoaderRow(dataset, loader, workers, rate, 0.01, 400.0, 30.0)


RESULTS = [Result("Monitor.scalar: median cost per call", 150.0, "ns", "<= 1000", True),
           Result("SummaryWriter.add_scalar / Monitor.scalar", 500.0, "x", ">= 20", True),
           Result("Checkpointer.save stall / memcpy of the state", 1.1, "x", "<= 1.5", True),
           Result("inline np.savez / Checkpointer.save stall", 10.0, "x", "(reference)", None),
           Result("2 threads vs 1: pure Python loop", 0.98, "x", "(reference)", None)]
LOADER = [loader_row("fastloop threads", "arrays + C ops", 2, 150_000), loader_row("fastloop processes", "arrays + C ops", 2, 80_000),
          loader_row("torch DataLoader", "arrays + C ops", 0, 16_000), loader_row("Python threads", "Python transform", 2, 9_000),
          loader_row("fastloop processes", "Python transform", 2, 27_000)]
MODEL = [ModelRow("fastloop.nn SGD", 7.0, 7.1, 36_000, 0.6, 0.25), ModelRow("torch SGD", 8.5, 8.6, 30_000, 0.9, 0.1)]


def preprocess_row(way, workers, speedup):
    return PreprocessRow("normalize", "large: 32 images", way, workers, 0.01, speedup, 1.0, 10.0)


def test_answer_names_threads_and_processes_with_their_numbers():
    rows = [preprocess_row("threads + fastloop", 2, 25.0), preprocess_row("processes + numpy", 2, 0.33)]
    text = "\n".join(answer.answer(RESULTS, LOADER, MODEL, rows))
    assert "**Use threads**" in text and "**Use processes**" in text and text.index("threads**") < text.index("processes**")
    assert "threads + fastloop 25.0x serial NumPy vs processes + NumPy 0.33x" in text
    assert "fastloop threads 150,000 samples/s vs the same pipeline in processes 80,000/s" in text
    assert "torch's DataLoader at best 16,000/s (0 workers)" in text
    assert "fastloop processes 27,000 samples/s (2 workers) vs Python threads 9,000/s (2 workers): 3.0x" in text
    assert "keeps 60% of its idle rate" in text and "2 threads run it 0.98x" in text
    table = answer.side_by_side(RESULTS, LOADER, MODEL, rows)
    assert ["log a scalar", "150 (C writer thread)", "-", "75,000 SummaryWriter", "ns a call"] in table
    assert ["checkpoint stall", "1.10 (C writer thread)", "-", "11.0 inline np.savez", "x a memcpy"] in table


def test_missing_suites_leave_their_sentences_out():
    text = "\n".join(answer.answer([], [], [], []))
    assert "Use threads" not in text and "Use processes" not in text
    assert text.startswith("## The answer for this machine")
