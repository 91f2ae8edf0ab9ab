"""examples/quickstart.ipynb runs top to bottom on a real Jupyter kernel, including a
kernel interrupt (the notebook's Stop button) in the middle of a processes-mode Loader loop:
the cell ends in KeyboardInterrupt, no worker process is left, the kernel lives on and the
cells after it run."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"
KERNEL = "fastloop-test-python"  # a kernelspec of our own: the kernel runs this interpreter
MARKER = re.compile(r"workers \[(\d+), (\d+)\] running")
CELL_TIMEOUT = 40  # seconds any one cell may take (nbclient fails the test past it)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (zombies included: a worker not reaped counts as left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec running sys.executable, found first through JUPYTER_PATH; the kernel's
    IPython profile, temporary files (the notebook's logs) and connection files under
    tmp_path. Returns the kernel's working directory."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fastloop test", "language": "python", "interrupt_mode": "signal",
        "env": {"IPYTHONDIR": str(tmp_path / "ipython"), "TMPDIR": str(tmp_path / "tmp")},
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    (tmp_path / "tmp").mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    return work


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


async def interrupt_when_looping(client, cell, kernel_pid: int) -> tuple[list[int], list[int]]:
    """Waits for the interrupt cell's marker, checks its workers are the kernel's children,
    lets it loop a little longer and interrupts the kernel. Returns (printed pids, children)."""
    deadline = time.monotonic() + 20
    while not (match := MARKER.search(text_of(cell))):
        assert time.monotonic() < deadline, f"no marker within 20 s; output: {cell.outputs}"
        await asyncio.sleep(0.05)
    pids = [int(p) for p in match.groups()]
    await asyncio.sleep(1.0)  # well inside the loop: workers busy, batches flowing
    running = children(kernel_pid)
    await client.km.interrupt_kernel()
    return pids, running


async def run_notebook(nb, cwd: Path) -> dict:
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT, startup_timeout=60,
                                     resources={"metadata": {"path": str(cwd)}})
    client.reset_execution_trackers()
    seen: dict = {}
    async with client.async_setup_kernel():
        kernel_pid = client.km.provisioner.pid
        for index, cell in enumerate(nb.cells):
            if "raises-exception" not in cell.metadata.get("tags", []):
                await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                continue
            # The "interrupt me" cell: run it, interrupt it, and see what is left.
            run = asyncio.ensure_future(
                client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1))
            watch = asyncio.ensure_future(interrupt_when_looping(client, cell, kernel_pid))
            done, _ = await asyncio.wait([run, watch], return_when=asyncio.FIRST_COMPLETED)
            if watch not in done:
                watch.cancel()
                run.result()  # raises what nbclient raised, if anything
                pytest.fail(f"the cell ended before the interrupt: {cell.outputs}")
            if watch.exception() is not None:
                run.cancel()
                raise watch.exception()
            seen["pids"], seen["running"] = watch.result()
            await asyncio.wait_for(run, 20)  # the cell ends within seconds of the interrupt
            seen["left"] = children(kernel_pid)
            seen["alive"] = await client.km.is_alive()
            seen["index"] = index
            check_interrupted(cell, seen)
    return seen


def check_interrupted(cell, seen: dict) -> None:
    """The interrupted cell ended in a KeyboardInterrupt, its two workers were the kernel's
    children while it looped and none is left (reaped: no zombie either); the kernel lives."""
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["KeyboardInterrupt"], cell.outputs
    assert set(seen["pids"]) <= set(seen["running"]), seen
    assert seen["left"] == [], f"processes left after the interrupt: {seen}"
    assert seen["alive"], "the kernel died"


def test_quickstart_notebook_runs_and_survives_an_interrupt(kernel_env):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    start = time.monotonic()
    seen = asyncio.run(asyncio.wait_for(run_notebook(nb, kernel_env), 100))
    took = time.monotonic() - start
    assert "left" in seen, "the notebook has no cell tagged raises-exception to interrupt"

    # Every other code cell ran without an error (nbclient raises otherwise), and said so.
    later = "".join(text_of(c) for c in nb.cells[seen["index"] + 1:] if c.cell_type == "code")
    assert "still alive: []" in later and "after break alive: []" in later, later
    out = "".join(text_of(c) for c in nb.cells if c.cell_type == "code")
    assert "threads + C pipeline:" in out and "processes + Python transform:" in out
    assert "ImageFolder: 512 files, classes {'blue': 0, 'red': 1}" in out
    assert re.search(r"JPEG files, decoded in C threads: [\d,]+ samples/s; batches: x \(128, 3, 16, 16\) float32", out), out
    assert re.search(r"step +0  loss", out), out  # the CallbackSink's live lines reach the cell
    assert "validation accuracy:" in out
    assert took < 60, f"the notebook took {took:.1f} s"
