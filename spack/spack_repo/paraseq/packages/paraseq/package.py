import os

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *

# paraseq is not published yet, so the recipe names the source tree it ships in: this file lies in
# spack/spack_repo/paraseq/packages/paraseq/, five levels below the top of that tree. Replace
# homepage and git with the public repository's address once there is one.
_SOURCE_TREE = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 5))


class Paraseq(CMakePackage, CudaPackage):
    """paraseq: parallel solvers for sequential computations (linear recurrences) on Kokkos, with
    optional Kokkos Kernels GEMM and a LibTorch bridge."""

    homepage = f"file://{_SOURCE_TREE}"
    git = f"file://{_SOURCE_TREE}"

    # No license() or maintainers(): the project has chosen neither a license nor maintainer
    # accounts yet, and the recipe states only what the project has decided.

    version("main", branch="main")

    variant("openmp", default=False, description="Run on the OpenMP backend of Kokkos")
    variant("kernels", default=False, description="Use Kokkos Kernels for GEMM")
    variant(
        "torch", default=False, description="Build the LibTorch bridge: torch operators and Python package"
    )
    variant("tests", default=False, description="Build the unit tests")

    depends_on("cxx", type="build")
    depends_on("cmake@3.22:", type="build")

    # Kokkos provides the execution spaces: paraseq runs on whichever backends its Kokkos enables,
    # so the backend variants only select the Kokkos build.
    depends_on("kokkos@4.5:")
    depends_on("kokkos+openmp", when="+openmp")
    for arch in CudaPackage.cuda_arch_values:
        cuda_dep = f"+cuda cuda_arch={arch}"
        depends_on(f"kokkos {cuda_dep}", when=cuda_dep)
        depends_on(f"py-torch {cuda_dep}", when=f"+torch {cuda_dep}")
    # Kokkos 5 always allows device lambdas; Kokkos 4 needs them switched on.
    requires("^kokkos+cuda_lambda", when="+cuda ^kokkos@:4")

    depends_on("kokkos-kernels@4.5:", when="+kernels")
    # py-torch installs LibTorch with its CMake package, which find_package(Torch) picks up.
    depends_on("py-torch", when="+torch")
    depends_on("googletest+gmock", type=("build", "link"), when="+tests")

    conflicts("+cuda", when="cuda_arch=none", msg="+cuda needs a cuda_arch for Kokkos")
    conflicts(
        "^kokkos+cuda",
        when="~cuda",
        msg="a CUDA Kokkos makes CUDA paraseq's default execution space; build paraseq +cuda",
    )
    conflicts(
        "^kokkos cxxstd=17",
        msg="paraseq is C++20; Kokkos must be built with cxxstd=20 or later to match",
    )

    def cmake_args(self):
        args = [
            self.define_from_variant("PARASEQ_ENABLE_KOKKOSKERNELS", "kernels"),
            self.define_from_variant("PARASEQ_ENABLE_TORCH", "torch"),
            self.define_from_variant("PARASEQ_ENABLE_TESTS", "tests"),
            # Both default to ON in a top-level build; neither is installed, and the benchmarks
            # would need Google Benchmark.
            self.define("PARASEQ_ENABLE_BENCHMARKS", False),
            self.define("PARASEQ_ENABLE_EXAMPLES", False),
        ]
        if self.spec.satisfies("+cuda"):
            # nvcc_wrapper when Kokkos was built with it, the Spack compiler otherwise.
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        return args
