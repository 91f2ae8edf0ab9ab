"""fastloop.cuda answers whether CUDA was built and works here, and why not; argument
checks and the DLPack/CAI export plumbing run everywhere the extension is built; the GPU
tests (nn backend ops against NumPy, device arrays, torch interop, preprocess against the
CPU ops) run where a GPU exists and are skipped with the reason elsewhere. The extension
declares Py_MOD_GIL_NOT_USED: the free-threading tests share one object among many threads."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import fastloop
from fastloop import cuda
from hooks import WHY_ABSENT
from test_free_threading import THREADS, run_at_once


def test_is_built_answers_with_a_reason():
    answer = cuda.is_built()
    assert isinstance(answer, cuda.Answer) and answer.reason
    if shutil.which("nvcc"):  # the build found nvcc too, so it must have built the extension
        assert answer, answer.reason
        assert "nvcc" in answer.reason


def test_is_available_answers_with_a_reason_and_require_raises_it():
    answer = cuda.is_available()
    assert answer.reason
    if answer:
        assert cuda.require() is not None
    else:
        with pytest.raises(fastloop.CudaUnavailable, match="CUDA is not available: .+"):
            cuda.require()
        with pytest.raises(fastloop.CudaUnavailable):
            cuda.selftest()


def test_the_cuda_runtime_links_and_reports_its_version():
    if not cuda.is_built():
        pytest.skip(cuda.is_built().reason)
    from fastloop import _cuda

    assert _cuda.runtime_version() >= 11000
    assert _cuda.driver_version() >= 0
    with pytest.raises(ValueError):
        _cuda.device_info(-1)


@pytest.mark.skipif(not cuda.is_available(), reason=f"no usable GPU: {cuda.is_available().reason}")
def test_selftest_kernel_computes_every_value_on_each_device():
    for device in cuda.devices():
        assert device.total_memory > 0 and device.compute_capability >= (7, 5)
        result = cuda.selftest(device.index)
        assert result["errors"] == 0 and result["kernel_ms"] > 0
    with pytest.raises(fastloop.CudaError) as raised:
        fastloop.cuda.require().device_info(len(cuda.devices()) + 7)
    assert raised.value.code != 0


# ---------------------------------------------------------------- without a GPU too

built = pytest.mark.skipif(not cuda.is_built(), reason=f"CUDA extension not built: {cuda.is_built().reason}")
gpu = pytest.mark.skipif(not cuda.is_available(), reason=f"no usable GPU: {cuda.is_available().reason}")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def test_nn_backend_raises_cuda_unavailable_with_the_reason_where_cuda_cannot_run():
    if cuda.is_available():
        pytest.skip("CUDA works here")
    with pytest.raises(fastloop.CudaUnavailable, match="CUDA is not available: .+"):
        cuda.nn_backend()


@built
def test_gpu_entry_points_raise_cuda_unavailable_where_cuda_cannot_run():
    if cuda.is_available():
        pytest.skip("CUDA works here")
    batch = np.zeros((2, 8, 8, 3), np.uint8)
    for call in (lambda: cuda.empty((2, 3), np.float32), lambda: cuda.to_device(np.zeros(3)),
                 lambda: cuda.Stream(), lambda: cuda.pin(batch), lambda: cuda.memcpy_benchmark(1 << 20),
                 lambda: cuda.preprocess(batch, mean=MEAN, std=STD)):
        with pytest.raises(fastloop.CudaUnavailable, match="CUDA is not available: .+"):
            call()


@built
def test_cublas_load_names_every_candidate_it_tried(monkeypatch):
    from fastloop import _cuda

    if cuda.is_available():
        pytest.skip("cuBLAS may already be loaded where CUDA works")
    monkeypatch.setenv("FASTLOOP_CUBLAS", "/nonexistent/env/libcublas.so.99")
    with pytest.raises(fastloop.CudaUnavailable) as raised:
        _cuda.cublas_load("/nonexistent/arg/libcublas.so.13")
    message = str(raised.value)
    assert "cuBLAS could not be loaded" in message
    assert "/nonexistent/arg/libcublas.so.13" in message and "/nonexistent/env/libcublas.so.99" in message


BAD_PREPROCESS = [
    (dict(batch=np.zeros((2, 8, 8, 3), np.float32)), TypeError, "'batch'"),
    (dict(batch=[[1, 2]]), TypeError, "'batch'"),
    (dict(batch=np.zeros((8, 8, 3), np.uint8)), ValueError, "'batch'"),
    (dict(batch=np.zeros((2, 8, 16, 3), np.uint8)[:, :, ::2]), ValueError, "'batch'"),
    (dict(layout="NHWC"), ValueError, "'layout'"),
    (dict(mean=[0.1, 0.2]), ValueError, "'mean'"),
    (dict(std=[0.2, 0.0, 0.2]), ValueError, r"'std\[1\]' is 0"),
    (dict(crop=(9, 4)), ValueError, "'crop'"),
    (dict(crop="big"), TypeError, "'crop'"),
    (dict(crop=4, offsets=np.array([[0, 0], [5, 0]])), ValueError, "'offsets' row 1"),
    (dict(crop=4, offsets=np.zeros((3, 2), np.int64)), ValueError, "'offsets'"),
    (dict(crop=4, offsets=np.zeros((2, 2), np.float32)), TypeError, "'offsets'"),
    (dict(flips=np.zeros(2, np.int64)), TypeError, "'flips'"),
    (dict(flips=np.zeros(3, bool)), ValueError, "'flips'"),
    (dict(out=np.zeros((2, 3, 8, 8), np.float32)), TypeError, "'out'"),
    (dict(stream="default"), TypeError, "'stream'"),
    (dict(stream=-5), ValueError, "'stream'"),
    (dict(device=-1), ValueError, "'device'"),
]


@built
@pytest.mark.parametrize("change, error, match", BAD_PREPROCESS)
def test_preprocess_checks_each_argument_before_touching_the_gpu(change, error, match):
    kwargs = dict(batch=np.zeros((2, 8, 8, 3), np.uint8), mean=MEAN, std=STD) | change
    with pytest.raises(error, match=match):
        cuda.preprocess(kwargs.pop("batch"), **kwargs)


@built
@pytest.mark.parametrize("change, message", [
    (dict(crop=4, offsets=[[0, 0], [0, 0]]), "'offsets' must be an integer NumPy array (N, 2), not list"),
    (dict(flips=[True, False]), "'flips' must be a bool or uint8 NumPy array (N,), not list"),
    (dict(out=np.zeros((2, 3, 8, 8), np.float32)), "'out' must be a fastloop.cuda.DeviceArray, not numpy.ndarray"),
    (dict(stream=object()), "with an int 'cuda_stream', not object"),
])
def test_type_errors_name_the_type_given_on_every_python(change, message):
    """The messages once used %T, which only Python 3.13 formats (3.12 raised SystemError)."""
    kwargs = dict(mean=MEAN, std=STD) | change
    with pytest.raises(TypeError) as raised:
        cuda.preprocess(np.zeros((2, 8, 8, 3), np.uint8), **kwargs)
    assert message in str(raised.value)
    with pytest.raises(TypeError, match="'array' must be a C-contiguous NumPy array, not list"):
        cuda.pin([1, 2])


@built
def test_preprocess_needs_mean_and_std():
    from fastloop import _cuda

    with pytest.raises(TypeError, match="'std'"):
        _cuda.preprocess(np.zeros((1, 2, 2, 3), np.uint8), mean=MEAN)


def _capsule_pointer(capsule, name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, name)


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


@built
def test_a_view_exports_cuda_array_interface_and_dlpack_structs_without_touching_the_gpu():
    """_from_pointer wraps memory without CUDA calls, so the export plumbing runs here too
    (a host buffer stands in for device memory; nothing reads through the pointer)."""
    from fastloop import _cuda

    owner = np.zeros((3, 4, 5), np.float32)
    view = _cuda._from_pointer(owner.ctypes.data, (3, 4, 5), "float32", 1, owner)
    assert (view.shape, view.dtype, view.device, view.nbytes, view.ndim, view.size) == ((3, 4, 5), np.float32, 1, 240, 3, 60)
    assert view.__cuda_array_interface__ == {"shape": (3, 4, 5), "typestr": "<f4", "data": (owner.ctypes.data, False),
                                             "strides": None, "version": 3, "stream": None}
    assert view.__dlpack_device__() == (2, 1) and view.ready() and repr(view).startswith("DeviceArray(shape=(3, 4, 5)")
    before = sys.getrefcount(view)
    capsule = view.__dlpack__(stream=-1)
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    assert (tensor.data, tensor.device_type, tensor.device_id, tensor.ndim) == (owner.ctypes.data, 2, 1, 3)
    assert (tensor.code, tensor.bits, tensor.lanes) == (2, 32, 1)
    assert tensor.shape[:3] == [3, 4, 5] and tensor.strides[:3] == [20, 5, 1]
    versioned = view.__dlpack__(stream=-1, max_version=(1, 2))
    managed = _Versioned.from_address(_capsule_pointer(versioned, b"dltensor_versioned"))
    assert (managed.major, managed.minor, managed.flags, managed.dl_tensor.ndim) == (1, 0, 0, 3)
    assert sys.getrefcount(view) == before + 2  # each capsule holds the array
    del capsule, versioned, tensor, managed
    assert sys.getrefcount(view) == before  # unconsumed capsules called their deleters


@built
def test_dlpack_refuses_a_copy_another_device_and_stream_zero():
    from fastloop import _cuda

    owner = np.zeros(4, np.uint8)
    view = _cuda._from_pointer(owner.ctypes.data, 4, np.uint8, 0, owner)
    with pytest.raises(BufferError, match="to_numpy"):
        view.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="copy"):
        view.__dlpack__(copy=True)
    with pytest.raises(ValueError, match="ambiguous"):
        view.__dlpack__(stream=0)
    with pytest.raises(TypeError, match="native bool, integer, float or complex"):
        _cuda._from_pointer(owner.ctypes.data, 4, object, 0, owner)


@built
def test_every_entry_point_gives_the_callers_device_back_on_each_path():
    """Issue 34, defect 2: each fl_cuda_* entry point and nn op switches devices through one
    guard and gives the thread its own device back, on its error paths too. The guard's runtime
    calls are faked (a current device of 5, then 0); the real calls after the switch fail here,
    where there is no device, so each entry point takes an error path."""
    from fastloop import _cuda

    if not hasattr(_cuda, "_device_restored"):
        pytest.skip(WHY_ABSENT)
    if cuda.is_available():
        pytest.skip("the entry points are run into their error paths only where no GPU is")
    result = _cuda._device_restored()
    assert result == {"switched and restored": [], "set refused, restored": [],
                      "no context on the caller's device 0: left": []}


FINALIZING_EXPORT = '''import ctypes
import os
import sys

import numpy as np
from fastloop import _cuda

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
DELETER_OFFSET = 56  # DLManagedTensor: a 48-byte DLTensor, manager_ctx, then deleter


def consume():
    """Exports an array and does what a consumer (torch's from_dlpack) does: takes the tensor
    and renames the capsule. Returns the array's owner and the call the consumer makes when its
    tensor goes (the deleter)."""
    owner = np.zeros(4, np.float32)
    view = _cuda._from_pointer(owner.ctypes.data, 4, "float32", 0, owner)
    capsule = view.__dlpack__(stream=-1)  # stream -1: no CUDA call, so no GPU is needed
    managed = api.PyCapsule_GetPointer(capsule, b"dltensor")
    api.PyCapsule_SetName(capsule, b"used_dltensor")
    deleter = DELETER(ctypes.c_void_p.from_address(managed + DELETER_OFFSET).value)
    return owner, lambda: deleter(managed)


class ReleasedAtExit:
    """Calls the deleter from its __del__, which runs once the interpreter is finalizing."""

    def __init__(self, owner, release):
        self.owner, self.release = owner, release

    def __del__(self, write=os.write, finalizing=sys.is_finalizing, refs=sys.getrefcount):
        before = refs(self.owner)
        self.release()
        write(1, f"finalizing {finalizing()}: the deleter dropped {before - refs(self.owner)}\\n".encode())


owner, release = consume()
before = sys.getrefcount(owner)
release()
os.write(1, f"running: the deleter dropped {before - sys.getrefcount(owner)}\\n".encode())
keeper = ReleasedAtExit(*consume())
os.write(1, b"exiting\\n")
'''


@built
def test_dlpack_deleter_leaves_python_alone_once_the_interpreter_is_finalizing():
    """Issue 34, defect 9: a consumer may call the deleter while the interpreter is finalizing,
    when taking the GIL can end or hang the calling thread: the deleter must leak its reference
    then, on 3.9-3.12 (the GPU machines' Python) as on 3.13. A subprocess exports two arrays as
    a consumer would take them; one's deleter is called while it runs (its reference dropped),
    the other's from a __del__ that runs once the interpreter is finalizing (kept)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", FINALIZING_EXPORT], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["running: the deleter dropped 1", "exiting",
                                        "finalizing True: the deleter dropped 0"], done.stdout


@built
def test_pin_checks_its_device_before_touching_the_gpu():
    with pytest.raises(ValueError, match="'device' must be None or a device index >= 0"):
        cuda.pin(np.zeros(4), device=-1)
    with pytest.raises(ValueError, match="'device' must be None or a device index >= 0, not 'x'"):
        cuda.pin(np.zeros(4), device="x")


def test_torch_pinning_clears_error_712_it_tolerates(monkeypatch):
    """Issue 34, defect 9: cudaHostRegister's "already registered" (712) stays the runtime's
    last error, and torch's next launch check would raise it: the torch path reads it away."""
    import types

    from fastloop.data import _pinning

    answers, cleared = [], []

    class Cudart:
        def cudaHostRegister(self, address, nbytes, flags):
            return answers.pop(0)

        def cudaHostUnregister(self, address):
            raise AssertionError("someone else's registration must not be undone")

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(cudart=Cudart))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(_pinning, "_clear_last_error", lambda: cleared.append(True))
    answers.append(712)
    _pinning._torch_register(0x1000, 64)()  # the undo does nothing
    assert cleared == [True]
    answers.append(2)
    with pytest.raises(fastloop.CudaError, match="cudaError 2"):
        _pinning._torch_register(0x1000, 64)
    assert cleared == [True]  # a real error is raised, not cleared here


def test_torch_runtimes_last_error_is_found_among_the_mapped_libraries_or_none():
    from fastloop.data import _pinning

    get_last_error = _pinning._torch_cudart_get_last_error()
    mapped = open("/proc/self/maps").read()
    assert (get_last_error is None) == ("libcudart" not in mapped.replace("libcudart_static", ""))


# ---------------------------------------------------------------- free threading

@built
def test_importing_the_cuda_extension_leaves_the_gil_off_on_a_free_threaded_python():
    """fastloop._cuda declares Py_MOD_GIL_NOT_USED, so importing it on a free-threaded build
    must not turn the GIL back on (CPython does that, with a RuntimeWarning, for a module that
    does not declare it). A fresh interpreter, as the GIL's state is process-wide."""
    if getattr(sys, "_is_gil_enabled", None) is None or not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip(f"Python {sys.version.split()[0]} is a GIL build: there is no GIL to keep off (a free-threaded build, 3.13t, runs this)")
    env = {name: value for name, value in os.environ.items() if name != "PYTHON_GIL"}
    code = "import sys, fastloop._cuda; print(sys._is_gil_enabled())"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


class _TorchLikeStream:
    cuda_stream = 0x1234


@built
def test_many_threads_settle_one_array_once_and_drop_its_stream_refcount_once():
    """Threads read and settle one array's pending write at once (a view whose stream is a
    torch-like object, so no CUDA call runs and no GPU is needed): each reader sees the stream
    or None, and the array lets go of the stream object exactly once."""
    from fastloop import _cuda

    owner = np.zeros(16, np.float32)
    for _ in range(10):
        stream = _TorchLikeStream()
        before = sys.getrefcount(stream)
        view = _cuda._from_pointer(owner.ctypes.data, 16, np.float32, 0, owner, stream)
        assert sys.getrefcount(stream) == before + 1

        def body(i: int) -> set:
            seen = set()
            for _ in range(100):
                seen.add(view.__cuda_array_interface__["stream"])
                view.__dlpack__(stream=-1)
                view.ready() if i % 2 else view.synchronize()
            return seen

        for seen in run_at_once(body):
            assert seen <= {0x1234, None}
        assert view.__cuda_array_interface__["stream"] is None
        assert sys.getrefcount(stream) == before


# ---------------------------------------------------------------- on a GPU


def _context():
    """The test binding of the nn backend; cuBLAS must load where torch with CUDA is."""
    try:
        cuda.load_cublas()
    except fastloop.CudaUnavailable as error:
        torch = pytest.importorskip("torch")
        if torch.version.cuda:
            raise  # torch's cuBLAS is on sys.path: not finding it is a bug
        pytest.skip(str(error))
    from fastloop import _cuda

    if not hasattr(_cuda, "_NNContext"):
        pytest.skip(WHY_ABSENT)
    return _cuda._NNContext(0)


def _dev(array):
    return cuda.to_device(np.ascontiguousarray(array))


TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_backend_gemm_matches_numpy_for_each_transpose(dtype, trans_a, trans_b):
    ctx, rng = _context(), np.random.default_rng(trans_a * 2 + trans_b)
    m, n, k = 37, 29, 53
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    out = _dev(c)
    ctx.gemm(trans_a, trans_b, 0.5, _dev(a), _dev(b), 2.0, out)
    ref = 0.5 * (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64) + 2.0 * c
    np.testing.assert_allclose(out.to_numpy(), ref, **TOL[dtype] | dict(rtol=1e-4 if dtype == np.float32 else 1e-12))


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backend_elementwise_and_row_ops_match_numpy(dtype):
    ctx, rng = _context(), np.random.default_rng(1)
    x = rng.standard_normal((300, 70)).astype(dtype)
    row = rng.standard_normal(70).astype(dtype)
    out = cuda.empty(x.shape, dtype)
    ctx.fill_rows(out, _dev(row))
    np.testing.assert_array_equal(out.to_numpy(), np.broadcast_to(row, x.shape))
    sums = cuda.empty(70, dtype)
    ctx.sum_rows(_dev(x), sums)
    np.testing.assert_allclose(sums.to_numpy(), x.astype(np.float64).sum(0), **TOL[dtype])
    relu = cuda.empty(x.shape, dtype)
    ctx.relu(_dev(x), relu)
    np.testing.assert_array_equal(relu.to_numpy(), np.maximum(x, 0))
    grad_out = rng.standard_normal(x.shape).astype(dtype)
    grad_in = _dev(grad_out)
    ctx.relu_backward(relu, grad_in, grad_in)  # in place, as the header allows
    np.testing.assert_array_equal(grad_in.to_numpy(), np.where(np.maximum(x, 0) > 0, grad_out, 0))


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backend_losses_and_gradients_match_numpy(dtype):
    ctx, rng = _context(), np.random.default_rng(2)
    out = (3 * rng.standard_normal((517, 13))).astype(dtype)
    target = rng.standard_normal(out.shape).astype(dtype)
    grad = cuda.empty(out.shape, dtype)
    diff = out.astype(np.float64) - target
    assert ctx.loss("mse", _dev(out), _dev(target), grad) == pytest.approx((diff**2).mean(), rel=1e-6)
    np.testing.assert_allclose(grad.to_numpy(), 2 * diff / diff.size, **TOL[dtype])
    labels = rng.integers(0, 13, 517)
    o = out.astype(np.float64)
    lse = np.log(np.exp(o - o.max(1, keepdims=True)).sum(1)) + o.max(1)
    expected = (lse - o[np.arange(517), labels]).mean()
    assert ctx.loss("cross_entropy", _dev(out), _dev(labels), grad) == pytest.approx(expected, rel=1e-6)
    softmax = np.exp(o - lse[:, None])
    softmax[np.arange(517), labels] -= 1
    np.testing.assert_allclose(grad.to_numpy(), softmax / 517, **TOL[dtype])
    assert ctx.loss("cross_entropy", _dev(out), _dev(labels)) == pytest.approx(expected, rel=1e-6)


@gpu
def test_backend_cross_entropy_names_a_bad_label_and_leaves_grad_alone():
    ctx = _context()
    out = np.zeros((4, 5), np.float32)
    grad = _dev(np.full((4, 5), 7.0, np.float32))
    with pytest.raises(ValueError, match=r"label 9 at row 2 is outside \[0, 5\)"):
        ctx.loss("cross_entropy", _dev(out), _dev(np.array([0, 1, 9, -1])), grad)
    np.testing.assert_array_equal(grad.to_numpy(), 7.0)
    assert ctx.loss("cross_entropy", _dev(out), _dev(np.array([0, 1, 2, 3])), grad) == pytest.approx(np.log(5))


def _sgd_reference(p, g, buf, lr, momentum, weight_decay, nesterov, first_step):
    g = g + weight_decay * p
    if momentum:
        buf = g.copy() if first_step else momentum * buf + g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum, nesterov, weight_decay", [(0, 0, 0), (0.9, 0, 0.01), (0.9, 1, 0)])
def test_backend_sgd_follows_torch_update_rule(dtype, momentum, nesterov, weight_decay):
    ctx, rng = _context(), np.random.default_rng(3)
    p = rng.standard_normal(1001)
    buf = np.zeros_like(p)
    dp, dbuf = _dev(p.astype(dtype)), _dev(buf.astype(dtype))
    for step in range(3):
        g = rng.standard_normal(p.shape)
        ctx.sgd(dp, _dev(g.astype(dtype)), dbuf if momentum else None, lr=0.1, momentum=momentum,
                weight_decay=weight_decay, nesterov=bool(nesterov), first_step=step == 0)
        p, buf = _sgd_reference(p, g.astype(dtype).astype(np.float64), buf, 0.1, momentum, weight_decay, nesterov, step == 0)
        np.testing.assert_allclose(dp.to_numpy(), p, **TOL[dtype])


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decoupled", [False, True])
def test_backend_adam_follows_torch_update_rule(dtype, decoupled):
    ctx, rng = _context(), np.random.default_rng(4)
    p = rng.standard_normal(777)
    m, v = np.zeros_like(p), np.zeros_like(p)
    dp, dm, dv = _dev(p.astype(dtype)), _dev(m.astype(dtype)), _dev(v.astype(dtype))
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.1
    for step in range(1, 4):
        g = rng.standard_normal(p.shape).astype(dtype).astype(np.float64)
        ctx.adam(dp, _dev(g.astype(dtype)), dm, dv, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd,
                 decoupled=decoupled, step=step)
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - b2**step) + eps
        p = p - lr / (1 - b1**step) * m / denom
        np.testing.assert_allclose(dp.to_numpy(), p, **TOL[dtype] | dict(rtol=1e-4 if dtype == np.float32 else 1e-10))


@gpu
def test_backend_memory_copies_streams_and_out_of_memory_message():
    ctx = _context()
    host = np.arange(64, dtype=np.float32)
    a, b = cuda.empty(64, np.float32), cuda.empty(64, np.float32)
    ctx._transfer("to_device", a, host)
    ctx._transfer("copy", b, a)
    back = np.zeros_like(host)
    ctx._transfer("to_host", b, back)
    np.testing.assert_array_equal(back, host)
    ctx._transfer("zero", b, None)
    np.testing.assert_array_equal(b.to_numpy(), 0)
    with cuda.Stream() as stream:
        ctx.wait_stream(stream.handle)
    ctx.free(ctx.alloc(1 << 20))
    with pytest.raises(MemoryError, match=r"\(2199023255552 bytes\): out of memory"):
        ctx.alloc(1 << 41)  # 2 TiB
    with pytest.raises(TypeError, match="float32 or float64"):
        ctx.relu(cuda.empty(4, np.int32), cuda.empty(4, np.int32))


@gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.float32, np.float64, np.bool_])
def test_device_array_round_trips_each_dtype(dtype):
    host = (np.arange(2 * 3 * 5) % 7).astype(dtype).reshape(2, 3, 5)
    array = cuda.to_device(host)
    assert (array.shape, array.dtype, array.nbytes, array.ndim) == (host.shape, host.dtype, host.nbytes, 3)
    np.testing.assert_array_equal(array.to_numpy(), host)
    array.copy_from_numpy(host[::-1])
    np.testing.assert_array_equal(array.to_numpy(), host[::-1])
    with pytest.raises(ValueError, match="'arr' must have the array's shape"):
        array.copy_from_numpy(host[0])
    assert cuda.empty(0, dtype).to_numpy().shape == (0,)


@gpu
def test_async_to_device_from_pinned_memory_on_a_stream_is_ready_after_synchronize():
    host = np.random.default_rng(5).integers(0, 255, (64, 1 << 16), dtype=np.uint8)
    with cuda.pin(host) as region, cuda.Stream() as stream:
        assert region.nbytes == host.nbytes and not region.already_pinned
        with cuda.pin(host) as again:
            assert again.already_pinned
        array = cuda.to_device(host, stream=stream)
        assert array.__cuda_array_interface__["stream"] == stream.handle
        array.synchronize()
        assert array.ready() and array.__cuda_array_interface__["stream"] is None
        np.testing.assert_array_equal(array.to_numpy(), host)
    assert region.closed
    region.close()  # idempotent


@gpu
def test_a_dropped_device_arrays_memory_is_reused_by_the_next_of_its_size():
    """Issue 34, defect 8: a dropped array's block goes to a per-device cache (no cudaFree, which
    waits for the whole device) and the next array of that size takes it once its use is done."""
    nbytes = 3 << 20
    first = cuda.empty(nbytes, np.uint8)
    address = first.ptr
    del first
    seen = []
    for _ in range(1000):  # the block is handed out once its fence passed: poll, no sleep
        again = cuda.empty(nbytes, np.uint8)
        seen.append(again.ptr)
        if again.ptr == address:
            break
        del again
    assert address in seen
    cuda._empty_cache(0)


@gpu
def test_pinning_twice_leaves_no_error_for_torchs_next_call():
    """Issue 34, defect 9: error 712 (already registered) must not stay the last error."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from fastloop.data import _pinning

    host = np.zeros(1 << 20, np.uint8)
    address = host.ctypes.data
    with cuda.pin(host, 0), cuda.pin(host, 0) as again:
        assert again.already_pinned
        (torch.ones(4, device="cuda") * 2).sum().item()  # a launch check after the 712
    undo = _pinning._torch_register(address, host.nbytes)
    again_undo = _pinning._torch_register(address, host.nbytes)
    (torch.ones(4, device="cuda") * 2).sum().item()
    again_undo()
    undo()


@gpu
def test_fastloop_calls_leave_torchs_current_device_alone():
    """Issue 34, defect 2: a call on another device gives the thread its own device back."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(1)
    array = cuda.to_device(np.arange(4, dtype=np.float32), 0)
    assert torch.cuda.current_device() == 1
    with cuda.Stream(0) as stream:
        cuda.to_device(np.arange(4, dtype=np.float32), 0, stream=stream).synchronize()
    with cuda.pin(np.zeros(64, np.uint8), 0):
        pass
    np.testing.assert_array_equal(array.to_numpy(), np.arange(4))
    assert torch.cuda.current_device() == 1
    torch.cuda.set_device(0)


@gpu
def test_torch_takes_a_device_array_without_a_copy_and_numpy_refuses_it():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    array = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    tensor = torch.from_dlpack(array)
    assert tensor.device.type == "cuda" and tensor.data_ptr() == array.ptr and tensor.shape == (3, 4)
    tensor.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(array.to_numpy(), 2 * np.arange(12).reshape(3, 4))
    via_cai = torch.as_tensor(array, device="cuda")
    assert via_cai.data_ptr() == array.ptr
    del array  # the tensors keep the memory alive
    assert tensor.sum().item() == 2 * 66
    labels = cuda.to_device(np.arange(5, dtype=np.int64))
    assert torch.from_dlpack(labels).dtype == torch.int64
    with pytest.raises((BufferError, RuntimeError, TypeError, ValueError)):
        np.from_dlpack(labels)


def _cpu_preprocess(batch, layout, crop, offsets, flips):
    src = "HWC" if layout.startswith("HWC") else "CHW"
    x = batch
    if crop is not None:
        x = fastloop.ops.crop(x, crop, offsets="center" if offsets is None else offsets, layout=src)
    if flips is not None:
        x = fastloop.ops.hflip(x, flip=flips, layout=src)
    return fastloop.ops.normalize(np.ascontiguousarray(x), MEAN, STD, layout=layout)


@gpu
@pytest.mark.parametrize("layout", ["HWC->CHW", "CHW", "HWC"])
@pytest.mark.parametrize("crop, with_offsets, with_flips", [(None, False, False), (24, False, True), ((20, 28), True, True)])
def test_preprocess_matches_the_cpu_ops(layout, crop, with_offsets, with_flips):
    rng = np.random.default_rng(6)
    n, h, w = 9, 32, 36
    shape = (n, h, w, 3) if layout.startswith("HWC") else (n, 3, h, w)
    batch = rng.integers(0, 256, shape, dtype=np.uint8)
    ch, cw = (crop, crop) if isinstance(crop, int) else (crop or (h, w))
    offsets = np.stack([rng.integers(0, h - ch + 1, n), rng.integers(0, w - cw + 1, n)], 1) if with_offsets else None
    flips = rng.integers(0, 2, n).astype(bool) if with_flips else None
    stream = cuda.Stream()
    out = cuda.preprocess(batch, mean=MEAN, std=STD, layout=layout, crop=crop, offsets=offsets, flips=flips, stream=stream)
    assert out.__cuda_array_interface__["stream"] == stream.handle
    expected = _cpu_preprocess(batch, layout, crop, offsets, flips)
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=1e-6)
    again = cuda.preprocess(batch, mean=MEAN, std=STD, layout=layout, crop=crop, offsets=offsets, flips=flips, out=out)
    assert again is out
    again.synchronize()
    np.testing.assert_allclose(again.to_numpy(), expected, rtol=0, atol=1e-6)


@gpu
def test_preprocess_from_a_pinned_slot_is_asynchronous_and_keeps_the_batch_alive():
    rng = np.random.default_rng(7)
    batch = rng.integers(0, 256, (64, 64, 64, 3), dtype=np.uint8)
    expected = fastloop.ops.normalize(batch, MEAN, STD)
    with cuda.pin(batch), cuda.Stream() as stream:
        out = cuda.preprocess(batch, mean=MEAN, std=STD, stream=stream)
        while not out.ready():
            pass
        np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=1e-6)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # the consumer's stream waits for the preprocess stream
        with cuda.Stream() as stream:
            out = cuda.preprocess(batch, mean=MEAN, std=STD, stream=stream)
            tensor = torch.from_dlpack(out)
            np.testing.assert_allclose(tensor.cpu().numpy(), expected, rtol=0, atol=1e-6)


@gpu
def test_memcpy_benchmark_reports_bandwidth():
    assert cuda.memcpy_benchmark(8 << 20, pinned=True, repeats=3) > 0.5
    assert cuda.memcpy_benchmark(8 << 20, pinned=False, repeats=2) > 0.1


@gpu
def test_many_threads_write_one_device_array_and_its_refcounts_end_where_they_began():
    """Threads queue copies from pinned memory into ONE array on their own streams, ask
    ready(), read __cuda_array_interface__, synchronize and copy it back, all at once: every
    value is one a thread wrote, and once settled the array holds no host array or stream."""
    n = 1 << 16
    hosts = [np.full(n, i, np.int32) for i in range(THREADS)]
    before = [sys.getrefcount(host) for host in hosts]
    out = cuda.empty(n, np.int32)
    regions = [cuda.pin(host) for host in hosts]
    streams = [cuda.Stream() for _ in hosts]
    handles = {stream.handle for stream in streams} | {None}

    def body(i: int) -> None:
        for step in range(50):
            assert cuda.to_device(hosts[i], stream=streams[i], out=out) is out
            out.ready()
            assert out.__cuda_array_interface__["stream"] in handles
            if step % 5 == 0:
                out.synchronize()
                assert set(np.unique(out.to_numpy())) <= set(range(THREADS))

    run_at_once(body)
    out.synchronize()
    assert out.ready() and out.__cuda_array_interface__["stream"] is None
    for region in regions:
        region.close()
    assert [sys.getrefcount(host) for host in hosts] == before


@gpu
def test_many_threads_close_one_pinned_region_and_one_of_them_unregisters():
    host = np.zeros(1 << 20, np.uint8)
    before = sys.getrefcount(host)
    for _ in range(5):
        region = cuda.pin(host)
        assert not region.already_pinned
        run_at_once(lambda i: region.close())  # a second unregister would raise CudaError
        assert region.closed and sys.getrefcount(host) == before
        with cuda.pin(host) as again:  # unregistered: pinning it again is not "already pinned"
            assert not again.already_pinned


@gpu
def test_many_threads_share_one_nn_context_and_each_gets_its_own_product():
    ctx = _context()
    rng = np.random.default_rng(9)
    a = [rng.standard_normal((32, 16)).astype(np.float32) for _ in range(THREADS)]
    b = rng.standard_normal((16, 8)).astype(np.float32)
    db = _dev(b)

    def body(i: int) -> None:
        da, dc = _dev(a[i]), cuda.empty((32, 8), np.float32)
        for _ in range(20):
            ctx.gemm(False, False, 1.0, da, db, 0.0, dc)
            np.testing.assert_allclose(dc.to_numpy(), a[i] @ b, rtol=1e-4, atol=1e-4)

    run_at_once(body)


@gpu
@pytest.mark.parametrize("loss, optimizer", [("cross_entropy", "SGD"), ("mse", "Adam")])
def test_fastloop_nn_on_cuda_trains_like_the_cpu_model(loss, optimizer):
    """The backend driven by the model core (fastloop.nn): same start, same steps, same result."""
    nn = fastloop.nn
    rng = np.random.default_rng(8)
    x = rng.standard_normal((64, 20)).astype(np.float32)
    y = rng.integers(0, 5, 64) if loss == "cross_entropy" else rng.standard_normal((64, 5)).astype(np.float32)
    models = [nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5), device=device) for device in ("cpu", "cuda")]
    models[1].load_state_dict(models[0].state_dict())
    opts = [getattr(nn, optimizer)(model, lr=0.05 if optimizer == "SGD" else 1e-3) for model in models]
    for _ in range(5):
        losses = [model.train_step(x, y, loss=loss, opt=opt) for model, opt in zip(models, opts)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    cuda_y = cuda.to_device(np.ascontiguousarray(y))
    assert models[1].train_step(cuda.to_device(x), cuda_y, loss=loss, opt=opts[1]) == pytest.approx(
        models[0].train_step(x, y, loss=loss, opt=opts[0]), rel=1e-4)
    for name, value in models[0].state_dict().items():
        np.testing.assert_allclose(models[1].state_dict()[name], value, rtol=1e-4, atol=1e-5)
    out = models[1](cuda.to_device(x))
    np.testing.assert_allclose(out.to_numpy(), models[0](x), rtol=1e-4, atol=1e-5)


class FakeCudaExtension:
    """fastloop._cuda's answers on a machine is_available() cannot be tried on here."""

    def __init__(self, driver, runtime=13000, devices=("NVIDIA H200",)):
        self.driver, self.runtime, self.devices = driver, runtime, devices

    def driver_version(self):
        return self.driver

    def runtime_version(self):
        return self.runtime

    def device_count(self):
        return len(self.devices)

    def device_info(self, index):
        return {"name": self.devices[index]}


def _missing(what):
    def load():
        raise fastloop.CudaUnavailable(f"CUDA is not available: {what} could not be loaded: tried lib{what}.so.13")
    return load


LIBRARIES = {"libcublas": lambda: "/opt/lib/libcublas.so.13", "libnvjpeg": lambda: "/opt/lib/libnvjpeg.so.13"}


def test_is_available_says_there_is_no_driver_and_the_driver_needed():
    answer = cuda._availability(FakeCudaExtension(driver=0), LIBRARIES)
    assert not answer
    assert answer.reason == ("no NVIDIA driver: libcuda.so.1 could not be loaded (this fastloop needs "
                             "NVIDIA driver >= 580.65.06 (for the CUDA 13.0 runtime linked in))")


def test_is_available_says_the_driver_is_too_old_and_which_one_is_needed():
    answer = cuda._availability(FakeCudaExtension(driver=12080, runtime=13000), LIBRARIES)
    assert not answer
    assert answer.reason.startswith("the NVIDIA driver is too old: it supports CUDA 12.8; ")
    assert "NVIDIA driver >= 580.65.06" in answer.reason
    # a newer minor version of the runtime runs on the major version's driver
    assert cuda._availability(FakeCudaExtension(driver=13000, runtime=13020), LIBRARIES)
    old = cuda._availability(FakeCudaExtension(driver=11080, runtime=12040), LIBRARIES)
    assert "NVIDIA driver >= 525.60.13 (for the CUDA 12.4 runtime linked in)" in old.reason


def test_is_available_names_each_library_found_or_missing():
    answer = cuda._availability(FakeCudaExtension(driver=13000), LIBRARIES)
    assert answer
    assert answer.reason == ("1 CUDA device(s): NVIDIA H200; driver supports CUDA 13.0; "
                             "libcublas: /opt/lib/libcublas.so.13; libnvjpeg: /opt/lib/libnvjpeg.so.13")
    missing = cuda._availability(FakeCudaExtension(driver=13000, devices=("A", "B")),
                                 {"libcublas": _missing("cuBLAS"), "libnvjpeg": _missing("nvJPEG")})
    assert missing  # the GPU works; fastloop.nn on it and decode="gpu" need the missing ones
    assert missing.reason == ("2 CUDA device(s): A, B; driver supports CUDA 13.0; "
                              "no libcublas (cuBLAS could not be loaded: tried libcuBLAS.so.13); "
                              "no libnvjpeg (nvJPEG could not be loaded: tried libnvJPEG.so.13)")


def test_is_available_says_when_no_device_is_visible():
    answer = cuda._availability(FakeCudaExtension(driver=13000, devices=()), LIBRARIES)
    assert not answer and "sees no device" in answer.reason
