"""odeint's compiled path: a right-hand side of your own as generated C++ operators.

The function is traced and emitted as a C++ field (_field_codegen.py), then compiled with the
adapter's own headers (src/adapters/torch/odeint_integrate.hpp: the work of paraseq::odeint for one
field, method, type and space) into a small extension with two operators, odeint and
odeint_backward, in a namespace of its own (torch.ops.paraseq_user_<hash>). Each extension holds
one field, one method, one compute type and the CPU: one compile stays small. It links against the
loaded libparaseq_torch.so, so Kokkos is initialised once (ensure_kokkos) and is the same Kokkos.
Its fake kernels and autograd are registered here (torch.library): under torch.compile the
integration is one operator.

Extensions are cached on disk under $PARASEQ_CACHE_DIR (default ~/.cache/paraseq), keyed by the
generated source (which holds the traced graph, n, the type and the method) and the versions of
paraseq, torch, Kokkos, the compiler and paraseq's headers: a second use loads the library.
"""

from __future__ import annotations

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

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import _field_codegen, _library, _user_function, _user_odeint

METHOD_TYPES = {"euler": "Euler", "heun": "Heun", "rk4": "RK4", "bosh3": "BogackiShampine3", "dopri5": "DormandPrince5",
                "tsit5": "Tsit5"}
BUILD_DESCRIPTION = "libparaseq_torch.build.json"  # written by CMake next to the library
statistics = {"compiles": 0, "loads": 0}  # this process's compiles and library loads (for tests)


class BuildUnavailable(Exception):
    """No compiler, headers or Kokkos description for a generated extension; str() says which."""


def cache_dir() -> Path:
    return Path(os.environ.get("PARASEQ_CACHE_DIR") or Path.home() / ".cache" / "paraseq")


# ---- how to compile against this paraseq -----------------------------------------------------------

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


def _discovered_description():
    """The build description of an in-tree build without one: the repository's src/ and the
    loaded Kokkos."""
    source = Path(__file__).resolve().parents[2] / "src"
    if not (source / "adapters" / "torch" / "odeint_integrate.hpp").is_file():
        raise BuildUnavailable(f"paraseq's headers were not found (no {BUILD_DESCRIPTION} next to "
                               f"{_library.LIBRARY_PATH} and no source tree at {source})")
    library = _loaded_kokkos()
    include = _kokkos_include(library) if library else None
    if include is None:
        raise BuildUnavailable(f"the headers of the Kokkos that {_library.LIBRARY_PATH} uses were not found (no "
                               f"{BUILD_DESCRIPTION} next to it)")
    return {"paraseq_source_dir": str(source), "include_dirs": [str(include)], "compile_definitions": [],
            "compile_options": [], "link_libraries": [str(library)], "cxx_compiler": None}


# An extension compiles its own field on the header path: its <paraseq/config.hpp> declares none of
# the library's compiled instances (which the build tree generates next to its own headers).
EXTENSION_CONFIG = """#pragma once
// Written by paraseq's compiled path (python/paraseq/_compiled_odeint.py) for generated extensions.
#define PARASEQ_ETI 0
#define PARASEQ_ETI_ONLY 0
"""


def _extension_config():
    """The include directory of the extensions' paraseq/config.hpp."""
    directory = cache_dir() / "include-config"
    config = directory / "paraseq" / "config.hpp"
    if not config.is_file() or config.read_text() != EXTENSION_CONFIG:
        config.parent.mkdir(parents=True, exist_ok=True)
        temporary = config.with_name(f"config.hpp.{os.getpid()}")
        temporary.write_text(EXTENSION_CONFIG)
        os.replace(temporary, config)
    return directory


@functools.lru_cache(maxsize=None)
def build_settings():
    """(compiler command, compile flags, link flags, text of everything a compile depends on)."""
    description_path = Path(_library.LIBRARY_PATH).with_name(BUILD_DESCRIPTION)
    description = json.loads(description_path.read_text()) if description_path.is_file() else \
        _discovered_description()
    compiler = os.environ.get("CXX") or description.get("cxx_compiler") or shutil.which("c++") or shutil.which("g++")
    if not compiler or not shutil.which(compiler):
        raise BuildUnavailable(f"no C++ compiler was found (set CXX; tried {compiler or 'c++ and g++'})")
    source = description_path.parent / description["paraseq_source_dir"]  # relative: to the description's
    if not (source / "adapters" / "torch" / "odeint_integrate.hpp").is_file():
        raise BuildUnavailable(f"paraseq's headers were not found in {source}")
    kokkos_config = next((Path(d) / "KokkosCore_config.h" for d in description["include_dirs"]
                          if (Path(d) / "KokkosCore_config.h").is_file()), None)
    if kokkos_config is None:
        raise BuildUnavailable("KokkosCore_config.h was not found in " + ", ".join(description["include_dirs"]))
    kokkos = kokkos_config.read_text()
    if "#define KOKKOS_ENABLE_CUDA" in kokkos:
        raise BuildUnavailable("the extensions are compiled for the CPU only, and this Kokkos has CUDA (its "
                               "headers need nvcc)")
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
    compile_flags = ["-std=c++20", "-O2", "-fPIC", "-DNDEBUG",
                     f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                     f"-I{include}", f"-I{_extension_config()}", f"-I{source / 'adapters' / 'torch'}"]
    compile_flags += [f"-I{d}" for d in description["include_dirs"]]
    compile_flags += [f"-isystem{d}" for d in cpp_extension.include_paths()]
    compile_flags += [f"-D{d}" for d in description["compile_definitions"]] + list(description["compile_options"])
    if "#define KOKKOS_ENABLE_OPENMP" in kokkos and "-fopenmp" not in compile_flags:
        compile_flags.append("-fopenmp")
    torch_lib = cpp_extension.library_paths()[0]
    paraseq_lib = Path(_library.LIBRARY_PATH).resolve()
    link_flags = ["-shared", str(paraseq_lib), *description["link_libraries"], f"-L{torch_lib}", "-lc10",
                  "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{paraseq_lib.parent}"]
    link_flags += [f"-Wl,-rpath,{Path(lib).parent}" for lib in description["link_libraries"] if "/" in lib]
    compiler_version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
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
                          "flags": compile_flags + link_flags})
    return compiler, compile_flags, link_flags, depends


# ---- the extension ---------------------------------------------------------------------------------

def _extension_source(namespace, field, method, dtype):
    scalar = "double" if dtype == torch.float64 else "float"
    return f"""// Generated by paraseq (python/paraseq/_compiled_odeint.py) from a right-hand side of your own:
// torch.ops.{namespace}.odeint and .odeint_backward for method {method}, {scalar}, on the CPU.
#include "odeint_checks.hpp"
#include "odeint_integrate.hpp"

#include <torch/library.h>

#include <type_traits>

namespace {{

{_field_codegen.POWER}
{field}
using Method = paraseq::ode::{METHOD_TYPES[method]};
using T = {scalar};
constexpr const char* forward_op = "{namespace}::odeint";
constexpr const char* backward_op = "{namespace}::odeint_backward";

paraseq::torch_bridge::OdeintArgs arguments(const at::Tensor& y0, const at::Tensor& t, const at::Tensor& shared,
                                            std::optional<double> step_size, double rtol, double atol,
                                            int64_t max_steps) {{
  return {{"user function", y0, t, std::nullopt, shared, 0, "{method}", step_size, rtol, atol, max_steps}};
}}

at::Tensor odeint(const at::Tensor& y0, const at::Tensor& t, const at::Tensor& shared, std::optional<double> step_size,
                  double rtol, double atol, int64_t max_steps) {{
  using namespace paraseq::torch_bridge;
  const OdeintArgs args = arguments(y0, t, shared, step_size, rtol, atol, max_steps);
  return run_odeint(forward_op, args, [&](const std::vector<double>& times, const OdeintTensors& tensors) {{
    integrate_field<T, Method, true>(forward_op, args, times, tensors, host_space(), UserField{{}});
  }});
}}

std::tuple<at::Tensor, at::Tensor, at::Tensor> odeint_backward(const at::Tensor& y0, const at::Tensor& t,
                                                               const at::Tensor& shared,
                                                               std::optional<double> step_size, double rtol,
                                                               double atol, int64_t max_steps,
                                                               const at::Tensor& grad_y) {{
  using namespace paraseq::torch_bridge;
  const OdeintArgs args = arguments(y0, t, shared, step_size, rtol, atol, max_steps);
  return run_odeint_backward(backward_op, args, grad_y, [&](const std::vector<double>& times,
                                                            const OdeintTensors& tensors) {{
    integrate_field_adjoint<T, Method, true>(backward_op, args, times, tensors, host_space(), UserField{{}});
  }});
}}

}} // namespace

TORCH_LIBRARY({namespace}, m) {{
  m.def("odeint(Tensor y0, Tensor t, Tensor shared, float? step_size, float rtol, float atol, int max_steps) "
        "-> Tensor");
  m.def("odeint_backward(Tensor y0, Tensor t, Tensor shared, float? step_size, float rtol, float atol, int max_steps, "
        "Tensor grad_y) -> (Tensor grad_y0, Tensor grad_params, Tensor grad_shared)");
}}

TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{
  m.impl("odeint", &odeint);
  m.impl("odeint_backward", &odeint_backward);
}}
"""


class Extension:
    """A loaded extension: its operators and the indices of the function's tensors it reads."""

    def __init__(self, namespace, used_tensors):
        self.namespace, self.used_tensors = namespace, used_tensors
        ops = getattr(torch.ops, namespace)
        self.odeint, self.backward = ops.odeint.default, ops.odeint_backward.default


_extensions: dict = {}  # namespace -> Extension, loaded in this process


def _compile(compiler, compile_flags, link_flags, source_path, library_path):
    temporary = library_path.with_name(f"{library_path.name}.{os.getpid()}.tmp")
    command = [compiler, *compile_flags, str(source_path), "-o", str(temporary), *link_flags]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        temporary.unlink(missing_ok=True)
        raise RuntimeError(f"odeint: compiling the generated extension {source_path} failed (exit status "
                           f"{result.returncode}); the compiler said:\n{result.stderr[-4000:]}")
    os.replace(temporary, library_path)
    statistics["compiles"] += 1
    statistics["last_compile_seconds"] = time.perf_counter() - started


def extension(token, tensors, n, dtype, method, one_trajectory):
    """The Extension of func (traced now) for n, the compute type, method and the CPU; compiles it
    unless the cache holds it. Raises _field_codegen.Unsupported or BuildUnavailable."""
    graph = _field_codegen.trace(token, tensors, n, dtype, "cpu", one_trajectory)
    field, used, _ = _field_codegen.generate(graph, n, one_trajectory, [tuple(x.shape) for x in tensors])
    for index in used:
        if tensors[index].dtype != dtype:
            raise _field_codegen.Unsupported(f"a tensor of dtype {tensors[index].dtype} in a function of a state "
                                             f"of dtype {dtype} (give its tensors the state's dtype)")
    compiler, compile_flags, link_flags, depends = build_settings()
    key = hashlib.sha256((_extension_source("NAMESPACE", field, method, dtype) + depends).encode()).hexdigest()
    namespace = f"paraseq_user_{key[:20]}"
    loaded = _extensions.get(namespace)
    if loaded is not None:
        return loaded
    directory = cache_dir() / "odeint"
    directory.mkdir(parents=True, exist_ok=True)
    source_path, library_path = directory / f"{namespace}.cpp", directory / f"{namespace}.so"
    with open(directory / f"{namespace}.lock", "w") as lock:  # one compile when processes race
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library_path.is_file():
            source_path.write_text(_extension_source(namespace, field, method, dtype))
            _compile(compiler, compile_flags, link_flags, source_path, library_path)
    torch.ops.load_library(str(library_path))
    statistics["loads"] += 1
    loaded = Extension(namespace, used)
    _register(loaded)
    _extensions[namespace] = loaded
    return loaded


# ---- fake kernels and autograd of the generated operators ------------------------------------------

def _register(ext):
    name = ext.namespace

    @torch.library.register_fake(f"{name}::odeint")
    def _odeint_fake(y0, t, shared, step_size, rtol, atol, max_steps):
        return y0.new_empty((y0.shape[0], t.shape[0], y0.shape[1]))

    @torch.library.register_fake(f"{name}::odeint_backward")
    def _backward_fake(y0, t, shared, step_size, rtol, atol, max_steps, grad_y):
        return torch.empty_like(y0), y0.new_empty((0,)), torch.empty_like(shared)

    def setup_context(ctx, inputs, output):
        y0, t, shared, step_size, rtol, atol, max_steps = inputs
        ctx.save_for_backward(y0, t, shared)
        ctx.settings = (step_size, rtol, atol, max_steps)

    def backward(ctx, grad):
        y0, t, shared = ctx.saved_tensors
        grad_y0, _, grad_shared = ext.backward(y0, t, shared, *ctx.settings, grad.contiguous())
        return grad_y0, None, grad_shared, None, None, None, None

    torch.library.register_autograd(f"{name}::odeint", backward, setup_context=setup_context)
    torch.library.register_autograd(f"{name}::odeint_backward", _user_odeint._refuse_double_backward,
                                    setup_context=lambda ctx, inputs, output: None)


# ---- choosing the path -----------------------------------------------------------------------------

@torch._dynamo.assume_constant_result
def choose(token, n, dtype, device_type, method, one_trajectory, compile) -> str:
    """The namespace of func's extension, or "" for the general path (under compile="auto", with
    a warning naming why). Runs at trace time under torch.compile (the result is a constant)."""
    with unset_fake_temporarily():  # under torch.compile the tracer's fake mode is active here
        return _choose(token, n, dtype, device_type, method, one_trajectory, compile)


def _choose(token, n, dtype, device_type, method, one_trajectory, compile):
    owner, function = _user_function.split(_user_function.entry(token).callable())
    tensors = [x.detach() for x in _user_function.found_tensors(owner, function)]
    compute_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    try:
        if device_type != "cpu":
            raise BuildUnavailable(f"the extensions are compiled for the CPU only, and y0 is on {device_type}")
        if dtype != compute_dtype:
            raise _field_codegen.Unsupported(f"a state of dtype {dtype} (the compiled path computes float32 and "
                                             "float64 states)")
        return extension(token, tensors, n, compute_dtype, method, one_trajectory).namespace
    except _field_codegen.Unsupported as error:
        reason = f"does not support {error}"
    except BuildUnavailable as error:
        reason = f"is not available here: {error}"
    if compile is True:
        raise NotImplementedError(f"odeint: argument 'compile' is True, but the compiled path {reason}; pass "
                                  "compile='auto' or False for the general path") from None
    warnings.warn(f"odeint: compile='auto' takes the general path for this function: the compiled path {reason}",
                  stacklevel=5)
    return ""


def run(namespace, y0, tensors, t, step_size, rtol, atol, max_steps):
    """The observed states [len(t), N, n] from func's extension."""
    ext = _extensions[namespace]
    used = [tensors[i].reshape(-1) for i in ext.used_tensors]
    shared = torch.cat(used) if used else y0.new_zeros((0,))
    observed = ext.odeint(y0, t, shared, step_size, rtol, atol, max_steps)
    return observed.transpose(0, 1)
