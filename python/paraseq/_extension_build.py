"""Compiling, caching and loading the generated extensions of the compiled paths (odeint's functions
of your own: _compiled_odeint.py; newton_apply's cells of your own: _compiled_cell.py).

An extension is generated C++ with its operators in a namespace of its own
(torch.ops.paraseq_user_<hash>, torch.ops.paraseq_cell_<hash>): its work and its operators'
PyTorch half (and where Kokkos has CUDA, more units of the work), compiled side by side. It links against the loaded
libparaseq_torch.so, so Kokkos is initialised once (ensure_kokkos) and is the same Kokkos, and
compiles with the headers and Kokkos that libparaseq_torch.build.json next to the library names
(CMake writes it; a source tree without one uses its src/, its cmake/paraseqInstances.cmake and the
loaded libkokkoscore). With a CUDA Kokkos an extension's work (every unit that includes Kokkos) is
CUDA compiled by nvcc (the library's CUDA compiler, host compiler and architectures), its
operators' PyTorch half (a ".cpp" unit that includes no Kokkos header: src/adapters/torch/work.hpp)
is compiled by the C++ compiler, and it has CPU and CUDA kernels; otherwise both are C++ with CPU
kernels.

Extensions are cached on disk under $PARASEQ_CACHE_DIR (default ~/.cache/paraseq), keyed by the
generated source and the versions of paraseq, torch, Kokkos, the compiler and a digest of
paraseq's headers: a second use loads the library. A compile is announced by a CompilingWarning
(eager calls only: a warning would break a torch.compile graph), so that the first call's tens of
seconds are not a silent stall.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from . import _library

BUILD_DESCRIPTION = "libparaseq_torch.build.json"  # written by CMake next to the library
# paraseq/config.hpp (cmake/config.hpp.in) of an extension: it compiles every instance it runs (its
# own cell's, its own field's) and declares none of the library's.
EXTENSION_CONFIG = """#pragma once
// Written by paraseq (python/paraseq/_extension_build.py) for its generated extensions.
#define PARASEQ_ETI 0
#define PARASEQ_ETI_ONLY 0
#define PARASEQ_HAVE_MPI 0
"""
statistics = {"compiles": 0, "loads": 0}  # this process's compiles and library loads (for tests)
_loaded: set = set()  # namespaces loaded in this process


class CompilingWarning(UserWarning):
    """A function or cell of your own is being compiled into a C++ extension for the compiled path
    (compile="auto" or True): the first use with these versions, tens of seconds; later uses, in any
    process, load it from the disk cache. Filter it with
    ``warnings.filterwarnings("ignore", category=paraseq.CompilingWarning)``."""


class BuildUnavailable(Exception):
    """No compiler, headers or Kokkos description for a generated extension; str() says which."""


def cache_dir() -> Path:
    return Path(os.environ.get("PARASEQ_CACHE_DIR") or Path.home() / ".cache" / "paraseq")


def _loaded_kokkos():
    """The libkokkoscore this process loaded with libparaseq_torch.so (None when it is built in)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if re.search(r"/libkokkoscore[^/]*\.so", path):
                return Path(path)
    return None


def _kokkos_include(library):
    """The include directory of the Kokkos installation that holds `library`."""
    for prefix in library.parents:
        for candidate in (prefix / "include" / "kokkos", prefix / "include"):
            if (candidate / "KokkosCore_config.h").is_file():
                return candidate
    return None


def _instance_list(tree, name):
    """The list `name` of the source tree's cmake/paraseqInstances.cmake (its `set(NAME a b ...)`)."""
    path = tree / "cmake" / "paraseqInstances.cmake"
    found = re.search(rf"^set\({name}\s+([^)]*)\)", path.read_text(), re.MULTILINE) if path.is_file() else None
    if found is None:
        raise BuildUnavailable(f"the list {name} was not found in {path} (no {BUILD_DESCRIPTION} next to "
                               f"{_library.LIBRARY_PATH})")
    return found.group(1).split()


def _discovered_description():
    """The build description of an in-tree build without one: the repository's src/, the loaded
    Kokkos and the lists of its cmake/paraseqInstances.cmake."""
    tree = Path(__file__).resolve().parents[2]
    source = tree / "src"
    if not (source / "adapters" / "torch" / "odeint_integrate.hpp").is_file():
        raise BuildUnavailable(f"paraseq's headers were not found (no {BUILD_DESCRIPTION} next to "
                               f"{_library.LIBRARY_PATH} and no source tree at {source})")
    library = _loaded_kokkos()
    include = _kokkos_include(library) if library else None
    if include is None:
        raise BuildUnavailable(f"the headers of the Kokkos that {_library.LIBRARY_PATH} uses were not found (no "
                               f"{BUILD_DESCRIPTION} next to it)")
    return {"paraseq_source_dir": str(source), "include_dirs": [str(include)], "compile_definitions": [],
            "compile_options": [], "link_libraries": [str(library)], "cxx_compiler": None,
            "device_scan_kernels": _instance_list(tree, "PARASEQ_ETI_DEVICE_SCAN_KERNELS")}


class BuildSettings(NamedTuple):
    compiler: str
    compile_flags: list
    link_flags: list
    depends: str  # the text of everything a compile depends on besides the source
    source: Path  # paraseq's headers (the directory that <paraseq/...> names)
    cuda: bool  # Kokkos has CUDA: the extensions are CUDA sources (nvcc) with CPU and CUDA kernels
    suffix: str  # of a generated source: ".cu" for nvcc, ".cpp" otherwise
    device_scan_kernels: tuple  # the ordered-scan kernel tags whose device instances have units of their own
    # A ".cpp" unit of a CUDA build (the operators' PyTorch half, which includes no Kokkos header)
    # compiles with the C++ compiler and these flags; otherwise they are compiler and compile_flags.
    cxx_compiler: str
    cxx_flags: list


_CUDA_ARCHITECTURE = re.compile(r"#define\s+KOKKOS_ARCH_(?:KEPLER|MAXWELL|PASCAL|VOLTA|TURING|AMPERE|ADA|HOPPER|BLACKWELL)"
                                r"(\d+)\b")


def _cuda_architectures(description, kokkos):
    """The compute capabilities an extension is compiled for: the library's (CMAKE_CUDA_ARCHITECTURES,
    as 90 or 90-real), else the one Kokkos was configured for."""
    named = [a.split("-")[0] for a in description.get("cuda_architectures", "").split(";") if a.split("-")[0].isdigit()]
    return named or _CUDA_ARCHITECTURE.findall(kokkos)


def _cuda_settings(description, kokkos):
    """(compiler, compile flags) of nvcc for an extension of a CUDA Kokkos."""
    compiler = os.environ.get("CUDACXX") or description.get("cuda_compiler") or shutil.which("nvcc")
    if not compiler or not shutil.which(compiler):
        raise BuildUnavailable("this Kokkos has CUDA and no CUDA compiler was found (set CUDACXX; the library's build "
                               f"named {description.get('cuda_compiler') or 'none'})")
    host = os.environ.get("CUDAHOSTCXX") or description.get("cuda_host_compiler") or description.get("cxx_compiler")
    architectures = _cuda_architectures(description, kokkos)
    if not architectures:
        raise BuildUnavailable("this Kokkos has CUDA and neither the library's build description nor "
                               "KokkosCore_config.h names a CUDA architecture")
    host_flags = "-fPIC,-fopenmp" if "#define KOKKOS_ENABLE_OPENMP" in kokkos else "-fPIC"
    flags = ["-std=c++20", "-O3", "-DNDEBUG", "--extended-lambda", "--expt-relaxed-constexpr", "-Xcompiler", host_flags]
    flags += [f"-ccbin={host}"] if host else []
    flags += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in architectures]
    return compiler, flags


@functools.lru_cache(maxsize=None)
def build_settings() -> BuildSettings:
    description_path = Path(_library.LIBRARY_PATH).with_name(BUILD_DESCRIPTION)
    description = json.loads(description_path.read_text()) if description_path.is_file() else \
        _discovered_description()
    source = description_path.parent / description["paraseq_source_dir"]  # relative: to the description's
    if not (source / "adapters" / "torch" / "odeint_integrate.hpp").is_file():
        raise BuildUnavailable(f"paraseq's headers were not found in {source}")
    kokkos_config = next((Path(d) / "KokkosCore_config.h" for d in description["include_dirs"]
                          if (Path(d) / "KokkosCore_config.h").is_file()), None)
    if kokkos_config is None:
        raise BuildUnavailable("KokkosCore_config.h was not found in " + ", ".join(description["include_dirs"]))
    kokkos = kokkos_config.read_text()
    cuda = "#define KOKKOS_ENABLE_CUDA" in kokkos
    cxx_compiler = os.environ.get("CXX") or description.get("cxx_compiler") or shutil.which("c++") or shutil.which("g++")
    if not cxx_compiler or not shutil.which(cxx_compiler):
        raise BuildUnavailable(f"no C++ compiler was found (set CXX; tried {cxx_compiler or 'c++ and g++'})")
    # The library's Release level: at -O2 g++ left a user function's RK4 loop 1.45x slower than the
    # built-in field's (docs/torch.md).
    cxx_language_flags = ["-std=c++20", "-O3", "-fPIC", "-DNDEBUG"]
    if cuda:  # Kokkos' headers then need nvcc in every unit that includes them
        compiler, language_flags = _cuda_settings(description, kokkos)
    else:
        compiler = cxx_compiler
        language_flags = cxx_language_flags + (["-fopenmp"] if "#define KOKKOS_ENABLE_OPENMP" in kokkos else [])
    version = re.search(r"#define\s+KOKKOS_VERSION\s+(\d+)", kokkos)
    from torch.utils import cpp_extension
    include = cache_dir() / "include"  # <paraseq/...> resolves to the source directory
    include.mkdir(parents=True, exist_ok=True)
    link = include / "paraseq"
    if not link.exists() or link.resolve() != source.resolve():
        temporary = include / f"paraseq.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(source.resolve(), target_is_directory=True)
        os.replace(temporary, link)
    generated = cache_dir() / "generated"  # <paraseq/config.hpp> where the headers have none (a source tree)
    (generated / "paraseq").mkdir(parents=True, exist_ok=True)
    config = generated / "paraseq" / "config.hpp"
    if not config.is_file() or config.read_text() != EXTENSION_CONFIG:
        temporary = config.with_name(f"config.hpp.{os.getpid()}")
        temporary.write_text(EXTENSION_CONFIG)
        os.replace(temporary, config)
    common_flags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                    f"-I{include}", f"-I{generated}", f"-I{source / 'adapters' / 'torch'}"]
    torch_includes = [flag for d in cpp_extension.include_paths() for flag in ("-isystem", d)]
    compile_flags = [*language_flags, *common_flags, *(f"-I{d}" for d in description["include_dirs"]), *torch_includes]
    compile_flags += [f"-D{d}" for d in description["compile_definitions"]] + list(description["compile_options"])
    cxx_flags = [*cxx_language_flags, *common_flags, *torch_includes] if cuda else compile_flags
    torch_lib = cpp_extension.library_paths()[0]
    paraseq_lib = Path(_library.LIBRARY_PATH).resolve()
    run_paths = [torch_lib, paraseq_lib.parent, *(Path(lib).parent for lib in description["link_libraries"] if "/" in lib)]
    libraries = [str(paraseq_lib), *description["link_libraries"]]
    if cuda:  # nvcc refuses a file it does not know by its suffix (libkokkoscore.so.4.6.99): hand paths to the linker
        libraries = [flag for lib in libraries for flag in (("-Xlinker", lib) if "/" in lib else (lib,))]
    link_flags = ["-shared", *libraries, f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch"]
    if not cuda and "-fopenmp" in language_flags:  # the units' OpenMP runtime, as a compile-and-link would add
        link_flags.append("-fopenmp")
    for directory in run_paths:  # nvcc hands -Xlinker's value to the host linker, as g++ does -Wl's
        link_flags += ["-Xlinker", f"-rpath,{directory}"] if cuda else [f"-Wl,-rpath,{directory}"]
    compiler_version = "; ".join(subprocess.run([c, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
                                 for c in dict.fromkeys([compiler, cxx_compiler]))
    headers = hashlib.sha256()
    for path in sorted(source.rglob("*.hpp")):
        headers.update(path.read_bytes())
    try:
        paraseq_version = importlib.metadata.version("paraseq")
    except importlib.metadata.PackageNotFoundError:
        paraseq_version = "source tree"  # its headers' digest stands for it
    depends = json.dumps({"paraseq": paraseq_version, "torch": torch.__version__, "python": sys.version.split()[0],
                          "kokkos": version.group(1) if version else kokkos_config.as_posix(),
                          "compiler": compiler_version, "headers": headers.hexdigest(),
                          "flags": compile_flags + cxx_flags + link_flags})
    # A description written before it named them: the family units compile those kernels too.
    scan_kernels = tuple(description.get("device_scan_kernels", ()))
    return BuildSettings(compiler, compile_flags, link_flags, depends, source, cuda, ".cu" if cuda else ".cpp",
                         scan_kernels, cxx_compiler, cxx_flags)


def require_device(device_type: str, argument: str) -> None:
    """Raises BuildUnavailable unless the extensions run on device_type: the CPU, and CUDA where
    Kokkos has it. (Every extension of a CUDA build, also one for CPU tensors, compiles its work with
    nvcc: its first use took 21-65 s on H100 machines' hosts, 2026-12-05 and 2026-12-06, docs/torch.md.)"""
    cuda = build_settings().cuda
    if device_type not in ("cpu", "cuda") or (device_type == "cuda" and not cuda):
        raise BuildUnavailable(f"the extensions of this build run on the CPU{' and CUDA' if cuda else ''} only, and "
                               f"{argument} is on {device_type}")


def _run(function, command, source_path):
    """Runs the compiler; its wall seconds."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{function}: compiling the generated extension {source_path} failed (exit status "
                           f"{result.returncode}); the compiler said:\n{result.stderr[-4000:]}")
    return time.perf_counter() - started


def _compile(function, settings, units, library_path):
    """Compiles the units (source paths) side by side (one process per core) into library_path, then
    links them."""
    temporary = library_path.with_name(f"{library_path.name}.{os.getpid()}.tmp")
    started = time.perf_counter()
    objects = [unit.with_name(f"{unit.name}.{os.getpid()}.o") for unit in units]

    def command(unit):  # a CUDA build's ".cpp" unit includes PyTorch and no Kokkos: the C++ compiler
        if settings.cuda and unit.suffix == ".cpp":
            return [settings.cxx_compiler, *settings.cxx_flags]
        return [settings.compiler, *settings.compile_flags]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(units), os.cpu_count() or 1))) as pool:
            compiles = [pool.submit(_run, function, [*command(unit), "-c", str(unit), "-o", str(obj)], unit)
                        for unit, obj in zip(units, objects)]
            unit_seconds = {unit.name: compile.result() for unit, compile in zip(units, compiles)}
        unit_seconds["(link)"] = _run(function, [settings.compiler, *map(str, objects), "-o", str(temporary),
                                                 *settings.link_flags], units[0])
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        for obj in objects:
            obj.unlink(missing_ok=True)
    os.replace(temporary, library_path)
    statistics["compiles"] += 1
    statistics["last_compile_seconds"] = time.perf_counter() - started
    statistics["last_compile_units"] = unit_seconds  # each unit's compile (and the link), wall seconds


def load(function: str, prefix: str, subdirectory: str, sources_for: Callable[[str], dict]) -> tuple[str, bool]:
    """(namespace, loaded now) of the extension whose files are sources_for(namespace) (file names,
    with the namespace in them, to texts: headers and the units to compile): compiled into
    cache_dir()/subdirectory unless it holds it (its name is `prefix`_ and a hash of the sources and
    build_settings().depends), loaded unless this process already did. `function` names the caller
    in errors. Raises BuildUnavailable."""
    settings = build_settings()
    key = hashlib.sha256(("".join(f"{name}\n{text}" for name, text in sorted(sources_for("NAMESPACE").items()))
                          + settings.depends).encode()).hexdigest()
    namespace = f"{prefix}_{key[:20]}"
    if namespace in _loaded:
        return namespace, False
    directory = cache_dir() / subdirectory
    directory.mkdir(parents=True, exist_ok=True)
    library_path = directory / f"{namespace}.so"
    with open(directory / f"{namespace}.lock", "w") as lock:  # one compile when processes race
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library_path.is_file():
            if not torch.compiler.is_compiling():
                warnings.warn(f"{function}: compiling the compiled path's C++ extension for your function or cell (its "
                              "first use with these versions: tens of seconds; cached in "
                              f"{directory}, so later uses load it); compile=False takes the general path instead",
                              CompilingWarning, stacklevel=4)
            units = []
            for name, text in sources_for(namespace).items():
                (directory / name).write_text(text)
                if not name.endswith(".hpp"):
                    units.append(directory / name)
            _compile(function, settings, units, library_path)
    torch.ops.load_library(str(library_path))
    statistics["loads"] += 1
    _loaded.add(namespace)
    return namespace, True
