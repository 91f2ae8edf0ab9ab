"""The C fast path of the HTTP front's JSON bodies (fastloop._core.parse_json_inputs behind
parse_body(body, dtype)): for every body, fast path + fallback gives what the json.loads path
gives -- the same dict, inputs bit-identical once the model's check has cast them, the same
exception type and message -- and the usual body really takes the fast path."""

from __future__ import annotations

import json
import math
import random
import struct
import threading
from decimal import Decimal

import numpy as np
import pytest

from fastloop import _core
from fastloop.serve.http_inputs import BadInput, parse_body
from fastloop.serve.inputs import InputSpec
from fastloop.serve.spec import Input, Spec

FLOATS = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]


def outcome(fn, *args):
    """("ok", value) or ("raise", exception type, message)."""
    try:
        return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - the type and message are what is compared
        return "raise", type(error), str(error)


def bits(array: np.ndarray) -> tuple:
    return array.dtype.str, array.shape, array.tobytes()


def model_checks(dtype: np.dtype, ndim: int):
    """What the service does with "inputs" for a model of `dtype`: InputSpec (fastloop.nn) and
    Spec (a declared Input), their results as comparable bytes."""
    specs = [InputSpec(dtype), Spec(Input(dtype, (None,) * max(ndim, 1)))]
    return [lambda x, s=s: bits(s.check(x)) for s in specs]


def depth(value) -> int:
    """How deep lists nest along their first elements (ragged lists too)."""
    return 1 + depth(value[0]) if isinstance(value, list) and value else int(isinstance(value, list))


def assert_same(body: bytes, dtype: np.dtype) -> str:
    """Asserts parse_body(body, dtype) (fast path first) equals parse_body(body) (json.loads
    alone) and that the model's checks end the same; returns "fast" when inputs came back as
    an array (the C path), else "slow"."""
    want, got = outcome(parse_body, body), outcome(parse_body, body, dtype)
    if want[0] == "raise":
        assert got == want, body
        return "slow"
    assert got[0] == "ok", (body, got)
    want, got = want[1], got[1]
    assert set(got) == set(want), body
    for key in want:
        if key != "inputs":
            assert type(got[key]) is type(want[key]) and got[key] == want[key], (body, key)
    if "inputs" not in want:
        return "slow"
    fast = isinstance(got["inputs"], np.ndarray)
    if fast:
        assert got["inputs"].dtype == dtype
    else:
        assert got["inputs"] == want["inputs"], body
    ndim = depth(want["inputs"])
    for check in model_checks(dtype, ndim):
        assert outcome(check, got["inputs"]) == outcome(check, want["inputs"]), (body, dtype)
    return "fast" if fast else "slow"


def body_of(inputs: str, rest: str = "") -> bytes:
    return ('{"inputs": ' + inputs + rest + "}").encode()


rng = np.random.default_rng(7)
IMAGE = json.dumps({"inputs": np.round(rng.standard_normal((3, 32, 32)), 5).tolist(), "id": "img-1"}).encode()
ROW = json.dumps({"inputs": rng.standard_normal(784).tolist(), "id": "x", "priority": "high", "timeout_s": 2}).encode()

FAST_BODIES = [
    body_of("[0.12, -3.5e-2, 1E+2, 2e-3, 0, -0, -0.0, 0.0e5, 1, -7, 123.456e-7]"),
    body_of("[1e-320, 4.9e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308]"),
    body_of("[1e-400, -1e-400, 0e999, 0.000000000000000000000000000001234]"),
    body_of("[9007199254740991, -9007199254740991, 16777217, 65504, 65519, 65520, 2049, 3.4028235e38]"),
    body_of("[0.1000000000000000055511151231257827, 3.141592653589793238462643383279, "
            "9007199254740993.0, 1.00000000000000011102230246251565404236316680908203125]"),
    body_of("[" + "0." + "0" * 200 + "1, 1." + "0" * 300 + ", 0." + "3" * 400 + "]"),  # long, and still exact
    body_of("[[1, 2.5], [3, 4]]"),
    body_of("[[[1], [2]], [[3], [4]], [[5], [6]]]"),
    body_of("[" * 32 + "1" + "]" * 32),
    b' \n\t{ "inputs" :\r[ [ 1 , 2 ] ,[3,4\t] ]\n , "id" : "x" , "priority"\n:\t"high" , "timeout_s" : 2.5 } \r\n',
    body_of("[1]", ', "id": "a\\"b\\\\c\\/\\u00e9\\n\\t\\b\\f\\r\\ud83d\\ude00"'),
    body_of("[1]", ', "id": "\u00e9\u20ac\U0001f600 \u00ff"'),
    b'{"id": "first", "inputs": [1.5], "timeout_s": 2}',
    b'{"inputs": [1], "id": "\\ud800"}',
    body_of("[1]", ', "timeout_s": 1e-3, "priority": "low"'),
    IMAGE,
    ROW,
]

SLOW_BODIES = [
    # not the usual shape
    b'{"inputs": {"a": [1, 2], "b": [3]}}', b'{"inputs": 5}', b'{"inputs": 5.5}', b'{"inputs": "abc"}',
    body_of("[1, null]"), body_of("[true, 1]"), body_of("[false]"), body_of('[1, "2"]'), body_of("[[1, 2], [3]]"),
    body_of("[[1], [2, 3]]"), body_of("[[1, 2], 3]"), body_of("[1, [2]]"), body_of("[[[1]], [2]]"), body_of("[]"),
    body_of("[[]]"), body_of("[[1], []]"), body_of("[1]", ', "inputs": [2]'), body_of("[1]", ', "id": "a", "id": "b"'),
    b'{"\\u0069nputs": [1]}', b'{"inp\\u0075ts": [1], "id": "x"}', b"{}", b'{"id": "x"}', b'{"path": "a.npy"}',
    body_of("[" * 33 + "1" + "]" * 33),
    # numbers the fast path leaves to json.loads
    body_of("[1e999]"), body_of("[-1e999]"), body_of("[1e309, 1]"), body_of("[" + "9" * 400 + "]"),
    body_of("[" + "1" * 400 + ".5]"), body_of("[9007199254740992]"), body_of("[-9007199254740992]"),
    body_of(f"[{2**63}]"), body_of(f"[{2**64 + 1}]"), body_of(f"[{-2**70}]"), body_of(f"[{2**1024}]"),
    body_of("[" + "0." + "0" * 320 + "5]"),  # a subnormal (strtod's) past JSON_NUMBER_MAX_CHARS
    # not JSON
    body_of("[NaN]"), body_of("[Infinity]"), body_of("[-Infinity]"), body_of("[nan]"), body_of("[01]"),
    body_of("[-01]"), body_of("[1.]"), body_of("[.5]"), body_of("[+1]"), body_of("[1e]"), body_of("[1e+]"),
    body_of("[-]"), body_of("[1,]"), body_of("[1,,2]"), body_of("[1 2]"), body_of("[0x10]"), body_of("[1_000]"),
    b'{"inputs": [1],}', b'{"inputs": [1] "id": "x"}', b'{"inputs" [1]}', b"{'inputs': [1]}",
    b'{"inputs": [1]} {}', b'{"inputs": [1]}x', b'[{"inputs": [1]}]', b"", b" ", b"null", b"[1, 2]", b'"x"',
    b'{"inputs": [1]\x0c}', b'{"inputs": [1]\x0b}', b'{"inputs":\xc2\xa0[1]}', b'\xef\xbb\xbf{"inputs": [1]}',
    '{"inputs": [1]}'.encode("utf-16"), '{"inputs": [1]}'.encode("utf-32-le"),
    b'{"inputs": [1] /* c */}', b'{"inputs": [1], "id": "a\x01b"}', b'{"inputs": [1], "id": "a\tb"}',
    b'{"inputs": [1], "id": "\\x41"}', b'{"inputs": [1], "id": "\\u12"}', b'{"inputs": [1], "id": "\\u12g4"}',
    b'{"inputs": [1], "id": "\xff"}', b'{"inputs": [1], "id": "\xc0\x80"}',
    b'{"inputs": [1], "id": "\xed\xa0\x80"}', b'{"inputs": [1], "id": "\xf4\x90\x80\x80"}',
    b'{"inputs": [1], "id": "\xe2\x82"}', b'{"inputs": [1], "id": "abc', b'{"inputs": [1], "\xff": 1}',
    b'{"inputs": [1], "id": tru}', b'{"inputs": [1], "id": True}', b'{"inputs": [1], "id": nul}',
    # valid JSON the checks refuse, nested past the fast path's limits
    b'{"inputs": [1], "id": ' + b"[" * 65 + b"]" * 65 + b"}", b'{"inputs": [1], "id": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"inputs": [1], "id": "x", "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, '
    b'"g": 7, "h": 8, "i": 9, "j": 10, "k": 11, "l": 12, "m": 13, "n": 14, "o": 15, "p": 16}',
]

# The fast path reads these and parse_body's checks refuse them, in the same words.
REFUSED_BY_CHECKS = [
    b'{"inputs": [1], "path": "a.npy"}', b'{"inputs": [1], "other": 1}', b'{"inputs": [1], "id": 5}',
    b'{"inputs": [1], "id": null}', b'{"inputs": [1], "timeout_s": true}', b'{"inputs": [1], "timeout_s": "2"}',
    b'{"inputs": [1], "id": {"a": [1, {"b": null}], "c": []}}', b'{"inputs": [1], "id": [[[[[]]]]]}',
    b'{"inputs": [1], "path": 5}', b'{"path": "a.npy", "inputs": [[1, 2]], "zz": "\\u00e9"}',
]

OVERFLOWING = [body_of("[1e300, 1]"), body_of("[70000.0]"), body_of("[70000]"), body_of("[-3.5e38]")]


@pytest.mark.parametrize("body", FAST_BODIES)
def test_the_usual_bodies_take_the_fast_path_and_equal_json_loads(body):
    assert _core.parse_json_inputs(body) is not None
    assert assert_same(body, np.dtype(np.float64)) == "fast"
    for dtype in FLOATS:
        assert_same(body, dtype)


@pytest.mark.parametrize("body", SLOW_BODIES)
def test_every_other_body_falls_back_and_ends_exactly_as_json_loads(body):
    assert _core.parse_json_inputs(body) is None, body
    for dtype in FLOATS:
        assert assert_same(body, dtype) == "slow"


@pytest.mark.parametrize("body", REFUSED_BY_CHECKS)
def test_bodies_the_checks_refuse_raise_the_same_bad_input(body):
    assert _core.parse_json_inputs(body) is not None
    for dtype in FLOATS:
        with pytest.raises(BadInput):
            parse_body(body, dtype)
        assert_same(body, dtype)


@pytest.mark.parametrize("body", OVERFLOWING)
def test_a_number_the_model_dtype_cannot_hold_falls_back_to_the_same_error(body):
    assert_same(body, np.dtype(np.float16))
    assert_same(body, np.dtype(np.float32))
    assert assert_same(body, np.dtype(np.float64)) == "fast"


@pytest.mark.parametrize("body", [FAST_BODIES[0], FAST_BODIES[8], FAST_BODIES[9], FAST_BODIES[10], ROW[:300] + b"]}"])
def test_every_truncation_of_a_valid_body_ends_as_json_loads(body):
    for cut in range(len(body)):
        assert _core.parse_json_inputs(body[:cut]) is None or body[:cut].rstrip().endswith(b"}")
        assert_same(body[:cut], np.dtype(np.float32))


def test_integer_models_never_take_the_fast_path():
    body = body_of("[1, 2, 3]")
    for dtype in (np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.bool_), None):
        assert parse_body(body, dtype) == parse_body(body) == {"inputs": [1, 2, 3]}


def random_number_text(r: random.Random) -> str:
    """Number text of every form JSON allows, with up to 25 digits and exponents to +-330."""
    sign = r.choice(["", "-"])
    whole = r.choice(["0", str(r.randrange(1, 10)) + "".join(r.choice("0123456789") for _ in range(r.randrange(0, 20)))])
    fraction = r.choice(["", "." + "".join(r.choice("0123456789") for _ in range(r.randrange(1, 25)))])
    exponent = r.choice(["", "", f"{r.choice('eE')}{r.choice(['', '+', '-'])}{r.randrange(0, 331)}"])
    return sign + whole + fraction + exponent


def python_value(text: str) -> float | None:
    """What json.loads makes of `text`, as the float64 NumPy would hold; None when the fast
    path must refuse it (past float64, or an int >= 2**53)."""
    value = json.loads(text)
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else None
    return value if math.isfinite(value) else None


def test_numbers_are_correctly_rounded_as_pythons_float():
    r = random.Random(1)
    texts = [random_number_text(r) for _ in range(20000)]
    texts += [repr(struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0]) for _ in range(5000)]
    texts = [t for t in texts if t not in ("nan", "-nan", "inf", "-inf")]
    texts += ["2.2250738585072011e-308", "2.2250738585072012e-308", "4.9406564584124654e-324",
              "2.4703282292062327e-324", "2.4703282292062328e-324", "1.7976931348623158e308",
              "1.7976931348623159e308", "9007199254740993e0", "0.1e1", "10e-1", "123456789012345678e-18"]
    for text in texts:
        want = python_value(text)
        got = _core.parse_json_inputs(body_of(f"[{text}]"))
        if want is None:
            assert got is None, text
        else:
            assert got is not None, text
            assert struct.pack("<d", got[0][0]) == struct.pack("<d", want), (text, got[0][0], want)


def hard_number_texts(r: random.Random, n: int) -> list[str]:
    """Texts of every conversion path: shortest reprs of random doubles of any magnitude (17
    digits: Eisel-Lemire), their 15- and 9-digit roundings, float32 reprs, subnormals, exact
    halfway points between neighbouring doubles written out in full (and a digit past them),
    19/20-digit mantissas (the truncation check), huge exponents, negative zeros."""
    texts = []
    for _ in range(n):
        x = struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0]
        if not math.isfinite(x):
            continue
        y = math.nextafter(x, math.inf)
        half = (Decimal(x) + Decimal(y)) / 2 if math.isfinite(y) else Decimal(x)
        texts += [repr(x), f"{x:.15e}", f"{x:.8e}", repr(float(np.float32(r.uniform(-1e4, 1e4)))),
                  f"{half:e}" if len(f"{half:e}") < 120 else f"{x:.16e}", f"{half:.19e}", f"{half:.20e}",
                  f"{r.getrandbits(64)}e{r.randrange(-360, 330)}", f"{r.randrange(1, 10)}e-{r.randrange(300, 330)}"]
    return texts + ["-0.0", "-0e0", "-0.000e-999", "0e99999", "1e-99999", "4.9e-324", "2.4703282292062328e-324",
                    "2.4703282292062327e-324", "1.7976931348623157e308", "17976931348623158e292", "1.1754943508222875e-38",
                    "3.4028235677973366e38", "1.0000000596046448", "0.1" + "0" * 30 + "1", "9" * 19 + "e-19",
                    "9" * 20 + "e-20", "18446744073709551615e0", "18446744073709551616.5"]


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), np.dtype(np.float32)])
def test_hard_numbers_match_pythons_float_and_numpys_cast_bit_for_bit(dtype):
    # float32: the value NumPy gives the nested list (np.float32(float(text)), and also
    # np.float32(text)): the correctly rounded double, cast.
    texts = hard_number_texts(random.Random(5), 4000)
    for start in range(0, len(texts), 500):
        chunk = texts[start:start + 500]
        with np.errstate(over="ignore"):  # past float32: json.loads's path refuses those
            want = np.array([float(t) for t in chunk]).astype(dtype)
        finite = np.isfinite(want)
        chunk = [t for t, ok in zip(chunk, finite) if ok]
        got = parse_body(body_of("[" + ", ".join(chunk) + "]"), dtype)["inputs"]
        assert isinstance(got, np.ndarray), "the fast path read the chunk"
        want = want[finite]
        wrong = [(t, g, w) for t, g, w in zip(chunk, got.tolist(), want.tolist())
                 if struct.pack("<d", g) != struct.pack("<d", w)]
        assert wrong == []
        assert got.tobytes() == want.tobytes()
        if dtype == np.float32:
            assert got.tobytes() == np.array([np.float32(t) for t in chunk]).tobytes()


def test_large_bodies_are_parsed_with_the_gil_released_by_many_threads_at_once():
    bodies = [json.dumps({"inputs": np.random.default_rng(i).standard_normal((8, 784)).tolist()}).encode()
              for i in range(8)]
    want = [np.array(json.loads(b)["inputs"]) for b in bodies]
    errors = []

    def work(i: int) -> None:
        for _ in range(50):
            x, rest = _core.parse_json_inputs(bodies[i])
            if rest != {} or x.tobytes() != want[i].tobytes():
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_binding_takes_only_bytes_and_owns_its_array():
    with pytest.raises(TypeError, match="bytes"):
        _core.parse_json_inputs('{"inputs": [1]}')  # type: ignore[arg-type]
    x, rest = _core.parse_json_inputs(b'{"inputs": [[1, 2]], "id": "a"}')
    assert x.dtype == np.float64 and x.shape == (1, 2) and x.flags.c_contiguous and rest == {"id": b'"a"'}
    del rest
    assert x.sum() == 3.0


def test_a_bad_body_still_raises_bad_input_with_the_json_message():
    with pytest.raises(BadInput, match="not valid JSON"):
        parse_body(body_of("[1,]"), np.dtype(np.float32))


TOKENS = [b"[", b"]", b"{", b"}", b",", b":", b'"', b"\\", b"-", b"0", b"1", b".", b"e", b"E+", b"1e999", b" ",
          b"\n", b"null", b"true", b'"inputs"', b'"id"', b"\\u00e9", b"\xc3\xa9", b"\xff", b"\x00", b"9" * 17]


def mutate(r: random.Random, body: bytes) -> bytes:
    """One to three random edits: a byte flipped, a token inserted, a span cut or doubled."""
    for _ in range(r.randrange(1, 4)):
        at = r.randrange(len(body) + 1)
        edit = r.randrange(4)
        if edit == 0 and body:
            at = min(at, len(body) - 1)
            body = body[:at] + bytes([r.randrange(256)]) + body[at + 1:]
        elif edit == 1:
            body = body[:at] + r.choice(TOKENS) + body[at:]
        elif edit == 2:
            body = body[:at] + body[at + r.randrange(1, 8):]
        else:
            end = min(len(body), at + r.randrange(1, 12))
            body = body[:end] + body[at:end] + body[end:]
    return body


def test_random_mutations_of_the_bodies_end_as_json_loads():
    r = random.Random(3)
    seeds = [b for b in FAST_BODIES + SLOW_BODIES + REFUSED_BY_CHECKS if len(b) < 400]
    paths = set()
    for _ in range(4000):
        body = mutate(r, r.choice(seeds))
        paths.add(assert_same(body, FLOATS[r.randrange(3)]))
    assert paths == {"fast", "slow"}


@pytest.mark.parametrize("body", [b'{"inputs": [1e400, 2]}', b'{"inputs": [-1e400, 2]}', b'{"inputs": [1.0, 1e309]}',
                                  b'{"inputs": [[1, 2], [3, 1e400]]}', b'{"inputs": 1e400}',
                                  b'{"inputs": {"a": [1e400], "b": [1]}}'])
@pytest.mark.parametrize("dtype", [None, *FLOATS])
def test_a_number_past_float64s_range_is_refused_not_read_as_inf(body, dtype):
    # JSON 1e400 overflows every float: the C parser hands it to json.loads, which made it
    # inf, and the job ran on inf (its result came back as nulls) where 1e39 got a 400.
    with pytest.raises(BadInput, match="too large for any float"):
        parse_body(body, dtype)


def test_a_timeout_past_float64s_range_is_refused():
    with pytest.raises(BadInput, match="timeout_s"):
        parse_body(b'{"inputs": [1.0], "timeout_s": 1e400}', np.dtype(np.float32))


def test_the_power_of_ten_table_is_what_its_generator_writes():
    # csrc/serve/json_pow10.inc is generated (tools/gen_json_pow10.py); an edit by hand, or a
    # generator changed without regenerating, would round numbers wrongly
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    table = os.path.join(root, "csrc", "serve", "json_pow10.inc")
    if not os.path.exists(table):
        pytest.skip("no C sources here (an installed wheel)")
    written = subprocess.run([sys.executable, os.path.join(root, "tools", "gen_json_pow10.py")], check=True,
                             capture_output=True, text=True).stdout
    with open(table) as f:
        assert f.read() == written
