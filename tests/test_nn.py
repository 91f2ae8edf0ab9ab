"""fastloop.nn on the CPU: forward, gradients (finite differences in float64 and torch in
float32), optimizers against torch's, state_dict interop, bad inputs, threads, checkpoints."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import fastloop as fl
from fastloop import nn

try:
    import torch
except ImportError:  # torch is an optional extra
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def mlp(sizes, dtype=np.float32, seed=0, flatten=False):
    nn.manual_seed(seed)
    layers = [nn.Flatten()] if flatten else []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers, dtype=dtype)


def numpy_forward(state, x, relu_after):
    """Reference forward in float64 from a state_dict."""
    h = x.astype(np.float64)
    keys = [k for k in state if k.endswith("weight")]
    for i, key in enumerate(keys):
        h = h @ state[key].astype(np.float64).T + state[key.replace("weight", "bias")].astype(np.float64)
        if i < relu_after:
            h = np.maximum(h, 0)
    return h


def reference_loss(model, x, y, loss):
    out = model(x).astype(np.float64)
    if loss == "mse":
        return float(np.mean((out - y) ** 2))
    shifted = out - out.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def batch(rng, rows, model, loss, dtype=np.float32):
    x = rng.standard_normal((rows, model.in_features)).astype(dtype)
    if loss == "mse":
        y = rng.standard_normal((rows, model.out_features)).astype(dtype)
    else:
        y = rng.integers(0, model.out_features, rows)
    return x, y


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sizes", [(3, 1), (10, 7, 2), (33, 64, 17, 5)])
def test_forward_matches_numpy(dtype, sizes):
    model = mlp(sizes, dtype)
    x = np.random.default_rng(1).standard_normal((9, sizes[0])).astype(dtype)
    expected = numpy_forward(model.state_dict(), x, len(sizes) - 2)
    out = model(x)
    assert out.dtype == dtype and out.shape == (9, sizes[-1])
    np.testing.assert_allclose(out, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6 if dtype == np.float32 else 1e-12)


def test_forward_one_row_flatten_and_empty_batch():
    model = mlp((12, 4, 3), flatten=True)
    x = np.random.default_rng(2).standard_normal((5, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(model(x), model(x.reshape(5, 12)))
    single = mlp((6, 2))
    row = np.arange(6, dtype=np.float32)
    assert single(row).shape == (2,)
    np.testing.assert_allclose(single(row), single(row[None])[0])
    assert single(np.zeros((0, 6), np.float32)).shape == (0, 2)


def test_initialization_is_torch_default_and_seeded():
    nn.manual_seed(5)
    a = nn.Linear(100, 50)
    nn.manual_seed(5)
    b = nn.Linear(100, 50)
    np.testing.assert_array_equal(a.weight, b.weight)
    assert a.weight.shape == (50, 100) and a.bias.shape == (50,)
    assert np.abs(a.weight).max() <= 0.1 and np.abs(a.weight).max() > 0.09  # U(-1/sqrt(100), 1/sqrt(100))
    assert nn.Linear(3, 2, bias=False).bias is None


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("sizes", [(4, 3), (5, 7, 3), (6, 8, 5, 4)])
def test_gradients_match_finite_differences_float64(loss, sizes):
    model = mlp(sizes, np.float64, seed=3)
    rng = np.random.default_rng(4)
    x, y = batch(rng, 6, model, loss, np.float64)
    value = model.backward(x, y, loss=loss)
    assert value == pytest.approx(reference_loss(model, x, y, loss), rel=1e-12)
    grads = model.grads()
    state = model.state_dict()
    eps = 1e-6
    for name, param in state.items():
        numeric = np.zeros_like(param)
        for index in np.ndindex(param.shape):
            for sign in (1, -1):
                shifted = {k: v.copy() for k, v in state.items()}
                shifted[name][index] += sign * eps
                model.load_state_dict(shifted)
                numeric[index] += sign * reference_loss(model, x, y, loss) / (2 * eps)
        model.load_state_dict(state)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def to_torch(model):
    layers = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layers.append(torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.has_bias))
        elif isinstance(layer, nn.ReLU):
            layers.append(torch.nn.ReLU())
        else:
            layers.append(torch.nn.Flatten())
    reference = torch.nn.Sequential(*layers).to(torch.float64 if model.dtype == np.float64 else torch.float32)
    reference.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return reference


def torch_loss(out, y, loss):
    if loss == "mse":
        return torch.nn.functional.mse_loss(out, torch.from_numpy(y))
    return torch.nn.functional.cross_entropy(out, torch.from_numpy(np.asarray(y, np.int64)))


@needs_torch
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("seed", range(4))
def test_gradients_match_torch_float32(loss, seed):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(v) for v in rng.integers(1, 70, rng.integers(2, 5)))
    if loss == "cross_entropy":
        sizes = sizes[:-1] + (max(sizes[-1], 2),)
    model = mlp(sizes, seed=seed)
    x, y = batch(rng, int(rng.integers(1, 40)), model, loss)
    reference = to_torch(model)
    expected = torch_loss(reference(torch.from_numpy(x)), y, loss)
    expected.backward()
    assert model.backward(x, y, loss=loss) == pytest.approx(expected.item(), rel=1e-5)
    for (name, grad), (tname, tparam) in zip(model.grads().items(), reference.named_parameters()):
        assert name == tname
        scale = max(np.abs(tparam.grad.numpy()).max(), 1e-6)
        np.testing.assert_allclose(grad, tparam.grad.numpy(), rtol=1e-5, atol=1e-5 * scale, err_msg=name)


# ---------------------------------------------------------------- optimizers


OPTIMIZERS = [
    ("sgd", dict(lr=0.05)),
    ("sgd", dict(lr=0.05, momentum=0.9)),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", dict(lr=0.01)),
    ("adam", dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)),
    ("adamw", dict(lr=0.01, weight_decay=0.1)),
]


def make_optimizers(kind, model, reference, kwargs):
    ours = {"sgd": nn.SGD, "adam": nn.Adam, "adamw": nn.AdamW}[kind](model, **kwargs)
    theirs = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind](
        reference.parameters(), **kwargs
    )
    return ours, theirs


@needs_torch
@pytest.mark.parametrize("kind,kwargs", OPTIMIZERS)
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_training_matches_torch(kind, kwargs, loss):
    model = mlp((20, 32, 16, 4), seed=7)
    reference = to_torch(model)
    ours, theirs = make_optimizers(kind, model, reference, kwargs)
    rng = np.random.default_rng(8)
    for _ in range(8):
        x, y = batch(rng, 16, model, loss)
        theirs.zero_grad()
        expected = torch_loss(reference(torch.from_numpy(x)), y, loss)
        expected.backward()
        theirs.step()
        assert model.train_step(x, y, loss=loss, opt=ours) == pytest.approx(expected.item(), rel=1e-4)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, reference.state_dict()[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    assert ours.steps == 8


@needs_torch
@pytest.mark.parametrize("kind,kwargs", [OPTIMIZERS[1], OPTIMIZERS[3]])
def test_optimizer_state_round_trips_with_torch(kind, kwargs):
    model = mlp((6, 5, 3), seed=9)
    reference = to_torch(model)
    ours, theirs = make_optimizers(kind, model, reference, kwargs)
    rng = np.random.default_rng(10)
    for _ in range(3):
        x, y = batch(rng, 8, model, "mse")
        theirs.zero_grad()
        torch_loss(reference(torch.from_numpy(x)), y, "mse").backward()
        theirs.step()
        model.train_step(x, y, "mse", ours)
    # torch's state loads into a fresh fastloop optimizer and vice versa; training goes on equal.
    fresh_model = mlp((6, 5, 3), seed=11)
    fresh_model.load_state_dict(reference.state_dict())
    fresh = {"sgd": nn.SGD, "adam": nn.Adam}[kind](fresh_model, **kwargs)
    fresh.load_state_dict(theirs.state_dict())
    assert fresh.steps == (3 if kind == "adam" else 1)  # torch's SGD state keeps no step count
    mine = ours.state_dict()
    assert list(mine["state"]) == list(range(4)) and mine["param_groups"][0]["lr"] == kwargs["lr"]
    x, y = batch(rng, 8, model, "mse")
    theirs.zero_grad()
    torch_loss(reference(torch.from_numpy(x)), y, "mse").backward()
    theirs.step()
    fresh_model.train_step(x, y, "mse", fresh)
    for name, value in fresh_model.state_dict().items():
        np.testing.assert_allclose(value, reference.state_dict()[name].numpy(), rtol=1e-4, atol=1e-6)


def test_backward_then_step_equals_train_step_and_set_grads():
    a, b = mlp((8, 6, 2), seed=12), mlp((8, 6, 2), seed=12)
    opt_a, opt_b = nn.SGD(a, lr=0.1, momentum=0.5), nn.SGD(b, lr=0.1, momentum=0.5)
    rng = np.random.default_rng(13)
    for _ in range(3):
        x, y = batch(rng, 10, a, "cross_entropy")
        loss_a = a.train_step(x, y, loss="cross_entropy", opt=opt_a)
        loss_b = b.backward(x, y, loss="cross_entropy")
        b.set_grads({k: v for k, v in b.grads().items()})  # an all-reduce would go here
        opt_b.step()
        assert loss_a == loss_b
    for (_, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(va, vb)


def test_learning_rate_can_change_between_steps():
    model = mlp((3, 1), seed=14)
    opt = nn.SGD(model, lr=0.0)
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
    before = model.state_dict()
    model.train_step(x, y, opt=opt)
    np.testing.assert_array_equal(model.state_dict()["0.weight"], before["0.weight"])
    opt.lr = 0.1
    model.train_step(x, y, opt=opt)
    assert not np.array_equal(model.state_dict()["0.weight"], before["0.weight"])
    with pytest.raises(ValueError, match="lr"):
        opt.lr = -1


# ---------------------------------------------------------------- state_dict


def test_state_dict_names_shapes_and_standalone_linear():
    model = mlp((5, 4, 3, 2))
    assert [(k, v.shape) for k, v in model.state_dict().items()] == [
        ("0.weight", (4, 5)), ("0.bias", (4,)), ("2.weight", (3, 4)), ("2.bias", (3,)), ("4.weight", (2, 3)), ("4.bias", (2,)),
    ]
    assert model.num_parameters() == 4 * 5 + 4 + 3 * 4 + 3 + 2 * 3 + 2
    np.testing.assert_array_equal(model[2].weight, model.state_dict()["2.weight"])
    flat = mlp((12, 2), flatten=True)
    assert list(flat.state_dict()) == ["1.weight", "1.bias"]
    lone = nn.Linear(10, 1)
    assert list(lone.state_dict()) == ["weight", "bias"]
    opt = nn.SGD(lone, lr=0.1)
    x = np.random.default_rng(0).standard_normal((32, 10)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    first = lone.train_step(x, y, loss="mse", opt=opt)
    for _ in range(200):
        last = lone.train_step(x, y, loss="mse", opt=opt)
    assert last < first * 0.01
    with pytest.raises(ValueError, match="already belongs"):
        nn.Sequential(lone)


def test_load_state_dict_checks_names_and_shapes_before_writing():
    model = mlp((4, 3, 2))
    good = model.state_dict()
    with pytest.raises(KeyError, match="missing.*2.bias"):
        model.load_state_dict({k: v for k, v in good.items() if k != "2.bias"})
    with pytest.raises(KeyError, match="unexpected.*'extra'"):
        model.load_state_dict({**good, "extra": np.zeros(1)})
    bad = {**good, "0.weight": np.zeros((3, 4)) + 7, "2.weight": np.zeros((3, 3))}
    with pytest.raises(ValueError, match=r"2.weight has shape \(3, 3\), the model's is \(2, 3\)"):
        model.load_state_dict(bad)
    np.testing.assert_array_equal(model.state_dict()["0.weight"], good["0.weight"])  # nothing written
    model.load_state_dict({"0.bias": np.ones(3)}, strict=False)
    np.testing.assert_array_equal(model.state_dict()["0.bias"], np.ones(3, np.float32))


def test_optimizer_state_buffer_outside_the_optimizers_raises_naming_it():
    model = mlp((3, 2))
    opt = nn.SGD(model, lr=0.1, momentum=0.9)  # one buffer per parameter
    model.train_step(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), loss="mse", opt=opt)
    velocity = opt._opt.get_state(0, 0)
    assert velocity.any()
    with pytest.raises(ValueError, match=r"optimizer state: state buffer 1 is outside \[0, 1\)") as error:
        opt._opt.get_state(0, 1)
    assert error.value.code < 0  # the core's code, raised through the table
    with pytest.raises(ValueError, match=r"state buffer -1 is outside \[0, 1\)"):
        opt._opt.set_state(0, -1, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(opt._opt.get_state(0, 0), velocity)  # nothing written


def test_the_private_bindings_name_a_wrong_argument():
    """nn's C calls parse by declaration: keywords work, and a wrong argument is named."""
    model = mlp((3, 2))
    opt = nn.SGD(model, lr=0.1, momentum=0.9)
    core = type(opt._opt)
    with pytest.raises(TypeError, match="argument 'model' must be a _Model"):
        core(model=[], kind=0, hyper={})
    with pytest.raises(TypeError, match="argument 'hyper' must be a dict"):
        core(model._model, 0, [("lr", 0.1)])
    with pytest.raises(TypeError, match=r"get_state\(\) missing required argument 'which'"):
        opt._opt.get_state(0)
    velocity = np.full((2, 3), 0.5, np.float32)
    opt._opt.set_state(index=0, which=0, array=velocity)
    np.testing.assert_array_equal(opt._opt.get_state(which=0, index=0), velocity)
    with pytest.raises(TypeError, match=r"set_param\(\) .*'weights'"):
        model._model.set_param(0, weights=velocity)
    model._model.set_param(index=0, value=velocity)
    np.testing.assert_array_equal(model._model.get_param(0), velocity)


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_clear_errors():
    model = mlp((4, 3, 2))
    opt = nn.SGD(model, lr=0.1)
    x = np.zeros((5, 4), np.float32)
    with pytest.raises(TypeError, match="x has dtype float64, the model computes in float32"):
        model(np.zeros((5, 4)))
    with pytest.raises(ValueError, match=r"x has shape \(5, 3\), the model takes \(batch, 4\)"):
        model(np.zeros((5, 3), np.float32))
    with pytest.raises(TypeError, match="integer class labels"):
        model.train_step(x, np.zeros(5, np.float32), loss="cross_entropy", opt=opt)
    with pytest.raises(ValueError, match=r"y has shape \(4,\), expected \(5,\)"):
        model.train_step(x, np.zeros(4, np.int64), loss="cross_entropy", opt=opt)
    with pytest.raises(ValueError, match=r"expected \(5, 2\) for mse"):
        model.train_step(x, np.zeros((5, 3), np.float32), loss="mse", opt=opt)
    with pytest.raises(ValueError, match="loss must be one of"):
        model.train_step(x, np.zeros((5, 2), np.float32), loss="hinge", opt=opt)
    with pytest.raises(TypeError, match="opt must be"):
        model.train_step(x, np.zeros((5, 2), np.float32), loss="mse", opt=None)
    with pytest.raises(ValueError, match="another model"):
        model.train_step(x, np.zeros((5, 2), np.float32), loss="mse", opt=nn.SGD(mlp((4, 3, 2)), lr=0.1))
    with pytest.raises(ValueError, match="at least one row"):
        model.train_step(x[:0], np.zeros(0, np.int64), loss="cross_entropy", opt=opt)


def test_bad_label_names_row_and_changes_nothing():
    model = mlp((4, 3, 2))
    opt = nn.SGD(model, lr=0.1, momentum=0.9)
    before = model.state_dict()
    labels = np.array([0, 1, 7, 1], np.int64)
    with pytest.raises(ValueError, match=r"label 7 at row 2 is outside \[0, 2\)"):
        model.train_step(np.ones((4, 4), np.float32), labels, loss="cross_entropy", opt=opt)
    with pytest.raises(ValueError, match=r"label -1 at row 0"):
        model.backward(np.ones((1, 4), np.float32), np.array([-1]), loss="cross_entropy")
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])
    assert opt.steps == 0


def test_bad_constructions():
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        nn.Linear(0, 3)
    with pytest.raises(ValueError, match="at least one layer"):
        nn.Sequential()
    with pytest.raises(ValueError, match="at least one Linear"):
        nn.Sequential(nn.ReLU())
    with pytest.raises(ValueError, match="Linear takes 5 features but the layer before gives 3"):
        nn.Sequential(nn.Linear(4, 3), nn.Linear(5, 2))
    with pytest.raises(ValueError, match="Flatten is supported as the first layer only"):
        nn.Sequential(nn.Linear(4, 3), nn.Flatten())
    with pytest.raises(TypeError, match="float32 or float64"):
        nn.Sequential(nn.Linear(4, 3), dtype=np.int32)
    with pytest.raises(ValueError, match="'device' must be"):
        nn.Sequential(nn.Linear(4, 3), device="tpu")
    with pytest.raises(ValueError, match="Nesterov"):
        nn.SGD(mlp((2, 1)), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        nn.Adam(mlp((2, 1)), betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="model itself"):
        nn.SGD([np.zeros(3)], lr=0.1)


def test_cuda_device_without_gpu_says_why():
    if fl.cuda.is_available():
        pytest.skip("a GPU is available: tests/test_cuda.py covers it")
    with pytest.raises(fl.CudaUnavailable, match="CUDA is not available: .+"):
        nn.Sequential(nn.Linear(4, 3), device="cuda")


def test_cuda_array_into_cpu_model_is_refused():
    class FakeCudaArray:
        __cuda_array_interface__ = {"shape": (2, 4), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(TypeError, match="CUDA array but the model is on the CPU"):
        mlp((4, 2))(FakeCudaArray())


# ---------------------------------------------------------------- threads


def test_train_step_releases_the_gil():
    model = mlp((512, 1024, 1024, 10), seed=15)
    opt = nn.SGD(model, lr=0.001)
    x, y = batch(np.random.default_rng(16), 2048, model, "cross_entropy")
    counted, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    deadline = time.monotonic() + 10
    while counted[0] < 100 and time.monotonic() < deadline:  # the counter is running
        time.sleep(0.001)
    start = counted[0]
    model.train_step(x, y, loss="cross_entropy", opt=opt)  # ~100+ ms of C
    during = counted[0] - start
    stop.set()
    counter.join()
    assert during > 1000, f"the counting thread ran {during} times during train_step"


def test_concurrent_calls_are_serialized_and_correct():
    model = mlp((16, 32, 4), seed=17)
    twin = mlp((16, 32, 4), seed=17)
    opt = nn.SGD(model, lr=0.01)
    rng = np.random.default_rng(18)
    x, y = batch(rng, 64, model, "cross_entropy")
    errors = []

    def train():
        try:
            for _ in range(50):
                model.train_step(x, y, loss="cross_entropy", opt=opt)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    def infer():
        try:
            for _ in range(100):
                assert np.isfinite(model(x)).all()
                model.state_dict()
        except Exception as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=train) for _ in range(2)] + [threading.Thread(target=infer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and opt.steps == 100
    twin_opt = nn.SGD(twin, lr=0.01)
    for _ in range(100):
        twin.train_step(x, y, loss="cross_entropy", opt=twin_opt)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, twin.state_dict()[name], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- checkpoints


def test_checkpointer_saves_and_resumes_training(tmp_path):
    rng = np.random.default_rng(19)
    model = mlp((8, 16, 3), seed=20)
    opt = nn.Adam(model, lr=0.01)
    batches = [batch(rng, 12, model, "cross_entropy") for _ in range(6)]
    for x, y in batches[:3]:
        model.train_step(x, y, loss="cross_entropy", opt=opt)
    with fl.Checkpointer(tmp_path, keep=2) as ckpt:
        state = {f"model/{k}": v for k, v in model.state_dict().items()}
        opt_state = opt.state_dict()["state"]
        state.update({f"opt/{i}/{name}": v for i, e in opt_state.items() for name, v in e.items() if name != "step"})
        ckpt.save(state, step=3)
        ckpt.wait()
        loaded = ckpt.load()
    resumed = mlp((8, 16, 3), seed=99)
    resumed.load_state_dict({k[len("model/"):]: v for k, v in loaded.items() if k.startswith("model/")})
    resumed_opt = nn.Adam(resumed, lr=0.01)
    entries: dict = {}
    for key, value in loaded.items():
        if key.startswith("opt/"):
            _, i, name = key.split("/")
            entries.setdefault(int(i), {"step": 3})[name] = value
    resumed_opt.load_state_dict({"state": entries, "param_groups": opt.state_dict()["param_groups"]})
    for x, y in batches[3:]:
        a = model.train_step(x, y, loss="cross_entropy", opt=opt)
        b = resumed.train_step(x, y, loss="cross_entropy", opt=resumed_opt)
        assert a == pytest.approx(b, rel=1e-6)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[name], value, rtol=1e-6, atol=1e-7)


def test_blas_is_reported():
    assert "sgemm" in nn.blas_info()


def test_training_state_round_trip():
    model, twin = mlp((6, 8, 3), seed=21), mlp((6, 8, 3), seed=22)
    opt, twin_opt = nn.AdamW(model, lr=0.01), nn.AdamW(twin, lr=0.5)
    rng = np.random.default_rng(23)
    x, y = batch(rng, 10, model, "cross_entropy")
    for _ in range(3):
        model.train_step(x, y, loss="cross_entropy", opt=opt)
    state = nn.training_state(model, opt, epoch=2, step=30)
    assert all(isinstance(v, np.ndarray) for v in state.values())
    progress = nn.load_training_state(state, twin, twin_opt)
    assert progress == {"epoch": 2, "step": 30}
    assert twin_opt.lr == 0.01 and twin_opt.steps == 3
    assert model.train_step(x, y, "cross_entropy", opt) == twin.train_step(x, y, "cross_entropy", twin_opt)
    with pytest.raises(ValueError, match="may not start with"):
        nn.training_state(model, opt, **{"model.x": 1})
    with pytest.raises(KeyError, match="no optimizer"):
        nn.load_training_state(nn.training_state(model), twin, twin_opt)


def test_set_blas_threads_keeps_results():
    model = mlp((64, 128, 4), seed=24)
    x = np.random.default_rng(25).standard_normal((300, 64)).astype(np.float32)
    before = model(x)
    nn.set_blas_threads(1)
    try:
        np.testing.assert_allclose(model(x), before, rtol=1e-5, atol=1e-6)
    finally:
        nn.set_blas_threads(2)
    with pytest.raises(ValueError, match="threads"):
        nn.set_blas_threads(0)


def test_reading_the_optimizer_while_another_thread_trains_waits_for_the_step():
    """lr, steps and state_dict() wait for the step in flight (the model's lock, GIL released)
    and always see whole steps."""
    model = mlp((256, 512, 10), seed=26)
    opt = nn.SGD(model, lr=0.001, momentum=0.9)
    x, y = batch(np.random.default_rng(27), 512, model, "cross_entropy")
    trainer = threading.Thread(target=lambda: [model.train_step(x, y, loss="cross_entropy", opt=opt) for _ in range(20)])
    trainer.start()
    seen = []
    while trainer.is_alive():
        opt.lr = opt.lr
        state = opt.state_dict()
        assert state["param_groups"][0]["momentum"] == 0.9
        seen.append(opt.steps)
    trainer.join()
    assert seen == sorted(seen) and opt.steps == 20
