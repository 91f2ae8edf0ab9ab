"""Where a CUDA library (libnvjpeg, libcublas) may be on this machine, in the order fastloop
tries the copies: the nvidia-* pip wheels and torch's own lib folder in every site-packages
(and every sys.path folder), then the CUDA Toolkit ($CUDA_HOME, $CUDA_PATH, nvcc's, the usual
/usr/local/cuda), each copy named with the place it was found in. Newer major versions first.

Standard library only, so a preflight can run it before fastloop is built:

    python python/fastloop/cuda/_libsearch.py nvjpeg     # one "path<TAB>where" line per copy
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import site
import sys
from typing import Mapping, Sequence

# Per place, the patterns a copy of lib<name> matches there ({name} filled in).
WHEEL_PATTERNS = ("nvidia/*/lib/lib{name}.so*", "nvidia/*/*/lib/lib{name}.so*")
TORCH_PATTERNS = ("torch/lib/lib{name}*.so*", "torchvision.libs/lib{name}*.so*", "torchvision/lib{name}*.so*")
TOOLKIT_FOLDERS = ("lib64", "lib", "targets/*/lib")
TOOLKIT_DEFAULTS = ("/usr/local/cuda",)


def site_dirs(extra: Sequence[str] = ()) -> list[str]:
    """Every folder Python packages may be installed in: sys.path's, site's, the user's."""
    found: list[str] = list(extra)
    found += [p for p in sys.path if p]
    try:
        found += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if isinstance(user, str):
        found.append(user)
    return _unique(d for d in found if os.path.isdir(d))


def toolkit_dirs(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The CUDA Toolkit roots to look in, each with where it came from."""
    env = os.environ if env is None else env
    roots: list[tuple[str, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if env.get(var):
            roots.append((env[var], f"${var}"))
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        roots.append((os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "nvcc's toolkit"))
    roots += [(root, "the CUDA Toolkit") for root in TOOLKIT_DEFAULTS]
    return [(root, where) for root, where in _unique_pairs(roots) if os.path.isdir(root)]


def candidates(name: str, env: Mapping[str, str] | None = None,
               sites: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(path, where) of each copy of lib<name>.so* found: where is "nvidia-* wheel in <site>",
    "torch in <site>" or "$CUDA_HOME (<root>)" and the like. Newest major version first; the
    search order (wheels, torch, toolkit) among equals. Never raises."""
    sites = site_dirs() if sites is None else list(sites)
    found: list[tuple[str, str]] = []
    for folder in sites:
        for pattern in WHEEL_PATTERNS:
            found += [(p, f"nvidia-* wheel in {folder}") for p in glob.glob(os.path.join(folder, pattern.format(name=name)))]
    for folder in sites:
        for pattern in TORCH_PATTERNS:
            found += [(p, f"torch in {folder}") for p in glob.glob(os.path.join(folder, pattern.format(name=name)))]
    for root, where in toolkit_dirs(env):
        for sub in TOOLKIT_FOLDERS:
            found += [(p, f"{where} ({root})") for p in glob.glob(os.path.join(root, sub, f"lib{name}.so*"))]
    seen: set[str] = set()
    unique = []
    for path, where in found:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            unique.append((path, where))

    def major(item: tuple[str, str]) -> int:
        match = re.search(rf"lib{name}[^/]*?\.so\.(\d+)", item[0])
        return int(match.group(1)) if match else 0

    order = {item: i for i, item in enumerate(unique)}
    return sorted(unique, key=lambda item: (-major(item), order[item]))


def _unique(items) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        real = os.path.realpath(item)
        if real not in seen:
            seen.add(real)
            out.append(item)
    return out


def _unique_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    for root, where in pairs:
        real = os.path.realpath(root)
        if real not in seen:
            seen.add(real)
            out.append((root, where))
    return out


if __name__ == "__main__":
    lib = sys.argv[1] if len(sys.argv) > 1 else "nvjpeg"
    copies = candidates(lib)
    for path, where in copies:
        print(f"{path}\t{where}")
    sys.exit(0 if copies else 1)
