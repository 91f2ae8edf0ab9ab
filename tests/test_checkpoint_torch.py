"""fastloop.Checkpointer with torch state: a model and its optimizer (SGD, Adam, AdamW) resume
bit-exactly, every dtype torch has round-trips, nothing is pickled."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import fastloop

torch = pytest.importorskip("torch")


def make_model() -> "torch.nn.Module":
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.8, 0.99), amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def train(model, optimizer, steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_model_and_optimizer_resume_bit_exactly(tmp_path, name):
    straight = make_model()
    straight_opt = OPTIMIZERS[name](straight.parameters())
    train(straight, straight_opt, range(10))

    model = make_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    train(model, optimizer, range(5))
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "epoch": 5}, 5)
        state = ckpt.load()  # right after save(): waits for the write
    assert state["optim"]["param_groups"] == optimizer.state_dict()["param_groups"]  # every field
    step_counter = state["optim"]["state"][0].get("step")
    if step_counter is not None:
        assert isinstance(step_counter, torch.Tensor) and step_counter.dtype == torch.float32

    resumed = make_model()
    with torch.no_grad():
        for p in resumed.parameters():
            p.add_(1.0)  # fresh objects that differ until the state is loaded
    resumed.load_state_dict(state["model"])
    resumed_opt = OPTIMIZERS[name](resumed.parameters())
    resumed_opt.load_state_dict(state["optim"])
    train(resumed, resumed_opt, range(5, 10))
    for (key, want), got in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(want, got), key
    assert state["epoch"] == 5


def test_every_dtype_round_trips_bit_exactly_with_its_structure(tmp_path):
    tensors = {str(dtype): torch.randn(3, 5).to(dtype) for dtype in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
        torch.float8_e5m2, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
        torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64, torch.complex128)}
    state = {"t": tensors, "scalar_bf16": torch.tensor(1.5, dtype=torch.bfloat16),
             "view": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous
             "param": torch.nn.Parameter(torch.ones(2)), "pair": (torch.zeros(1), [1, None])}
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 1)
        back = ckpt.load(map_location="cpu")
    for key, want in tensors.items():
        got = back["t"][key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), key
    assert back["scalar_bf16"].dtype == torch.bfloat16 and back["scalar_bf16"].item() == 1.5
    assert back["scalar_bf16"].shape == ()
    assert torch.equal(back["view"], state["view"])
    assert back["param"].requires_grad and type(back["pair"]) is tuple and back["pair"][1] == [1, None]


def test_state_dict_keeps_its_type_and_metadata_and_map_location_moves_tensors(tmp_path):
    model = make_model()
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save({"model": model.state_dict()}, 1)
        back = ckpt.load(map_location=lambda tensor, saved: tensor.to(torch.float64))
    assert type(back["model"]) is OrderedDict
    assert back["model"]._metadata == model.state_dict()._metadata
    assert all(t.dtype == torch.float64 or not t.is_floating_point() for t in back["model"].values())
    assert ckpt.load(map_location=torch.device("cpu"))["model"]["0.weight"].device.type == "cpu"


def test_a_bad_leaf_is_refused_with_its_path(tmp_path):
    with fastloop.Checkpointer(tmp_path) as ckpt:
        sparse = torch.eye(3).to_sparse()
        with pytest.raises(TypeError, match=r"state\['optim'\]\['w'\] is a torch.sparse_coo tensor"):
            ckpt.save({"optim": {"w": sparse}}, 1)
        with pytest.raises(TypeError, match=r"state\['m'\] is a torch.nn.modules.linear.Linear"):
            ckpt.save({"m": torch.nn.Linear(2, 2)}, 1)


def test_periodic_saves_of_a_model_trained_in_another_thread_each_hold_one_step(tmp_path):
    import threading

    model = make_model()
    optimizer = OPTIMIZERS["adam"](model.parameters())
    sums: dict[int, list[float]] = {}  # the parameters' sums after each step, as trained

    def loop() -> None:
        with fastloop.Checkpointer(tmp_path, keep=1000, every_s=0.001) as ckpt:
            step = 0
            while len(ckpt.checkpoints()) < 4 and step < 100_000:
                step += 1
                train(model, optimizer, range(step, step + 1))
                sums[step] = [float(p.detach().sum()) for p in model.parameters()]
                ckpt.maybe_save(lambda: {"model": model.state_dict(), "optim": optimizer.state_dict(),
                                         "step": step}, step)
                ckpt.wait()

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    checkpoints = fastloop.Checkpointer(tmp_path).checkpoints()
    assert len(checkpoints) >= 4
    for checkpoint in checkpoints:
        state = fastloop.read_checkpoint(checkpoint.path)
        saved = [float(state["model"][name].sum()) for name, _ in model.named_parameters()]
        assert state["step"] == checkpoint.step and saved == sums[checkpoint.step], checkpoint


NUMPY_ONLY_LOAD = """
import sys
sys.modules["torch"] = None  # torch not importable
import numpy as np, fastloop
state = fastloop.read_checkpoint(sys.argv[1])
assert isinstance(state["w"], np.ndarray) and state["w"].dtype == np.float32, state["w"].dtype
assert state["w"].tolist() == [1.5, -2.0, 0.25]
assert state["i"].dtype == np.int64 and state["n"] == 3
print("ok")
"""


def test_without_torch_tensors_load_as_numpy_and_bfloat16_as_float32(tmp_path):
    import subprocess
    import sys

    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save({"w": torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16),
                   "i": torch.arange(3), "n": 3}, 1)
    out = subprocess.run([sys.executable, "-c", NUMPY_ONLY_LOAD, ckpt.latest().path],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def make_cnn() -> "torch.nn.Module":
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


def trained_cnn_and_adam(steps: int = 3) -> tuple:
    model = make_cnn()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 3, 16, 16, generator=generator), torch.randint(0, 10, (4,), generator=generator)
        adam.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        adam.step()
    return model, adam


def assert_bit_exact(got, want, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got.view(torch.uint8) if got.dim() else got.reshape(1).view(torch.uint8),
                       want.view(torch.uint8) if want.dim() else want.reshape(1).view(torch.uint8)), what


def test_a_cnn_and_adam_state_is_bit_exact_through_safetensors_and_load(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model, adam = trained_cnn_and_adam()
    half = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}  # bf16 stays bf16
    state = {"model": model.state_dict(), "optim": adam.state_dict(), "half": half, "epoch": 2,
             "loader": {"epoch": 2, "position": 128, "seed": 7}}
    with fastloop.Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 3)
        path = ckpt.latest().path
        loaded = ckpt.load()
    tensors = safetensors_torch.load_file(path)  # no fastloop involved in reading
    expected = {f"model.{k}": v for k, v in model.state_dict().items()}
    expected.update({f"half.{k}": v for k, v in half.items()})
    for index, buffers in adam.state_dict()["state"].items():
        expected.update({f"optim.state.{index}.{k}": v for k, v in buffers.items()})
    assert set(tensors) == set(expected)
    for name, want in expected.items():
        assert_bit_exact(tensors[name], want, name)
    assert tensors["half.0.weight"].dtype == torch.bfloat16
    for name, want in model.state_dict().items():
        assert_bit_exact(loaded["model"][name], want, name)
    for index, buffers in adam.state_dict()["state"].items():
        for key, want in buffers.items():
            assert_bit_exact(loaded["optim"]["state"][index][key], want, f"optim {index} {key}")
    assert loaded["optim"]["param_groups"] == adam.state_dict()["param_groups"]
    assert loaded["loader"] == {"epoch": 2, "position": 128, "seed": 7} and loaded["epoch"] == 2
    resumed, resumed_adam = make_cnn(), None
    resumed.load_state_dict(loaded["model"])
    resumed_adam = torch.optim.Adam(resumed.parameters(), lr=1e-3, amsgrad=True)
    resumed_adam.load_state_dict(loaded["optim"])  # torch accepts both back as they are
