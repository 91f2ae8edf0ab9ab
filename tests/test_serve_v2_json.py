"""The v2 infer request's JSON with its numeric "data" read in C (serve/v2_json.py): every body
gives what json.loads of the whole body gives -- the same arrays, or the same BadInput message."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastloop.serve import v2_json
from fastloop.serve.v2_tensors import BadInput, read_request

ROW = np.random.default_rng(7).standard_normal(100).astype(np.float32)


def tensor(data, datatype="FP32", shape=None, name="x", **extra) -> dict:
    shape = shape if shape is not None else list(np.shape(data))
    return {"name": name, "shape": shape, "datatype": datatype, "data": data, **extra}


def body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def outcome(raw: bytes, monkeypatch, fast: bool):
    """(arrays by name, or the BadInput message) of read_request(raw), with the C paths or without."""
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(v2_json, "loads", json.loads)
            patch.setattr(v2_json, "read_plain", lambda head: None)
        try:
            request = read_request(raw, None)
        except BadInput as error:
            return str(error)
    return {t.name: (t.datatype, t.array) for t in request.inputs}


def same(raw: bytes, monkeypatch):
    fast, slow = outcome(raw, monkeypatch, True), outcome(raw, monkeypatch, False)
    if isinstance(slow, str):
        assert fast == slow
    else:
        assert fast.keys() == slow.keys()
        for name, (datatype, array) in slow.items():
            assert fast[name][0] == datatype
            assert fast[name][1].dtype == array.dtype and fast[name][1].shape == array.shape
            np.testing.assert_array_equal(fast[name][1], array)
    return fast


def test_the_usual_body_is_read_in_c_and_equals_json_loads(monkeypatch):
    raw = body(tensor(ROW.tolist(), shape=[1, 100]), id="r1")
    data = v2_json.loads(raw)
    assert isinstance(data["inputs"][0]["data"], v2_json.Numbers) and data["id"] == "r1"
    got = same(raw, monkeypatch)
    np.testing.assert_array_equal(got["x"][1], ROW.reshape(1, 100))
    nested = body(tensor(ROW.reshape(4, 25).tolist()))  # nested data, any layout of whitespace
    assert isinstance(v2_json.loads(nested)["inputs"][0]["data"], v2_json.Numbers)
    same(nested, monkeypatch)
    spaced = raw.replace(b'"data": [', b'"data"  :\n [ ').replace(b", ", b" ,\t")
    assert isinstance(v2_json.loads(spaced)["inputs"][0]["data"], v2_json.Numbers)
    same(spaced, monkeypatch)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16", "INT8", "INT32", "INT64", "UINT8", "BOOL",
                                      "BYTES"])
def test_every_datatype_reads_as_json_loads_reads_it(monkeypatch, datatype):
    for values in ([1.5] * 40, list(range(40)), [0, 1] * 20, [300] * 40, [70000.5] * 40, [-1] * 40,
                   [1e300] * 40, [2 ** 60] * 40, [1, 2.5] * 20):
        same(body(tensor(values, datatype, shape=[40])), monkeypatch)
        same(body(tensor(values, datatype, shape=[2, 20])), monkeypatch)  # a shape the count fits
        same(body(tensor(values, datatype, shape=[41])), monkeypatch)  # one it does not


def test_the_checks_and_their_messages_stay(monkeypatch):
    long = ROW.tolist()
    cases = [
        body(tensor(long, shape=[99])),  # the count
        body(tensor([long[:50], long[:49]], shape=[99])),  # ragged
        body(tensor(long + [None], shape=[101])),  # a null
        body(tensor(long + ["1"], shape=[101])),  # a string
        body(tensor(long + [True], shape=[101])),  # a boolean
        body(tensor([], shape=[0])),
        body(tensor(long, datatype="FP8", shape=[100])),
        body(tensor(long, shape=[100], parameters={"binary_data_size": 4})),
        body(tensor(long, shape=[100]), tensor(long, shape=[100])),  # a name twice
        body(tensor(long, shape=[100]), parameters={"sequence_id": 1}),
        body(tensor(long, shape=[100]), data=long),  # "data" at the top: unknown
        body(tensor(long, shape=[100]), outputs=[{"name": "y", "data": long}]),
        body(tensor(long, shape=[100]), id='"data": [' + "1, " * 40 + "1]"),  # "data" inside a string
        body(tensor(long, shape=[100], name='x"data')),
        body(tensor({"\x00fastloop-data": 0}, shape=[1]), tensor(long, shape=[100], name="y")),  # the placeholder
        body(tensor(long, shape=[100]), tensor(long, "INT32", shape=[100], name="y")),
        body(tensor(long, shape=[100]), tensor([1] * 100, "INT32", shape=[100], name="y")),
    ]
    for raw in cases:
        same(raw, monkeypatch)
    twice = body(tensor(long, shape=[100])).replace(b'"data"', b'"data": ' + json.dumps(long).encode() + b', "data"')
    same(twice, monkeypatch)  # "data" given twice: json.loads keeps the last
    for broken in (body(tensor(long, shape=[100]))[:-3], body(tensor(long, shape=[100])).replace(b"]", b"],,", 1),
                   body(tensor(long, shape=[100])).replace(b", ", b" ", 1), b"{not json"):
        with pytest.raises(BadInput, match="not valid"):
            read_request(broken, None)
        assert outcome(broken, monkeypatch, True) == outcome(broken, monkeypatch, False)


def test_the_usual_request_is_read_plain_and_any_other_the_general_way(monkeypatch):
    """read_plain takes the usual request (inputs of name, datatype, shape and data; an id) and
    leaves every other to loads() and the general checks: both give the same for every case."""
    usual = [body(tensor(ROW.tolist(), shape=[1, 100]), id="r1"), body(tensor(ROW.tolist(), "FP64", shape=[100])),
             body(tensor(ROW.tolist(), shape=[100]), tensor(ROW.tolist(), "FP16", shape=[4, 25], name="y")),
             body(tensor(ROW.tolist(), shape=[99]))]  # plain, and refused for its count
    for raw in usual:
        assert v2_json.read_plain(raw) is not None
        same(raw, monkeypatch)
    other = [body(tensor(ROW.tolist(), shape=[1, 100]), id=7), body(tensor(ROW.tolist(), shape=[1.0, 100])),
             body(tensor(ROW.tolist(), shape=[2 ** 64, 100])), body(tensor(ROW.tolist(), shape=[True, 100])),
             body(tensor(ROW.tolist(), shape=[-1, 100])), body(tensor(ROW.tolist(), shape="100")),
             body(tensor(ROW.tolist(), "INT32", shape=[100])), body(tensor(ROW.tolist(), "FP8", shape=[100])),
             body(tensor(ROW.tolist(), shape=[100], parameters={})), body(tensor(ROW.tolist(), shape=[100]), outputs=[]),
             body(tensor(ROW.tolist(), shape=[100]), model_name="m"), body(tensor(ROW.tolist(), shape=[100], name="x\\y")),
             body({"name": "x", "datatype": "FP32", "data": ROW.tolist()})]  # no shape
    for raw in other:
        assert v2_json.read_plain(raw) is None
        same(raw, monkeypatch)
    twice = body(tensor(ROW.tolist(), shape=[100]), tensor(ROW.tolist(), shape=[100]))  # plain, but a name twice
    assert same(twice, monkeypatch) == "inputs are named more than once: ['x', 'x']"


def test_an_overflow_names_the_input(monkeypatch):
    raw = body(tensor([70000.0] * 80, "FP16", shape=[80]))
    assert isinstance(v2_json.loads(raw)["inputs"][0]["data"], v2_json.Numbers)
    message = same(raw, monkeypatch)
    assert message == "input 'x': values up to 70000.0 overflow float16"
