# Copyright Spack Project Developers. See COPYRIGHT file for details.
#
# SPDX-License-Identifier: (Apache-2.0 OR MIT)

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.python import PythonExtension

from spack.package import *


class Paraseq(CMakePackage, CudaPackage, PythonExtension):
    """paraseq: parallel solvers for sequential computations on Kokkos: ordered linear-recurrence
    scans, Newton-solved nonlinear RNNs and batched Runge-Kutta loops, with optional Kokkos
    Kernels GEMM and PyTorch operators."""

    homepage = "https://github.com/paraseq/paraseq"
    url = "https://github.com/paraseq/paraseq/archive/refs/tags/v0.1.0.tar.gz"
    git = "https://github.com/paraseq/paraseq.git"

    test_requires_compiler = True
    import_modules = ("paraseq",)

    # Releases (version("X.Y.Z", sha256=...)) are added from the project's tags; there is no tagged
    # release yet, so main is the only version.
    version("main", branch="main")

    variant("openmp", default=False, description="Run on the OpenMP backend of Kokkos")
    variant("kernels", default=False, description="Use Kokkos Kernels for GEMM")
    variant(
        "torch",
        default=False,
        description="Build the PyTorch operators and install the Python package",
    )
    variant(
        "mpi",
        default=False,
        description="Build paraseq::mpi, the linear scans over the ranks of an MPI communicator",
    )
    variant("tests", default=False, description="Build the unit tests")
    variant(
        "eti",
        default=True,
        description="Compile the built-in structures and cells once, into the paraseq library",
    )
    variant(
        "eti_only",
        default=False,
        description="Built-in structures and cells run only their compiled instances",
        when="+eti",
    )

    # paraseq is compiled for the one architecture of its Kokkos, which supports one at a time.
    variant(
        "cuda_arch",
        description="CUDA architecture",
        values=("none",) + CudaPackage.cuda_arch_values,
        default="none",
        multi=False,
        sticky=True,
        when="+cuda",
    )

    depends_on("cxx", type="build")
    depends_on("cmake@3.22:", type="build")

    # Kokkos provides the execution spaces: paraseq runs on whichever backends its Kokkos enables,
    # so the backend variants only select the Kokkos build. Tested with Kokkos 4.5 to 5.2.
    depends_on("kokkos@4.5:5")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos+cuda", when="+cuda")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    # Kokkos refuses +cuda without nvcc_wrapper unless it is compiled as a CMake CUDA language.
    requires(
        "^kokkos+wrapper",
        "^kokkos+cmake_lang",
        policy="any_of",
        when="+cuda",
        msg="paraseq +cuda needs a Kokkos built with +wrapper or +cmake_lang",
    )
    # Kokkos 5 always allows device lambdas; Kokkos 4 needs them switched on.
    requires("^kokkos+cuda_lambda", when="+cuda ^kokkos@:4")
    conflicts(
        "^kokkos+cuda",
        when="~cuda",
        msg="a CUDA Kokkos makes CUDA paraseq's default execution space; build paraseq +cuda",
    )
    conflicts(
        "^kokkos cxxstd=17",
        msg="paraseq is C++20; Kokkos must be built with cxxstd=20 or later to match",
    )

    with when("+kernels"):
        depends_on("kokkos-kernels@4.5:5")
        # The GEMM runs on paraseq's execution space: a CUDA paraseq needs CUDA Kokkos Kernels.
        depends_on("kokkos-kernels+cuda+execspace_cuda+memspace_cudaspace", when="+cuda")
        for _arch in CudaPackage.cuda_arch_values:
            depends_on(f"kokkos-kernels cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")

    with when("+torch"):
        extends("python")
        depends_on("python@3.10:", type=("build", "link", "run"))
        # find_package(Torch) uses the CMake package that py-torch installs with LibTorch.
        # Tested with PyTorch 2.11 (CUDA) and 2.14 (CPU).
        depends_on("py-torch@2.6:2.14", type=("build", "link", "run"))
        depends_on("py-torch~cuda", when="~cuda")
        for _arch in CudaPackage.cuda_arch_values:
            depends_on(f"py-torch+cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")

    depends_on("mpi", when="+mpi")
    depends_on("googletest+gmock", type=("build", "link"), when="+tests")

    conflicts("+cuda", when="cuda_arch=none", msg="+cuda needs a cuda_arch for Kokkos")

    def cmake_args(self):
        args = [
            # Spack's Kokkos, never the one paraseq can build itself.
            self.define("PARASEQ_KOKKOS", "SYSTEM"),
            self.define_from_variant("PARASEQ_ENABLE_KOKKOSKERNELS", "kernels"),
            self.define_from_variant("PARASEQ_ENABLE_TORCH", "torch"),
            # ON or OFF, never AUTO: an MPI found on the system is not the spec's.
            self.define_from_variant("PARASEQ_ENABLE_MPI", "mpi"),
            self.define_from_variant("PARASEQ_ENABLE_TESTS", "tests"),
            self.define_from_variant("PARASEQ_ETI", "eti"),
            self.define_from_variant("PARASEQ_ETI_ONLY", "eti_only"),
            # Neither is installed, and the benchmarks would need Google Benchmark.
            self.define("PARASEQ_ENABLE_BENCHMARKS", False),
            self.define("PARASEQ_ENABLE_EXAMPLES", False),
        ]
        if self.spec.satisfies("+cuda"):
            # nvcc_wrapper when Kokkos was built with it, the Spack compiler otherwise.
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        return args

    @run_after("install")
    def install_python_package(self):
        """The Python package, with the operator library next to its modules as in a wheel."""
        if not self.spec.satisfies("+torch"):
            return
        package_dir = join_path(python_platlib, "paraseq")
        install_tree(join_path(self.stage.source_path, "python", "paraseq"), package_dir)
        symlink(
            join_path(self.prefix.lib, "libparaseq_torch.so"),
            join_path(package_dir, "libparaseq_torch.so"),
        )

    @run_after("install")
    def cache_test_sources(self):
        """Keeps the examples, which `spack test run` builds against the installation."""
        cache_extra_test_sources(self, ["examples"])

    def test_imports(self):
        """import the installed Python package"""
        if not self.spec.satisfies("+torch"):
            raise SkipTest("the Python package is installed with +torch")
        super().test_imports()

    def test_examples(self):
        """build the examples against the installed paraseq and run them"""
        source_dir = join_path(self.test_suite.current_test_cache_dir, "examples")
        cmake = which(self.spec["cmake"].prefix.bin.cmake, required=True)
        ctest = which(self.spec["cmake"].prefix.bin.ctest, required=True)
        cxx = self["kokkos"].kokkos_cxx if self.spec.satisfies("+cuda") else spack_cxx
        with working_dir("build-examples", create=True):
            cmake(
                source_dir,
                self.define("CMAKE_PREFIX_PATH", get_cmake_prefix_path()),
                self.define("CMAKE_CXX_COMPILER", cxx),
                self.define("paraseq_ROOT", self.prefix),
                self.define("Kokkos_ROOT", self.spec["kokkos"].prefix),
            )
            cmake("--build", ".")
            ctest("--output-on-failure")
