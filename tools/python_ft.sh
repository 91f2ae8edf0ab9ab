#!/usr/bin/env bash
# A free-threaded CPython (PEP 703) for `make test-ft`: prints its path as the last line.
#
#   tools/python_ft.sh                          python3.13t/3.14t on PATH or in pyenv, else 3.13t
#                                               built from Debian's source package, cached
#   tools/python_ft.sh --with-thread-sanitizer  the ThreadSanitizer build CPython's own
#                                               free-threading CI uses (always built, cached apart),
#                                               with CPython's TSan suppressions in
#                                               <prefix>/share/fastloop/tsan-suppressions.txt
#   tools/python_ft.sh --rebuild [...]          drops the cached build first
#
# The build: Debian's python3.13 source package (trixie carries 3.13.5; a deb-src entry for it
# is added next to the system's Debian sources, pointing at the same mirror), its upstream
# tarball unpacked as released (Debian's patches are for Debian's own packaging), then
# `./configure --disable-gil [--with-thread-sanitizer] && make && make install` into
# ${FASTLOOP_CACHE:-~/.cache/fastloop}/cpython-3.13t[-tsan]. About 4 CPU-minutes without
# sanitizer. A build that did not finish leaves nothing in the cache: it is installed into a
# temporary folder and moved into place last.
set -euo pipefail

tsan=0
rebuild=0
for arg in "$@"; do
    case "$arg" in
        --with-thread-sanitizer) tsan=1 ;;
        --rebuild) rebuild=1 ;;
        *) echo "python_ft.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

cache="${FASTLOOP_CACHE:-$HOME/.cache/fastloop}"
name="cpython-3.13t$([ "$tsan" = 1 ] && echo -tsan || true)"
prefix="$cache/$name"
interpreter="$prefix/bin/python3.13t"

log() { echo "python_ft: $*" >&2; }

# A working free-threaded interpreter: it runs, and its build has the GIL disabled.
free_threaded() {
    [ -x "$1" ] && "$1" -c 'import sys, sysconfig; sys.exit(0 if sysconfig.get_config_var("Py_GIL_DISABLED") else 1)' \
        2>/dev/null
}

found_elsewhere() {
    local candidate
    for candidate in $(command -v python3.14t python3.13t 2>/dev/null) \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[34]*t/bin/python3.1[34]t; do
        if free_threaded "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ "$rebuild" = 1 ]; then
    rm -rf "$prefix"
fi
if [ "$tsan" = 0 ] && [ "$rebuild" = 0 ] && found=$(found_elsewhere); then
    log "found $found"
    echo "$found"
    exit 0
fi
if free_threaded "$interpreter"; then
    log "cached $interpreter"
    echo "$interpreter"
    exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The deb-src entry for trixie, on the mirror the system's own Debian entries use.
add_trixie_sources() {
    local list=/etc/apt/sources.list.d/fastloop-trixie-src.sources uri
    [ -f "$list" ] && return 0
    uri=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    if [ -z "$uri" ]; then
        log "no Debian mirror found in the apt sources: add a deb-src entry for trixie by hand"
        exit 1
    fi
    log "adding a deb-src entry for trixie ($list)"
    printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" | as_root tee "$list" >/dev/null
}

# What CPython's build needs for the modules the tests use (ssl for pip, zlib, ctypes, ...).
install_build_deps() {
    local missing=()
    for pkg in gcc make dpkg-dev xz-utils libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev \
        libsqlite3-dev libreadline-dev uuid-dev; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "$tsan" = 0 ] || dpkg -s libtsan2 >/dev/null 2>&1 || missing+=(libtsan2)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

add_trixie_sources
as_root apt-get update -qq
install_build_deps

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
log "downloading Debian's python3.13 source package"
apt-get source -qq --download-only python3.13 >/dev/null 2>&1 || {
    log "apt-get source python3.13 failed (is the trixie deb-src entry reachable?)"
    exit 1
}
tar xf python3.13_*.orig.tar.xz
cd Python-3.13.*/
version=$(basename "$PWD" | sed 's/^Python-//')
flags=(--disable-gil --disable-test-modules "--prefix=$prefix")
[ "$tsan" = 0 ] || flags+=(--with-thread-sanitizer)
log "building CPython $version (${flags[*]}) on $(nproc) cores"
./configure -q "${flags[@]}" >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
make -s -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
# installed under a temporary DESTDIR, then moved into place whole
make -s install DESTDIR="$work/root" >"$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
if [ "$tsan" = 1 ]; then # CPython's own list of its known benign races, for the TSan runs
    mkdir -p "$work/root$prefix/share/fastloop"
    cp Tools/tsan/suppressions_free_threading.txt "$work/root$prefix/share/fastloop/tsan-suppressions.txt"
fi
mkdir -p "$cache"
rm -rf "$prefix"
mv "$work/root$prefix" "$prefix"
free_threaded "$interpreter" || { log "the build at $interpreter does not run free-threaded"; exit 1; }
log "built $interpreter"
echo "$interpreter"
