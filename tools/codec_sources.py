"""Where the image codecs linked into the wheels come from: writes csrc/third_party/<lib>/README
(the Debian package and version, the static library's and the licence's sha256, how to
refresh) from what this machine has installed, or with --check says whether they still match.

    sudo apt-get update && sudo apt-get install libjpeg62-turbo-dev libpng-dev zlib1g-dev
    python tools/codec_sources.py            # rewrite the READMEs, then commit them
    python tools/codec_sources.py --check    # exit 1 when this machine's libraries differ

setup_codecs.py finds and links the same files at build time (and copies each package's
copyright file into the wheel); this records what a release was built from.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import setup_codecs  # noqa: E402

# folder under csrc/third_party -> (the archive setup_codecs links, the packages its search uses, its licence)
LIBRARIES = {
    "libjpeg-turbo": ("libjpeg.a", ["libjpeg"], "the IJG licence, the Modified (3-clause) BSD licence and the zlib licence"),
    "libpng": ("libpng16.a", ["libpng"], "the PNG Reference Library License version 2"),
    "zlib": ("libz.a", ["zlib"], "the zlib licence"),
}
PACKAGES = "libjpeg62-turbo-dev libpng-dev zlib1g-dev"


def describe(folder: str, archive_name: str, packages: list[str], licence: str) -> str:
    """The README text for one library, from the archive this machine would link."""
    archive = setup_codecs.find(archive_name, setup_codecs.search_dirs(packages, "lib"))
    if archive is None:
        raise SystemExit(f"{archive_name} not found: apt-get install {PACKAGES}")
    owner = setup_codecs.debian_package(archive)
    if owner is None:
        raise SystemExit(f"{archive} belongs to no Debian package (dpkg -S): its origin cannot be recorded")
    package, version = owner
    copyright_file = setup_codecs.debian_copyright(package)
    if copyright_file is None:
        raise SystemExit(f"{package} has no /usr/share/doc/{package}/copyright: its licence cannot be shipped")
    return f"""# {folder}

Linked statically into `fastloop._core` in the binary wheels (setup_codecs.py finds it; no
source of it is kept here).

* Origin: Debian 12's `{package}` package, version `{version}` (the static library
  `{os.path.basename(archive)}`, built by Debian with the distribution's compiler flags).
* sha256 of `{os.path.basename(archive)}`: `{setup_codecs.sha256(archive)}`
* Licence: {licence}; the package's copyright file (sha256
  `{setup_codecs.sha256(copyright_file)}`) ships in each wheel as
  `fastloop/third_party_licences/{os.path.splitext(os.path.basename(archive))[0]}.copyright`,
  beside `SOURCES.txt`, which records the package, version and checksum a wheel was built from.
* Refresh: `apt-get update && apt-get install {PACKAGES}`, then
  `python tools/codec_sources.py` rewrites this file; `--check` says whether the machine
  still matches it. Written by that script: do not edit by hand.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 on a difference")
    args = parser.parse_args()
    stale = []
    for folder, (archive, packages, licence) in LIBRARIES.items():
        path = os.path.join(ROOT, "csrc", "third_party", folder, "README.md")
        text = describe(folder, archive, packages, licence)
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            print(f"{path}: matches this machine's {archive}")
        elif args.check:
            stale.append(path)
            print(f"{path}: differs from this machine's {archive} (python tools/codec_sources.py rewrites it)")
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
