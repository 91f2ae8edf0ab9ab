"""The GPU check's preflight (benchmarks/gpu_check.sh runs it first, in well under 20 s): is
everything the build and the GPU steps need here? Prints ONE line, "preflight ok: ..." (exit
status 0) or "preflight: missing ...: ..." naming every missing piece (exit status 1).

    python benchmarks/gpu_preflight.py            # a source build: Python.h, nvcc, JPEG headers too
    python benchmarks/gpu_preflight.py --wheel    # a wheel: only the driver and nvJPEG

Looked for: Python.h of this interpreter; nvcc in $CUDA_HOME/bin, $CUDA_PATH/bin, then PATH (as
setup.py looks); the driver (nvidia-smi lists a GPU, and libcuda.so.1 loads); a JPEG codec as
setup_codecs.py finds it (libjpeg-turbo's headers, and its libjpeg.a or a libjpeg.so.62); and
libnvjpeg in every place fastloop.cuda.load_nvjpeg() may load it from: $FASTLOOP_NVJPEG, the
toolkit's lib64 (beside nvcc), $CUDA_HOME and $CUDA_PATH, the nvidia-* wheels, torch's and
torchvision's lib folders, the system's linker cache. Nothing here imports torch (seconds).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVJPEG_NAMES = ("libnvjpeg.so*",)


def python_h() -> tuple[str | None, str]:
    include = sysconfig.get_paths()["include"]
    path = os.path.join(include, "Python.h")
    return (path, path) if os.path.exists(path) else (None, f"Python.h (not in {include}: the python3-dev package)")


def nvcc() -> tuple[str | None, str]:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc"), f"nvcc ${var}/bin"
    found = shutil.which("nvcc")
    if found:
        return found, f"nvcc {found}"
    return None, "nvcc (not in $CUDA_HOME/bin, $CUDA_PATH/bin or PATH)"


def driver() -> tuple[str | None, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "the driver (no nvidia-smi on PATH)"
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"the driver (nvidia-smi: {error})"
    gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not gpus:
        said = (out.stdout + out.stderr).strip().splitlines()
        return None, f"the driver (nvidia-smi: {said[0] if said else f'exit status {out.returncode}'})"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return None, f"the driver's libcuda.so.1 ({error})"
    return gpus[0], f"GPU {gpus[0]} ({len(gpus)} in all)"


def jpeg() -> tuple[str | None, str]:
    """The JPEG codec as setup.py builds it in (setup_codecs.py): the headers, then a library."""
    sys.path.insert(0, ROOT)
    try:
        import setup_codecs
    finally:
        sys.path.remove(ROOT)
    spec = setup_codecs.CODECS["jpeg"]
    include = setup_codecs.search_dirs(spec["packages"], "include")
    missing = [h for h in spec["headers"] if setup_codecs.find(h, include) is None]
    if missing:
        return None, f"a JPEG codec ({', '.join(missing)} not found: libjpeg-turbo's -dev package)"
    archive = setup_codecs.find("libjpeg.a", setup_codecs.search_dirs(spec["packages"], "lib"))
    if archive:
        return archive, f"JPEG {archive}"
    try:
        ctypes.CDLL("libjpeg.so.62")
    except OSError:
        return None, "a JPEG codec (jpeglib.h is here but neither libjpeg.a nor libjpeg.so.62)"
    return "libjpeg.so.62", "JPEG libjpeg.so.62"


def toolkit_home(nvcc_path: str | None) -> list[str]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    if nvcc_path:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc_path))))
    homes += sorted(glob.glob("/usr/local/cuda*"))
    return list(dict.fromkeys(h for h in homes if h and os.path.isdir(h)))


def package_dirs(name: str) -> list[str]:
    """The folders of an installed package (found without importing it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def nvjpeg_candidates(nvcc_path: str | None) -> list[str]:
    """Every libnvjpeg file found, in the order fastloop.cuda.load_nvjpeg() would prefer them."""
    found: list[str] = []
    if os.environ.get("FASTLOOP_NVJPEG"):
        found.append(os.environ["FASTLOOP_NVJPEG"])
    sites = [p for p in sys.path if p and os.path.isdir(p)]
    for site in sites:  # the nvidia-* wheels: nvidia/nvjpeg/lib, nvidia/cu13/lib
        found += glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvjpeg.so*"))
    for folder in package_dirs("torch"):
        found += glob.glob(os.path.join(folder, "lib", "libnvjpeg*.so*"))
    for site in sites:
        found += glob.glob(os.path.join(site, "torchvision.libs", "libnvjpeg*.so*"))
    for home in toolkit_home(nvcc_path):
        for sub in ("lib64", "lib", "targets/*/lib"):
            found += glob.glob(os.path.join(home, sub, "libnvjpeg.so*"))
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
        found += [line.split("=>")[-1].strip() for line in cache.splitlines() if "libnvjpeg.so" in line]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return list(dict.fromkeys(p for p in found if os.path.exists(p)))


def main(argv: list[str]) -> int:
    wheel = "--wheel" in argv
    checks = [] if wheel else [python_h(), nvcc(), jpeg()]
    checks.append(driver())
    nvcc_path = None if wheel else checks[1][0]
    libraries = nvjpeg_candidates(nvcc_path)
    places = "$FASTLOOP_NVJPEG, nvidia-* wheels, torch/lib, torchvision.libs, the toolkit's lib64, ldconfig"
    checks.append((libraries[0], f"nvJPEG {libraries[0]}" + (f" (+{len(libraries) - 1} more)" if len(libraries) > 1
                                                                   else "")) if libraries
                  else (None, f"libnvjpeg (not in {places})"))
    missing = [said for value, said in checks if value is None]
    if missing:
        print(f"preflight: missing {'; '.join(missing)}")
        return 1
    print(f"preflight ok: {'; '.join(said for _, said in checks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
