"""The checkpoint file format against the safetensors package itself: fastloop's files open with
safetensors.numpy / safetensors.torch without fastloop, the layout facts the format states hold
on them, fastloop's reader refuses everything the package refuses (hand-made cases and random
mutations of real files), always as a CheckpointError naming the file, and .npz checkpoints
of earlier versions still load."""

from __future__ import annotations

import json
import os
import random
import re
import zlib

import numpy as np
import pytest

import fastloop

safetensors = pytest.importorskip("safetensors")
import safetensors.numpy  # noqa: E402


def numpy_state() -> dict:
    rng = np.random.default_rng(0)
    return {"model": {"fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
                      "fc.bias": np.arange(4, dtype=np.float64), "steps": np.int64(7)},
            "mask": np.array([True, False, True]), "ids": np.arange(5, dtype=np.int16),
            "epoch": 3, "name": "run-a", "groups": [{"lr": 0.1, "betas": (0.9, 0.999)}]}


def saved_file(tmp_path, state: dict, step: int = 1) -> str:
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, step)
    return ckpt.latest().path


def split(path: str) -> tuple[int, dict, bytes]:
    """(header length, header, data buffer) as the format defines them."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8:8 + n]), raw[8 + n:]


def test_safetensors_numpy_reads_a_checkpoint_by_dotted_names_with_the_structure_in_metadata(tmp_path):
    state = numpy_state()
    path = saved_file(tmp_path, state)
    tensors = safetensors.numpy.load_file(path)
    assert sorted(tensors) == ["ids", "mask", "model.fc.bias", "model.fc.weight", "model.steps"]
    np.testing.assert_array_equal(tensors["model.fc.weight"], state["model"]["fc.weight"])
    assert tensors["model.fc.weight"].dtype == np.float32 and tensors["mask"].dtype == np.bool_
    assert tensors["model.steps"].shape == () and tensors["model.steps"] == 7
    with safetensors.safe_open(path, framework="np") as f:
        metadata = f.metadata()
    assert metadata["format"] == "np" and metadata["fastloop.crc32"] == f"{zlib.crc32(split(path)[2]):08x}"
    manifest = json.loads(metadata["fastloop.state"])  # the nesting, numbers and strings, as JSON
    assert manifest["version"] == 1 and {"t": "const", "v": "run-a"} in [v for _, v in manifest["root"]["v"]]


def test_the_files_hold_the_layout_facts_of_the_format(tmp_path):
    path = saved_file(tmp_path, numpy_state())
    n, header, data = split(path)
    raw = open(path, "rb").read()
    assert n % 8 == 0 and raw[8:8 + n].rstrip(b" ").endswith(b"}")  # padded with spaces to 8 bytes
    assert list(header)[0] == "__metadata__"  # first, as the package writes it
    spans = sorted(tuple(info["data_offsets"]) for name, info in header.items() if name != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # back to back: no hole, no overlap
    for name, info in header.items():
        if name != "__metadata__":
            itemsize = np.dtype(safetensors.numpy._getdtype(info["dtype"])).itemsize
            assert info["data_offsets"][0] % itemsize == 0, name  # widest items first: all aligned


def rewrite(path: str, header: dict | bytes, data: bytes | None = None, pad: bool = True) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    _, _, old = split(path)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + (old if data is None else data))


def package_refuses(path: str) -> bool:
    try:
        safetensors.numpy.load_file(path)
    except Exception:  # SafetensorError, and TypeError for a dtype NumPy cannot make
        return True
    return False


def test_the_package_refuses_holes_and_trailing_bytes_and_takes_an_unpadded_header(tmp_path):
    """What the package itself enforces (safetensors 0.8 here): fastloop pads anyway."""
    path = saved_file(tmp_path, {"w": np.arange(4, dtype=np.float32)})
    _, header, data = split(path)
    del header["__metadata__"]
    rewrite(path, header, data, pad=False)
    assert not package_refuses(path)
    rewrite(path, header, data + b"\0\0\0\0")
    assert package_refuses(path)
    header["w"] = {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}
    rewrite(path, header, data)
    assert package_refuses(path)


def header_cases(header: dict) -> dict[str, tuple[bytes, str]]:
    """Malformed headers made from a good one: name -> (header bytes, what the error says)."""
    meta = header["__metadata__"]
    good = {k: v for k, v in header.items() if k != "__metadata__"}
    name = next(iter(good))
    entry = good[name]
    begin, end = entry["data_offsets"]

    def changed(**fields) -> bytes:
        return json.dumps({"__metadata__": meta, **good, name: {**entry, **fields}}).encode()

    text = json.dumps({"__metadata__": meta, **good})
    return {
        "not utf-8": (b'{"\xff": 1}', "not UTF-8"),
        "not json": (text[:-1].encode(), "not JSON"),
        "an array": (b"[1, 2]", "a JSON list, not an object"),
        "nan": (changed(shape=[float("nan")]), "NaN, which JSON does not allow"),
        "duplicate key": (text[:-1].encode() + b', "' + name.encode() + b'": ' + json.dumps(entry).encode() + b"}",
                          "twice"),
        "metadata not strings": (json.dumps({"__metadata__": {"a": 1}, **good}).encode(), "not an object of strings"),
        "entry not an object": (json.dumps({"__metadata__": meta, **good, name: [1, 2]}).encode(),
                                "not a {dtype, shape, data_offsets} object"),
        "unknown dtype": (changed(dtype="F128"), "unknown dtype 'F128'"),
        "negative dimension": (changed(shape=[-1] + entry["shape"][1:]), "not a list of ints >= 0"),
        "bool dimension": (changed(shape=[True] * len(entry["shape"])), "not a list of ints >= 0"),
        "reversed offsets": (changed(data_offsets=[end, begin]), "0 <= begin <= end"),
        "span mismatch": (changed(data_offsets=[begin, end - 1]), "make"),
        "overflowing shape": (changed(shape=[2**40, 2**40, 0]), "overflows"),
        "hole": (changed(data_offsets=[begin + 8, end + 8]), "a hole|cover"),
        "overlap": (changed(data_offsets=[begin + 4, end + 4]), "an overlap|a hole|cover"),
        "missing field": (json.dumps({"__metadata__": meta, **good, name: {"dtype": "F32"}}).encode(),
                          "not a {dtype, shape, data_offsets} object"),
    }


@pytest.mark.parametrize("case", sorted(header_cases({"__metadata__": {}, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})))
def test_a_malformed_header_is_refused_naming_the_file_and_the_fault(tmp_path, case):
    path = saved_file(tmp_path, {"w": np.arange(4, dtype=np.float32).reshape(2, 2), "b": np.ones(2, np.float32)})
    _, header, data = split(path)
    raw, reason = header_cases(header)[case]
    rewrite(path, raw, data)
    with pytest.raises(fastloop.CheckpointError, match=rf"checkpoint {re.escape(path)} cannot be read: .*({reason})"):
        fastloop.read_checkpoint(path)
    if case not in ("duplicate key",):  # the package keeps the last of two equal keys
        assert package_refuses(path), case


@pytest.mark.parametrize("length, reason", [(2**62, "over the 100000000 safetensors reads"),
                                            (10**6, "a header length of 1000000 bytes in a file of")])
def test_a_header_length_past_the_limit_or_the_file_is_refused(tmp_path, length, reason):
    path = saved_file(tmp_path, {"w": np.zeros(3)})
    with open(path, "r+b") as f:
        f.write(length.to_bytes(8, "little"))
    with pytest.raises(fastloop.CheckpointError, match=rf"{re.escape(path)} cannot be read: .*{reason}"):
        fastloop.read_checkpoint(path)
    assert package_refuses(path)


def mutate(raw: bytes, rng: random.Random) -> bytes:
    """One random change of a file, mostly inside its header."""
    n = int.from_bytes(raw[:8], "little")
    data = bytearray(raw)
    kind = rng.randrange(6)
    if kind == 0:  # a byte of the header changed
        data[8 + rng.randrange(n)] = rng.randrange(256)
    elif kind == 1:  # a digit changed (offsets, shapes, the CRC)
        digits = [i for i in range(8, 8 + n) if chr(data[i]).isdigit()]
        data[rng.choice(digits)] = ord(rng.choice("0123456789"))
    elif kind == 2:  # cut anywhere
        del data[rng.randrange(len(data)):]
    elif kind == 3:  # the header length changed
        data[:8] = max(0, n + rng.randint(-16, 16)).to_bytes(8, "little")
    elif kind == 4:  # a structural character swapped for another
        marks = [i for i in range(8, 8 + n) if chr(data[i]) in '{}[]":,']
        data[rng.choice(marks)] = ord(rng.choice('{}[]":, 0'))
    else:  # bytes inserted into the header, its length kept
        at = 8 + rng.randrange(n)
        data[at:at] = bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 4)))
    return bytes(data)


def test_random_mutations_are_refused_as_checkpoint_errors_or_read_as_the_package_reads_them(tmp_path):
    path = saved_file(tmp_path, numpy_state())
    original = open(path, "rb").read()
    rng = random.Random(1234)
    accepted = 0
    for i in range(600):
        mutated = mutate(original, rng)
        with open(path, "wb") as f:
            f.write(mutated)
        try:
            state = fastloop.read_checkpoint(path)
        except fastloop.CheckpointError as error:
            assert path in str(error), (i, str(error))
            continue
        accepted += 1  # e.g. a space changed in the padding: must read as the package reads it
        assert not package_refuses(path), (i, mutated[:300])
        assert isinstance(state, dict)
    assert accepted < 600 // 2  # most mutations break the file


OLD_MANIFEST = {"version": 1, "root": {"t": "dict", "v": [
    [{"t": "const", "v": "w"}, {"t": "ndarray", "k": "w"}],
    [{"t": "const", "v": "opt"}, {"t": "dict", "v": [[{"t": "const", "v": "lr"}, {"t": "float", "v": (0.1).hex()}]]}],
    [{"t": "const", "v": "epoch"}, {"t": "int", "v": "4"}]]}}


def write_old_npz(path: str, w: np.ndarray) -> None:
    """An .npz checkpoint as versions before safetensors wrote it: arrays plus the manifest member."""
    manifest = np.frombuffer(json.dumps(OLD_MANIFEST).encode(), np.uint8)
    np.savez(path, w=w, __fastloop_state__=manifest)


def test_npz_checkpoints_of_earlier_versions_still_load_and_count_for_keep(tmp_path):
    write_old_npz(str(tmp_path / "ckpt-000000000001.npz"), np.zeros(3))
    write_old_npz(str(tmp_path / "ckpt-000000000002.npz"), np.ones(3))
    ckpt = fastloop.Checkpointer(tmp_path, keep=2)
    assert [c.step for c in ckpt.checkpoints()] == [1, 2]
    state = ckpt.load()
    assert state["w"].tolist() == [1.0, 1.0, 1.0] and state["opt"] == {"lr": 0.1} and state["epoch"] == 4
    np.savez(tmp_path / "flat.npz", a=np.arange(2))  # an .npz without a manifest: its arrays
    assert fastloop.read_checkpoint(tmp_path / "flat.npz")["a"].tolist() == [0, 1]
    ckpt.save({"w": np.full(3, 3.0)}, 3)
    ckpt.close()
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000002.npz", "ckpt-000000000003.safetensors", "flat.npz"]
    (tmp_path / "ckpt-000000000002.npz").write_bytes(b"PK\x03\x04 damaged")
    with pytest.raises(fastloop.CheckpointError, match=r"ckpt-000000000002\.npz cannot be read"):
        ckpt.load(2)


def test_a_safetensors_file_fastloop_did_not_write_loads_as_a_dict_of_its_tensors(tmp_path):
    path = str(tmp_path / "other.safetensors")
    safetensors.numpy.save_file({"a.b": np.arange(3, dtype=np.int32), "c": np.ones((2, 2), np.float16)}, path)
    state = fastloop.read_checkpoint(path)
    assert sorted(state) == ["a.b", "c"]
    values = {k: np.asarray(v) for k, v in state.items()}
    assert values["a.b"].tolist() == [0, 1, 2] and values["c"].dtype == np.float16


def test_the_c_writer_and_the_python_reader_share_one_dtype_table(tmp_path):
    """checkpoint/_dtypes.py is the Python side's one table; the C writer keeps its own
    (fl_safetensors.c builds without Python). They agree: the same codes with the same item
    sizes in the C source, every code written through the C path reads back as itself, a code
    with the wrong item size and an unknown code are refused by the C writer."""
    from pathlib import Path

    from fastloop.checkpoint import _dtypes, _safetensors

    source = (Path(__file__).resolve().parents[1] / "csrc" / "checkpoint" / "fl_safetensors.c").read_text()
    table = source[source.index("DTYPES[] = {"):]
    table = table[:table.index("};")]
    c_sizes = {code: int(size) for code, size in re.findall(r'\{"([A-Z0-9_]+)", (\d+)\}', table)}
    assert c_sizes == {code: dtype.itemsize for code, dtype in _dtypes.NUMPY_OF.items()}

    entries = sorted(((f"t.{code}", np.arange(3).astype(dtype), code) for code, dtype in _dtypes.NUMPY_OF.items()),
                     key=lambda entry: -entry[1].dtype.itemsize)
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt._core.save(entries, [("format", "np")], 1, None, 1)  # what save() hands the C writer
        ckpt.wait()
        contents = _safetensors.read(ckpt.latest().path)
        assert contents.codes == {name: code for name, _, code in entries}
        for name, array, _ in entries:
            assert contents.arrays[name].dtype == array.dtype
            assert contents.arrays[name].tobytes() == array.tobytes()
        with pytest.raises(ValueError, match="tensor 'x': 6 bytes, its shape and dtype make 12"):
            ckpt._core.save([("x", np.zeros(3, np.uint16), "F32")], [("format", "np")], 2, None, 1)
        with pytest.raises(ValueError, match="tensor 'x': unknown safetensors dtype"):
            ckpt._core.save([("x", np.zeros(3, np.uint16), "F128")], [("format", "np")], 3, None, 1)
    assert {code for code, (_, raw, _) in _dtypes.TABLE.items() if not raw} == set(_dtypes.CODE_OF_NUMPY.values())
    for code, dtype in _dtypes.NUMPY_OF.items():
        if code in _dtypes.CODE_OF_NUMPY.values():
            assert fastloop.checkpoint._state.st_code(dtype) == code
