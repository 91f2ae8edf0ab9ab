"""fastloop.cuda answers whether CUDA was built and works here, and why not; the CUDA
self-test runs where a GPU exists and is skipped cleanly elsewhere."""

from __future__ import annotations

import shutil

import pytest

import fastloop
from fastloop import cuda


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
