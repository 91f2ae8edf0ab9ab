"""The C exception table (csrc/py/fl_exc.h) and fastloop.errors agree, and every exception
the C side raises carries its codes the same way from either extension."""

import inspect

import pytest

import fastloop
from fastloop import _core, errors


def fastloop_classes() -> set[str]:
    return {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, errors.Error)}


def test_every_table_row_has_a_class_and_every_class_a_row():
    assert set(_core._exception_names) == fastloop_classes()


def test_errors_all_lists_every_class_once():
    assert sorted(errors.__all__) == sorted(fastloop_classes())
    assert len(errors.__all__) == len(set(errors.__all__))


def test_package_exports_every_exception_from_errors():
    for name in errors.__all__:
        assert getattr(fastloop, name) is getattr(errors, name)
        assert name in fastloop.__all__


def test_a_fastloop_exception_without_a_core_code_has_code_zero():
    with pytest.raises(fastloop.Empty) as raised:
        fastloop.Queue().get_nowait()
    assert raised.value.code == 0 and raised.value.cuda_code is None


def test_a_core_error_carries_its_code_and_errno(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        fastloop.load_npy(str(tmp_path / "missing.npy"))
    assert raised.value.code < 0 and raised.value.errno == 2
    assert "missing.npy" in str(raised.value)


def test_a_bad_argument_names_it_and_has_no_code():
    with pytest.raises(ValueError, match="max_items") as raised:
        fastloop.Queue().get_many(0)
    assert not hasattr(raised.value, "code")


def cuda_module():
    try:
        from fastloop import _cuda
    except ImportError as error:
        pytest.skip(f"fastloop._cuda is not built: {error}")
    return _cuda


def test_cuda_error_from_cuda_carries_the_library_code_and_the_cuda_number():
    _cuda = cuda_module()
    try:
        _cuda.device_count()
    except fastloop.CudaError as error:  # no driver or no device: the failing call's own error
        assert error.code == -13  # FL_ECUDA
        assert error.cuda_code is not None and f"code {error.cuda_code})" in str(error)
        return
    # A GPU: an allocation of 1 PiB fails in cudaMalloc (cudaErrorMemoryAllocation, 2).
    with pytest.raises(fastloop.CudaError) as raised:
        _cuda.empty((1 << 50,), "uint8")
    assert raised.value.code == -13 and raised.value.cuda_code == 2
    assert "code 2)" in str(raised.value)


def test_cuda_unavailable_or_a_missing_device_from_cuda():
    _cuda = cuda_module()
    try:
        count = _cuda.device_count()
    except fastloop.CudaError:
        count = 0
    if count == 0:
        with pytest.raises(fastloop.CudaUnavailable) as raised:
            _cuda.memcpy_benchmark(1024)
        assert type(raised.value) is errors.CudaUnavailable
    else:  # a GPU: the device one past the last is refused, naming the argument
        with pytest.raises(ValueError, match=rf"'device' {count} does not exist"):
            _cuda.memcpy_benchmark(1024, device=count)


def test_cuda_error_made_in_python_keeps_its_arguments():
    error = fastloop.CudaError("boom", code=-13, cuda_code=35)
    assert (error.code, error.cuda_code, str(error)) == (-13, 35, "boom")
