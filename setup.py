"""Build fastloop: the C core and binding (fastloop._core) always, with the JPEG and PNG
codecs linked in where the build machine has their static libraries (setup_codecs.py); the
CUDA code (fastloop._cuda) where nvcc is found: kernels by nvcc, the rest by the C compiler
(CC: tools/wheels.py sets zig's, for old glibc), linked with the static CUDA runtime.

Environment:
  FASTLOOP_CUDA=0|1     0 skips CUDA; 1 fails the build when nvcc is missing (default: auto)
  FASTLOOP_CUDA_ARCHS   e.g. "80;90" (default: 75;80;86;89;90 plus PTX for 90)
  FASTLOOP_CUDA_CACHE   a folder where compiled kernels are kept and reused by later builds
                        (keyed by the sources, headers, flags and nvcc: one fatbin for every Python)
  FASTLOOP_CODECS       auto|linked|runtime: how the image codecs are built in (setup_codecs.py)
  FASTLOOP_WERROR=1     turn compiler warnings into errors (make test sets it)
  FASTLOOP_TESTING=1    compile in the tests' private hooks (csrc/testing/, py_testing.c,
                        py_nn_testing.c): make build and test-pythons set it; wheels never have them
  CUDA_HOME/CUDA_PATH   where to look for bin/nvcc before PATH
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import setup_codecs  # noqa: E402 (beside this file, in the sdist too)

WARNINGS = ["-Wall", "-Wextra"] + (["-Werror"] if os.environ.get("FASTLOOP_WERROR") == "1" else [])
C_FLAGS = ["-std=gnu11", "-O3", "-fvisibility=hidden", *WARNINGS]
DEFAULT_CUDA_ARCHS = "75;80;86;89;90"
TESTING = os.environ.get("FASTLOOP_TESTING") == "1"
TEST_ONLY_SOURCES = ["csrc/testing/", "csrc/py/py_testing.c", "csrc/py/py_gpu_math_testing.c", "cuda/py/py_nn_testing.c"]
TESTING_MACROS = [("FL_TESTING", "1")] if TESTING else []


def sources(*patterns: str) -> list[str]:
    """The files matching patterns, sorted; the tests' hooks only when FASTLOOP_TESTING=1."""
    found = sorted(path for pattern in patterns for path in glob.glob(pattern))
    return found if TESTING else [p for p in found if not any(p.startswith(t) for t in TEST_ONLY_SOURCES)]


def find_nvcc() -> tuple[str | None, str]:
    """Returns (path to nvcc or None, why) after looking in CUDA_HOME, CUDA_PATH and PATH."""
    if os.environ.get("FASTLOOP_CUDA") == "0":
        return None, ("CUDA disabled by FASTLOOP_CUDA=0 at build time (the binary wheels carry no CUDA code: "
                      "`pip install --no-binary fastloop fastloop` where nvcc is builds it)")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc"), f"nvcc from ${var}"
    found = shutil.which("nvcc")
    if found:
        return found, "nvcc from PATH"
    return None, "nvcc was not found at build time (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH)"


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    release = [line for line in out.splitlines() if "release" in line]
    return release[0].split("release")[-1].split(",")[0].strip() if release else "unknown"


def cuda_home(nvcc: str) -> str:
    """The toolkit nvcc belongs to (nvcc may be a wrapper script elsewhere): its TOP."""
    out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    top = [line.split("TOP=", 1)[1].strip() for line in out.splitlines() if "TOP=" in line]
    return os.path.realpath(top[0]) if top else os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def find_cudart_static(home: str) -> str:
    """The static CUDA runtime of the toolkit at home (lib64/ or targets/<arch>/lib/)."""
    for pattern in ("lib64/libcudart_static.a", "targets/*/lib/libcudart_static.a", "lib/libcudart_static.a"):
        found = sorted(glob.glob(os.path.join(home, pattern)))
        if found:
            return found[0]
    raise RuntimeError(f"no libcudart_static.a under {home} (the static CUDA runtime the extension links)")


def gencode_flags() -> list[str]:
    archs = [a.strip() for a in os.environ.get("FASTLOOP_CUDA_ARCHS", DEFAULT_CUDA_ARCHS).split(";") if a.strip()]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return flags + [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


class CudaExtension(Extension):
    """An extension compiled and linked by nvcc (C files go through nvcc to the host compiler)."""


class BuildExt(build_ext):
    cuda_built = False
    cuda_note = "the CUDA extension was not part of this build"
    cuda_runtime = ""

    def run(self) -> None:
        super().run()
        self.write_build_info()

    codecs = setup_codecs.Codecs()

    def build_extension(self, ext: Extension) -> None:
        if isinstance(ext, CudaExtension):
            self.build_cuda_or_skip(ext)
            return
        self.codecs = setup_codecs.prepare(self.build_temp)
        print(f"fastloop: image codecs: {self.codecs.notes}")
        ext.include_dirs.append(self.codecs.include_dir)
        ext.define_macros += self.codecs.defines
        ext.extra_objects = list(self.codecs.archives)
        if self.codecs.archives:  # their symbols stay inside _core (only PyInit__core is exported)
            ext.extra_link_args = [f"-Wl,--version-script={self.version_script('PyInit__core')}"]
        super().build_extension(ext)

    def version_script(self, export: str) -> str:
        path = os.path.join(self.build_temp, f"{export}.map")
        os.makedirs(self.build_temp, exist_ok=True)
        with open(path, "w") as f:
            f.write(f"{{ global: {export}; local: *; }};\n")
        return path

    def copy_extensions_to_source(self) -> None:
        if not self.cuda_built:  # nothing to copy for a skipped CUDA extension
            self.extensions = [e for e in self.extensions if not isinstance(e, CudaExtension)]
        super().copy_extensions_to_source()

    def build_cuda_or_skip(self, ext: CudaExtension) -> None:
        nvcc, why = find_nvcc()
        if nvcc is None:
            if os.environ.get("FASTLOOP_CUDA") == "1":
                raise RuntimeError(f"FASTLOOP_CUDA=1 but {why}")
            self.cuda_note = why
            print(f"fastloop: skipping the CUDA extension: {why}")
            return
        version = nvcc_version(nvcc)
        self.build_cuda(ext, nvcc)
        self.cuda_runtime = version
        archs = os.environ.get("FASTLOOP_CUDA_ARCHS", DEFAULT_CUDA_ARCHS).replace(";", ",")
        self.cuda_built, self.cuda_note = True, f"built with nvcc {version} ({why}) for sm_{{{archs}}}"

    def build_cuda(self, ext: CudaExtension, nvcc: str) -> None:
        """Kernels (.cu) by nvcc, into fatbins for every arch; the C files by the C compiler;
        linked by the C compiler with the static CUDA runtime (only libcuda.so.1, the driver's,
        is then needed at run time; cuBLAS, nvJPEG and NVML are dlopened)."""
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.makedirs(self.build_temp, exist_ok=True)
        home = cuda_home(nvcc)
        cuda_include = os.path.join(home, "include")
        includes = [f"-I{sysconfig.get_paths()['include']}", f"-I{numpy.get_include()}", "-Icuda", "-Icsrc"]
        host_flags = ",".join(["-fPIC", "-fvisibility=hidden", *WARNINGS])
        objects = []
        for source in [s for s in ext.sources if s.endswith(".cu")]:
            cmd = [nvcc, "-c", source, "-O3", "-x", "cu", *gencode_flags(), *includes, f"-Xcompiler={host_flags}"]
            if os.environ.get("FASTLOOP_WERROR") == "1":
                cmd.append("-Werror=all-warnings")
            objects.append(self.cached_kernel_object(nvcc, source, cmd))
        objects += self.compiler.compile([s for s in ext.sources if not s.endswith(".cu")],
                                         output_dir=self.build_temp, include_dirs=["cuda", "csrc", cuda_include,
                                         numpy.get_include()], macros=TESTING_MACROS, extra_postargs=C_FLAGS)
        # nvcc's host code needs a C++ runtime (static-local guards, the EH personality):
        # zig's linker brings its own libc++ (static, hidden with the rest), gcc/clang libstdc++
        zig = "zig" in os.path.basename(self.compiler.linker_so[0])
        self.compiler.link_shared_object(objects, target, extra_postargs=[
            find_cudart_static(home), "-lc++" if zig else "-lstdc++", "-ldl", "-lpthread", "-lrt",
            f"-Wl,--version-script={self.version_script('PyInit__cuda')}"])

    def cached_kernel_object(self, nvcc: str, source: str, cmd: list[str]) -> str:
        """Runs nvcc's cmd (+ -o) for source, or reuses the object an earlier build made with
        the same sources, headers, flags and nvcc (in $FASTLOOP_CUDA_CACHE). The kernels hold
        nothing of Python's: one compile serves every interpreter's wheel."""
        obj = os.path.join(self.build_temp, os.path.basename(source) + ".o")
        cache = os.environ.get("FASTLOOP_CUDA_CACHE")
        if not cache:
            self.spawn([*cmd, "-o", obj])
            return obj
        digest = hashlib.sha256(" ".join([*cmd[3:], nvcc_version(nvcc)]).encode())
        for path in [source, *sorted(glob.glob("cuda/*.h") + glob.glob("cuda/*.cuh") + glob.glob("csrc/*/*.h") + glob.glob("csrc/*/*.inc"))]:
            with open(path, "rb") as f:
                digest.update(path.encode() + f.read())
        cached = os.path.join(cache, f"{os.path.basename(source)}-{digest.hexdigest()[:16]}.o")
        if not os.path.exists(cached):
            os.makedirs(cache, exist_ok=True)
            self.spawn([*cmd, "-o", obj])
            shutil.copy(obj, cached + ".tmp")
            os.replace(cached + ".tmp", cached)
        else:
            print(f"fastloop: {source}: reusing {cached}")
        return cached

    def write_build_info(self) -> None:
        text = (
            '"""How this copy of fastloop was built (generated by setup.py)."""\n'
            f"CUDA_BUILT = {self.cuda_built!r}\n"
            f"CUDA_NOTE = {self.cuda_note!r}\n"
            f"CUDA_RUNTIME_VERSION = {self.cuda_runtime!r}  # the CUDA version the runtime was linked from\n"
            f"CODECS = {self.codecs.notes!r}\n"
            f"TESTING_HOOKS = {TESTING!r}  # FASTLOOP_TESTING=1: the tests' private C hooks compiled in\n"
        )
        roots = [self.build_lib] + (["python"] if self.inplace else [])
        for root in roots:
            path = os.path.join(root, "fastloop", "_build_info.py")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        self.copy_licences()

    def copy_licences(self) -> None:
        """The licences of the libraries linked in, beside the package (in every wheel)."""
        folder = os.path.join(self.build_lib, "fastloop", "third_party_licences")
        shutil.rmtree(folder, ignore_errors=True)
        if self.codecs.licences:
            os.makedirs(folder)
            for name, source in self.codecs.licences.items():
                shutil.copy(source, os.path.join(folder, name))
            with open(os.path.join(folder, "SOURCES.txt"), "w") as f:
                f.write("Static libraries linked into fastloop._core (setup_codecs.py):\n")
                f.writelines(f"{line}\n" for line in self.codecs.sources)


core = Extension(
    "fastloop._core",
    sources=sources("csrc/*/*.c"),  # one folder per subsystem, csrc/py/ the binding
    include_dirs=["csrc", numpy.get_include()],
    define_macros=TESTING_MACROS,
    extra_compile_args=C_FLAGS,
    libraries=["pthread", "m", "dl"],
    # the tests' host build of the GPU kernels' math (py_gpu_math_testing.c): rebuilt when it changes
    depends=sorted(glob.glob("cuda/*.cuh")) if TESTING else [],
)
cuda = CudaExtension(
    "fastloop._cuda",
    # the core's error table and library loading, for nvJPEG's dlopen (a copy of each in this .so)
    sources=sources("cuda/*.cu") + sources("cuda/*.c") + sources("cuda/py/*.c") + ["csrc/base/fl_dl.c", "csrc/base/fl_error.c"],
)

setup(ext_modules=[core, cuda], cmdclass={"build_ext": BuildExt})
