"""The image codecs in fastloop._core (used by setup.py): linked in from the build machine's
static libraries, or loaded at run time. docs/development.md ("Image codecs") says why.

FASTLOOP_CODECS=auto (default) links each codec whose headers, static archives and licence
are found, and leaves the others to be loaded at run time; =linked fails the build unless both
link; =runtime links neither. Where it looks: pkg-config's include and lib folders for libjpeg,
libpng and zlib, then /usr/include and /usr/lib/<multiarch>.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass, field

# format -> what links it: pkg-config names, headers, archives (in link order), the define
CODECS = {
    "jpeg": {"packages": ["libjpeg"], "headers": ["jpeglib.h", "jmorecfg.h", "jerror.h", "jconfig.h"],
             "archives": ["libjpeg.a"], "define": "FL_JPEG_LINKED"},
    "png": {"packages": ["libpng", "zlib"],
            "headers": ["png.h", "pngconf.h", "pnglibconf.h", "zlib.h", "zconf.h"],
            "archives": ["libpng16.a", "libz.a"], "define": "FL_PNG_LINKED"},
}
# The archives are position-independent executable code: their one PC-relative reference to a
# symbol of another library, libc's stderr, is renamed to fastloop's own (image_linked_stderr.c).
STDERR_RENAME = "stderr=fl_codec_stderr"


@dataclass
class Codecs:
    """What setup.py adds to the _core extension."""

    include_dir: str | None = None  # a folder holding only the codecs' headers
    defines: list[tuple[str, str]] = field(default_factory=list)
    archives: list[str] = field(default_factory=list)  # the renamed copies, in link order
    licences: dict[str, str] = field(default_factory=dict)  # file name in the wheel -> source
    sources: list[str] = field(default_factory=list)  # per archive: package, version, sha256
    notes: dict[str, str] = field(default_factory=dict)  # format -> how it is built in


def pkg_config(*args: str) -> list[str]:
    try:
        out = subprocess.run(["pkg-config", *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return out.split()


def search_dirs(packages: list[str], kind: str) -> list[str]:
    """Folders to look in for headers ("include") or archives ("lib"), pkg-config's first."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    found = []
    for package in packages:
        if kind == "include":
            found += [flag[2:] for flag in pkg_config("--cflags-only-I", package)]
            found += pkg_config("--variable=includedir", package)
        else:
            found += pkg_config("--variable=libdir", package)
    found += [f"/usr/{kind}/{multiarch}", f"/usr/{kind}"] if multiarch else [f"/usr/{kind}"]
    if kind == "include":
        found += ["/usr/include/libpng16"]
    return list(dict.fromkeys(d for d in found if os.path.isdir(d)))


def find(name: str, dirs: list[str]) -> str | None:
    return next((os.path.join(d, name) for d in dirs if os.path.exists(os.path.join(d, name))), None)


def debian_package(path: str) -> tuple[str, str] | None:
    """(package, version) of the Debian package owning path, or None."""
    try:
        out = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True,
                             check=True).stdout
        package = out.split(":")[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                                 text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return package, version


def debian_copyright(package: str) -> str | None:
    """The package's copyright file (the upstream licences are in it)."""
    path = f"/usr/share/doc/{package.split(':')[0]}/copyright"
    return path if os.path.exists(path) else None


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def prepare(build_temp: str) -> Codecs:
    """Copies the headers found into build_temp/codecs/include and, where it links, the
    archives (stderr renamed) into build_temp/codecs/lib; returns what to add to _core."""
    mode = os.environ.get("FASTLOOP_CODECS", "auto")
    if mode not in ("auto", "linked", "runtime"):
        raise RuntimeError(f"FASTLOOP_CODECS must be auto, linked or runtime, not {mode!r}")
    root = os.path.join(build_temp, "codecs")
    shutil.rmtree(root, ignore_errors=True)
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    os.makedirs(include), os.makedirs(lib)
    codecs = Codecs(include_dir=include)
    for fmt, spec in CODECS.items():
        headers = [find(h, search_dirs(spec["packages"], "include")) for h in spec["headers"]]
        if None in headers:
            missing = [h for h, p in zip(spec["headers"], headers) if p is None]
            codecs.notes[fmt] = f"none: no {', '.join(missing)} at build time"
        else:
            for header in headers:
                shutil.copy(header, include)
            codecs.notes[fmt] = link(spec, lib, codecs) if mode != "runtime" else "loaded at run time (FASTLOOP_CODECS=runtime)"
        if mode == "linked" and not codecs.notes[fmt].startswith("linked"):
            raise RuntimeError(f"FASTLOOP_CODECS=linked but the {fmt} codec cannot link: {codecs.notes[fmt]}")
    return codecs


def link(spec: dict, lib: str, codecs: Codecs) -> str:
    """Adds spec's archives to codecs (renamed copies in lib) when all are found with their
    licences; returns the note saying how the codec is built in."""
    archives = [find(a, search_dirs(spec["packages"], "lib")) for a in spec["archives"]]
    if None in archives:
        missing = [a for a, p in zip(spec["archives"], archives) if p is None]
        return f"loaded at run time (no {', '.join(missing)} at build time)"
    packages = [debian_package(a) for a in archives]
    licences = {os.path.basename(a): debian_copyright(p[0]) if p else None for a, p in zip(archives, packages)}
    if None in licences.values():
        return "loaded at run time (no Debian package or licence file found for its static library)"
    if shutil.which("objcopy") is None:
        return "loaded at run time (objcopy, which prepares the static library, was not found)"
    for archive in archives:
        copy = os.path.join(lib, os.path.basename(archive))
        subprocess.run(["objcopy", "--redefine-sym", STDERR_RENAME, archive, copy], check=True)
        codecs.archives.append(copy)
    codecs.sources += [f"{os.path.basename(a)}: Debian package {p[0]} {p[1]}, sha256 {sha256(a)}"
                       for a, p in zip(archives, packages)]
    codecs.defines.append((spec["define"], "1"))
    codecs.licences.update({f"{os.path.splitext(name)[0]}.copyright": path for name, path in licences.items()})
    return "linked: " + ", ".join(archives)
