"""Serving torch models in process: an nn.Module with declared inputs (fastloop.serve.Input)
checked at submit, run on dynamic batches of tensors under inference_mode, its tensor,
tuple and dict outputs back as NumPy per job."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fastloop.serve import FileStore, InferenceService, Input, JobFailed, MemoryStore  # noqa: E402


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


class Gated(torch.nn.Module):
    """Wraps a module: each call records the batch size and whether inference mode and
    grad were on, and the first call waits until `release` is set."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[tuple[int, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((len(x), torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        self.entered.set()
        assert self.release.wait(20), "the test never released the model"
        out = self.inner(x)
        assert not out.requires_grad
        return out


def rows(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def expected(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def test_mlp_runs_on_dynamic_batches_of_tensors_under_inference_mode():
    model = Gated(mlp()).eval()
    xs = rows(16, (16,))
    with InferenceService(model, inputs=Input(torch.float32, (16,)), num_workers=1, max_batch=16,
                          max_delay_s=0, store=MemoryStore()) as svc:
        first = svc.submit(xs[0])
        assert model.entered.wait(10)
        jobs = [first] + [svc.submit(x) for x in xs[1:]]  # queued while the first batch runs
        model.release.set()
        got = np.stack([svc.result(job, timeout=10) for job in jobs])
        assert svc.stats()["batch_sizes"] == {1: 1, 15: 1}
    np.testing.assert_allclose(got, expected(model.inner, xs), rtol=1e-5, atol=1e-6)
    assert [(n, inference, grad) for n, inference, grad in model.calls] == [(1, True, False), (15, True, False)]


def test_cnn_takes_json_style_lists_cast_to_float32_and_tensors():
    model = SmallCNN().eval()
    xs = rows(3, (3, 8, 8), seed=2)
    with InferenceService(model, inputs=Input(torch.float32, (3, 8, 8)), store=MemoryStore()) as svc:
        jobs = [svc.submit(xs[0].tolist()), svc.submit(torch.from_numpy(xs[1])), svc.submit(xs[2])]
        got = [svc.result(job, timeout=10) for job in jobs]
    assert all(y.dtype == np.float32 and y.shape == (5,) for y in got)
    np.testing.assert_allclose(np.stack(got), expected(model, xs), rtol=1e-5, atol=1e-5)


class TwoInputs(torch.nn.Module):
    """ids (variable length) and a mask in; a dict of a score per row and a pooled vector out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = torch.nn.Embedding(10, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        vectors = self.embed(ids) * mask.unsqueeze(-1)
        return {"score": (ids * mask).sum(1), "pooled": vectors.sum(1).to(torch.bfloat16)}


def test_multi_input_model_gets_named_inputs_and_returns_a_dict_per_job():
    model = TwoInputs().eval()
    inputs = {"ids": Input(torch.int64, (None,)), "mask": Input(torch.bool, (None,))}
    with InferenceService(model, inputs=inputs, store=MemoryStore()) as svc:
        a = svc.submit({"ids": [1, 2, 3], "mask": [True, False, True]})
        b = svc.submit((np.array([4, 5], np.int64), [1, 1]))  # a tuple: the declared order
        ya, yb = svc.result(a, timeout=10), svc.result(b, timeout=10)
    assert set(ya) == {"score", "pooled"}
    assert ya["score"] == 4 and ya["score"].dtype == np.int64 and yb["score"] == 9
    assert ya["pooled"].dtype == np.float32 and ya["pooled"].shape == (3,)  # bfloat16 comes back as float32
    with torch.no_grad():
        want = model.embed(torch.tensor([1, 3])).sum(0).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ya["pooled"], want)


def test_tuple_outputs_come_back_as_a_tuple_and_plain_callables_get_arrays():
    seen = []

    def model(x: np.ndarray, scale: np.ndarray):
        seen.append((type(x), x.dtype, type(scale), scale.shape))
        return x * scale[:, None], x.sum(1)

    with InferenceService(model, inputs=[Input("float32", (2,), name="x"), Input("float32", (), name="scale")],
                          store=MemoryStore()) as svc:
        y = svc.result(svc.submit({"x": [1, 2], "scale": 3}), timeout=10)
    assert isinstance(y, tuple) and len(y) == 2
    np.testing.assert_array_equal(y[0], [3, 6])
    assert y[1] == 3
    assert seen == [(np.ndarray, np.float32, np.ndarray, (1,))]


@pytest.mark.parametrize("given, error, words", [
    (np.zeros(16), TypeError, ["'input'", "float32", "float64"]),
    (np.zeros(15, np.float32), ValueError, ["'input'", "(16,)", "(15,)"]),
    (np.zeros((2, 15), np.float32), ValueError, ["(16,)", "(2, 15)", "several along a leading axis"]),
    (["a"] * 16, TypeError, ["'input'", "float32", "str"]),
    ([[1.0] * 16, [1.0]], TypeError, ["'input'"]),
    (torch.zeros(16, dtype=torch.float64), TypeError, ["float32", "float64"]),
    ({"x": 1}, TypeError, ["'input'", "dict"]),
])
def test_wrong_inputs_are_refused_at_submit_naming_the_input_and_never_reach_the_model(given, error, words):
    model = Gated(mlp()).eval()
    model.release.set()
    with InferenceService(model, inputs=Input(torch.float32, (16,)), store=MemoryStore()) as svc:
        with pytest.raises(error) as raised:
            svc.submit(given)
        assert svc.stats()["submitted"] == 0
    assert all(word in str(raised.value) for word in words), str(raised.value)
    assert model.calls == []


@pytest.mark.parametrize("given, error, words", [
    ({"ids": [1]}, ValueError, ["missing ['mask']"]),
    ({"ids": [1], "mask": [1], "extra": [0]}, ValueError, ["unknown ['extra']"]),
    (([1],), ValueError, ["takes 2 inputs", "got 1"]),
    ({"ids": [1.5], "mask": [1]}, ValueError, ["'ids'", "int64", "not integers"]),
    ({"ids": [1], "mask": [2]}, ValueError, ["'mask'", "bool"]),
    ({"ids": np.array([1], np.int32), "mask": [1]}, TypeError, ["'ids'", "int64", "int32"]),
    ({"ids": [[1]], "mask": [1]}, ValueError, ["'ids'", "(1, 1)", "the same number of rows"]),
    ({"ids": [[[1]]], "mask": [[1]]}, ValueError, ["'ids'", "(any,)", "(1, 1, 1)"]),
    ({"ids": [2 ** 70], "mask": [1]}, (TypeError, ValueError), ["'ids'"]),
    ([1, 2, 3], ValueError, ["takes 2 inputs"]),
    (5, TypeError, ["dict name -> value"]),
])
def test_wrong_multi_inputs_name_the_input(given, error, words):
    inputs = {"ids": Input("int64", (None,)), "mask": Input("bool", (None,))}
    with InferenceService(TwoInputs().eval(), inputs=inputs, store=MemoryStore()) as svc:
        with pytest.raises(error) as raised:
            svc.submit(given)
    assert all(word in str(raised.value) for word in words), str(raised.value)


def test_lists_out_of_range_are_refused_not_wrapped_or_overflowed():
    with InferenceService(lambda x: x, inputs=Input("uint8", (2,)), store=MemoryStore()) as svc:
        with pytest.raises(ValueError, match="do not fit uint8"):
            svc.submit([0, 300])
        np.testing.assert_array_equal(svc.result(svc.submit([0, 255]), timeout=10), [0, 255])
    with InferenceService(lambda x: x, inputs=Input("float16", (1,)), store=MemoryStore()) as svc:
        with pytest.raises(ValueError, match="overflow float16"):
            svc.submit([1e10])


def test_named_inputs_and_dict_results_keep_through_a_file_store(tmp_path):
    inputs = {"ids": Input(torch.int64, (None,)), "mask": Input(torch.bool, (None,))}
    with InferenceService(TwoInputs().eval(), inputs=inputs, store=FileStore(str(tmp_path / "jobs"))) as svc:
        job = svc.submit({"ids": [1, 2], "mask": [1, 1]})
        y = svc.result(job, timeout=10)
        assert svc.store.get_result(job).dtype.names == ("score", "pooled")  # one .npy, a field per key
    assert y["score"] == 3 and y["pooled"].shape == (3,)
    with InferenceService(TwoInputs().eval(), inputs=inputs, store=FileStore(str(tmp_path / "jobs"))) as svc:
        assert svc.result(job, timeout=10)["score"] == 3  # read back after a restart


def test_a_torch_model_needs_declared_inputs_and_a_training_one_warns():
    with pytest.raises(TypeError, match="needs its inputs declared"):
        InferenceService(mlp(), store=MemoryStore())
    with pytest.warns(UserWarning, match=r"training mode.*model.eval\(\)"):
        InferenceService(mlp().train(), inputs=Input(torch.float32, (16,)), store=MemoryStore()).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        InferenceService(mlp(), inputs=Input(torch.float32, (16,)), store=MemoryStore()).close()


@pytest.mark.parametrize("args, error", [
    (("str", (2,)), TypeError), ((torch.bfloat16, (2,)), TypeError), (("float32", (-1,)), ValueError),
    (("float32", (2.5,)), ValueError), (("float32", (2,), ""), TypeError),
])
def test_bad_input_declarations_are_refused(args, error):
    with pytest.raises(error):
        Input(*args)


def test_bad_spec_containers_are_refused():
    with pytest.raises(TypeError, match="Input"):
        InferenceService(mlp(), inputs=[(torch.float32, (16,))], store=MemoryStore())
    with pytest.raises(ValueError, match="names must differ"):
        InferenceService(mlp(), inputs=[Input("float32", (1,), name="a"), Input("float32", (1,), name="a")],
                         store=MemoryStore())


def test_an_output_with_the_wrong_number_of_rows_fails_the_job_naming_it():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return {"ok": x, "short": x[:1].repeat(1, 1)[:0]}

    with InferenceService(Bad().eval(), inputs=Input(torch.float32, (2,)), store=MemoryStore()) as svc:
        job = svc.submit([1.0, 2.0])
        with pytest.raises(JobFailed, match=r"output 'short' has shape \(0, 2\) for a batch of 1"):
            svc.result(job, timeout=10)


def test_plain_callables_without_declared_inputs_keep_returning_arrays():
    with InferenceService(lambda batch: batch * 2, store=MemoryStore()) as svc:
        y = svc.result(svc.submit(np.arange(3.0)), timeout=10)
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, [0, 2, 4])


def _openmp_threads_of_this_thread():
    """OpenMP's thread count for the calling thread (its own setting: OpenMP keeps one per
    thread), read from the libgomp torch loaded; None where torch uses another runtime."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:  # Linux: the libraries this process has loaded
            for line in maps:
                if "libgomp" in line:
                    return ctypes.CDLL(line.split()[-1]).omp_get_max_threads()
    except OSError:
        pass
    return None


class ThreadCounting(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.seen = mlp(), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(_openmp_threads_of_this_thread())
        return self.inner(x)


def test_the_workers_run_the_model_with_torchs_thread_count():
    """torch.set_num_threads(n) before serving holds in the worker threads too: without it a
    worker's BLAS calls use OpenMP's default (every core), whatever torch was told."""
    if _openmp_threads_of_this_thread() is None:
        pytest.skip("no libgomp loaded by torch to ask (another OpenMP runtime, or not Linux)")
    before = torch.get_num_threads()
    wanted = before + 1  # differs from OpenMP's default for a new thread (the core count, or OMP_NUM_THREADS)
    torch.set_num_threads(wanted)
    try:
        model = ThreadCounting().eval()
        with InferenceService(model, inputs=Input(torch.float32, (16,)), store=MemoryStore(), num_workers=2) as svc:
            for x in rows(6, (16,)):
                svc.result(svc.submit(x), timeout=10)
        assert model.seen and set(model.seen) == {wanted}
    finally:
        torch.set_num_threads(before)
