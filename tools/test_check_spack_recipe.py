"""Tests of tools/check_spack_recipe.py: the real recipe passes, and broken copies fail with a message
that names the problem. Run with: python3 -m pytest tools/test_check_spack_recipe.py"""

import subprocess
import sys
from pathlib import Path

import pytest

import check_spack_recipe  # pytest puts tools/ on the import path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKER = REPO_ROOT / "tools" / "check_spack_recipe.py"
RECIPE = REPO_ROOT / "spack" / "spack_repo" / "paraseq" / "packages" / "paraseq" / "package.py"


def run_checker(*args):
    return subprocess.run([sys.executable, str(CHECKER), *map(str, args)], capture_output=True, text=True)


def edited_recipe(tmp_path, old, new):
    """A copy of the real recipe with one edit; fails if the recipe no longer has the text to edit."""
    text = RECIPE.read_text()
    assert old in text, f"the recipe no longer contains {old!r}; update this test"
    copy = tmp_path / "package.py"
    copy.write_text(text.replace(old, new, 1))
    return copy


def test_real_recipe_passes():
    result = run_checker()
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_unparsable_recipe_fails(tmp_path):
    recipe = edited_recipe(tmp_path, "    def cmake_args(self):", "    def cmake_args(self)")
    result = run_checker("--recipe", recipe)
    assert result.returncode == 1
    assert "the recipe does not parse" in result.stderr


def test_variant_mapped_to_missing_option_fails(tmp_path):
    recipe = edited_recipe(
        tmp_path,
        'self.define_from_variant("PARASEQ_ENABLE_KOKKOSKERNELS", "kernels")',
        'self.define_from_variant("PARASEQ_ENABLE_GEMM", "kernels")',
    )
    result = run_checker("--recipe", recipe)
    assert result.returncode == 1
    assert "variant 'kernels' maps to CMake option PARASEQ_ENABLE_GEMM, which no CMakeLists.txt" in result.stderr


def test_passed_option_that_does_not_exist_fails(tmp_path):
    recipe = edited_recipe(
        tmp_path,
        'self.define("PARASEQ_ENABLE_EXAMPLES", False)',
        'self.define("PARASEQ_ENABLE_DOCS", False)',
    )
    result = run_checker("--recipe", recipe)
    assert result.returncode == 1
    assert "cmake_args passes CMake option PARASEQ_ENABLE_DOCS, which no CMakeLists.txt" in result.stderr


def test_variant_without_cmake_option_fails(tmp_path):
    recipe = edited_recipe(
        tmp_path,
        '    variant("tests",',
        '    variant("hdf5", default=False, description="Write HDF5 files")\n    variant("tests",',
    )
    result = run_checker("--recipe", recipe)
    assert result.returncode == 1
    assert "variant 'hdf5' reaches no CMake option" in result.stderr


@pytest.mark.parametrize("kernels_folder, passes", [("kernels", True), ("build", False)])
def test_options_come_from_nested_cmake_files_outside_build_trees(tmp_path, kernels_folder, passes):
    """A tree that declares the project's options, the Kokkos Kernels one in a subfolder: it counts
    there, and not inside a configured build tree."""
    other_options = check_spack_recipe.declared_cmake_options(REPO_ROOT) - {"PARASEQ_ENABLE_KOKKOSKERNELS"}
    (tmp_path / "CMakeLists.txt").write_text("".join(f'option({name} "doc" OFF)\n' for name in other_options))
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeCache.txt").write_text("")
    (tmp_path / kernels_folder).mkdir(exist_ok=True)
    (tmp_path / kernels_folder / "CMakeLists.txt").write_text(
        'set(PARASEQ_ENABLE_KOKKOSKERNELS AUTO CACHE STRING "AUTO, ON or OFF")\n'
    )
    result = run_checker("--source-dir", tmp_path)
    assert (result.returncode == 0) == passes, result.stdout + result.stderr
    if not passes:
        assert "variant 'kernels' maps to CMake option PARASEQ_ENABLE_KOKKOSKERNELS, which no" in result.stderr


# Each rule that Spack or the Kokkos recipe enforces only at concretization or install time: a copy
# of the real recipe that breaks it fails the check with a message that names the rule.
@pytest.mark.parametrize(
    "old, new, message",
    [
        ("# SPDX-License-Identifier: (Apache-2.0 OR MIT)\n", "", "SPDX header"),
        ("        multi=False,\n        sticky=True,", "        multi=True,\n        sticky=True,", "multi=False"),
        ('        "^kokkos+wrapper",\n        "^kokkos+cmake_lang",\n', '        "^kokkos+serial",\n', "nvcc_wrapper"),
        ('depends_on("kokkos@4.5:5")', 'depends_on("kokkos@4.5:")', "kokkos has no upper bound"),
        ('depends_on("kokkos-kernels@4.5:5")', 'depends_on("kokkos-kernels@4.5:")', "kokkos-kernels has no upper bound"),
        ('depends_on("py-torch@2.6:2.14", ', 'depends_on("py-torch@2.6:", ', "py-torch has no upper bound"),
    ],
)
def test_recipe_breaking_a_spack_rule_fails(tmp_path, old, new, message):
    recipe = edited_recipe(tmp_path, old, new)
    result = run_checker("--recipe", recipe)
    assert result.returncode == 1
    assert message in result.stderr
