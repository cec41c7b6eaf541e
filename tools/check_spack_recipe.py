#!/usr/bin/env python3
"""Checks paraseq's Spack recipe against the project's CMake options, without Spack.

The recipe is read with ast (Spack is never imported), and the options are read from every
CMakeLists.txt and CMake module of the source tree: option(), cmake_dependent_option(),
set(... CACHE ...) and paraseq_choice_option() (cmake/paraseqChoiceOption.cmake). The check fails when
  - the recipe does not parse;
  - a variant reaches no CMake option: cmake_args does not map it with self.define_from_variant, and
    no depends_on("<dependency>+<variant>", when="+<variant>") forwards it to a dependency;
  - cmake_args passes a CMake option that no CMake file declares;
  - the recipe breaks a rule that Spack or its Kokkos recipe enforces only when a spec concretizes
    or installs (RULES below): the SPDX header, a single-valued cuda_arch (Kokkos takes one), a
    Kokkos with nvcc_wrapper or CMake's CUDA language under +cuda, upper bounds on Kokkos, Kokkos
    Kernels and PyTorch.
Variants that CMakePackage and CudaPackage declare, CMake's own variables (CMAKE_*,
BUILD_SHARED_LIBS) and find_package hints (<Package>_ROOT, <Package>_DIR) are not the project's,
and are not checked.

usage: tools/check_spack_recipe.py [--recipe PACKAGE_PY] [--source-dir DIR]
"""

import argparse
import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO_ROOT / "spack" / "spack_repo" / "paraseq" / "packages" / "paraseq" / "package.py"

# Declared by the build-system base classes, which also handle them.
INHERITED_VARIANTS = {"build_system", "build_type", "generator", "ipo", "cuda", "cuda_arch"}

# One CMake token. Comments and bracket arguments come first so that a '#' or ')' inside them is
# not read as code.
CMAKE_TOKEN = re.compile(
    r"""
      (?P<comment>\#\[(?P<comment_eq>=*)\[.*?\](?P=comment_eq)\] | \#[^\n]*)
    | \[(?P<bracket_eq>=*)\[(?P<bracket>.*?)\](?P=bracket_eq)\]
    | "(?P<quoted>(?:\\.|[^"\\])*)"
    | (?P<open>\() | (?P<close>\))
    | (?P<unquoted>(?:[^\s()\#"\\]|\\.)+)
    | (?P<space>\s+)
    """,
    re.DOTALL | re.VERBOSE,
)


class RecipeError(Exception):
    """The recipe cannot be read at all; nothing else is checked."""


@dataclass
class CMakeDefine:
    option: str
    variant: str | None  # None for self.define, the variant for self.define_from_variant
    line: int


SPDX_HEADER = (
    "# Copyright Spack Project Developers. See COPYRIGHT file for details.\n"
    "#\n"
    "# SPDX-License-Identifier: (Apache-2.0 OR MIT)\n"
)
# Dependencies whose newer major versions have broken their users: each needs an upper bound.
BOUNDED_DEPENDENCIES = ("kokkos", "kokkos-kernels", "py-torch")
# Kokkos' recipe refuses +cuda unless Kokkos is built with one of these (or %clang / %cce).
CUDA_KOKKOS_BUILDS = {"^kokkos+wrapper", "^kokkos+cmake_lang"}


@dataclass
class Directive:
    name: str
    args: list[str | None]  # positional string literals (None where not a literal)
    keywords: dict[str, ast.expr]
    line: int


@dataclass
class Recipe:
    source: str
    directives: list[Directive]
    variants: dict[str, int]  # name -> line
    forwarded: set[str]  # variants that depends_on forwards to a dependency
    defines: list[CMakeDefine]
    unreadable: list[str]  # problems that keep parts of the recipe from being checked


def shown(path):
    """The path as messages show it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    inside = resolved.is_relative_to(REPO_ROOT) and resolved != REPO_ROOT
    return str(resolved.relative_to(REPO_ROOT)) if inside else str(path)


def is_external_cmake_variable(name):
    return name.startswith("CMAKE_") or name == "BUILD_SHARED_LIBS" or name.endswith(("_ROOT", "_DIR"))


def string_value(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def class_level_calls(class_node):
    """The calls in the class body (directives), leaving out those inside methods."""
    pending = list(class_node.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def called_name(call):
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def forwarded_variant(call):
    """The variant that depends_on("<dep>+<variant>", when="+<variant>") forwards, or None."""
    spec = string_value(call.args[0]) if call.args else None
    when = next((string_value(k.value) for k in call.keywords if k.arg == "when"), None)
    match = re.fullmatch(r"\+([\w-]+)", (when or "").strip())
    if spec and match and re.search(rf"\+{re.escape(match[1])}(?![\w-])", spec):
        return match[1]
    return None


def read_recipe(path):
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as error:
        raise RecipeError(f"{shown(path)}: cannot be read: {error.strerror}") from error
    try:
        module = ast.parse(source, filename=str(path))
    except SyntaxError as error:
        raise RecipeError(f"{shown(path)}:{error.lineno}: the recipe does not parse: {error.msg}") from error

    package = next(
        (
            node
            for node in module.body
            if isinstance(node, ast.ClassDef)
            and any(getattr(base, "id", getattr(base, "attr", None)) == "CMakePackage" for base in node.bases)
        ),
        None,
    )
    if package is None:
        raise RecipeError(f"{shown(path)}: no class derives from CMakePackage")

    recipe = Recipe(source=source, directives=[], variants={}, forwarded=set(), defines=[], unreadable=[])
    for call in class_level_calls(package):
        name = called_name(call)
        recipe.directives.append(
            Directive(name, [string_value(a) for a in call.args], {k.arg: k.value for k in call.keywords}, call.lineno)
        )
        if name == "variant":
            variant = string_value(call.args[0]) if call.args else None
            if variant is None:
                recipe.unreadable.append(
                    f"{shown(path)}:{call.lineno}: the variant's name is not a string literal"
                )
            else:
                recipe.variants[variant] = call.lineno
        elif name == "depends_on" and (variant := forwarded_variant(call)):
            recipe.forwarded.add(variant)

    cmake_args = next(
        (node for node in package.body if isinstance(node, ast.FunctionDef) and node.name == "cmake_args"),
        None,
    )
    if cmake_args is None:
        raise RecipeError(f"{shown(path)}: the class has no cmake_args method")
    for call in ast.walk(cmake_args):
        if not isinstance(call, ast.Call) or called_name(call) not in ("define", "define_from_variant"):
            continue
        option = string_value(call.args[0]) if call.args else None
        if option is None:
            recipe.unreadable.append(
                f"{shown(path)}:{call.lineno}: the CMake option's name is not a string literal"
            )
            continue
        variant = None
        if called_name(call) == "define_from_variant":
            # Spack's define_from_variant takes the variant positionally or by keyword, and defaults
            # to the option's name in lower case.
            variant_nodes = call.args[1:2] + [k.value for k in call.keywords if k.arg == "variant"]
            variant = string_value(variant_nodes[0]) if variant_nodes else option.lower()
            if variant is None:
                recipe.unreadable.append(
                    f"{shown(path)}:{call.lineno}: the variant's name is not a string literal"
                )
                continue
        recipe.defines.append(CMakeDefine(option, variant, call.lineno))
    return recipe


def cmake_commands(text):
    """Yields (command name in lower case, arguments) for each command invocation in CMake code."""
    tokens = []
    for match in CMAKE_TOKEN.finditer(text):
        kind = match.lastgroup
        if kind in ("open", "close"):
            tokens.append((kind, None))
        elif kind in ("quoted", "unquoted", "bracket"):
            tokens.append(("argument", match[kind]))
    index = 0
    while index < len(tokens):
        kind, value = tokens[index]
        if kind != "argument" or index + 1 == len(tokens) or tokens[index + 1][0] != "open":
            index += 1
            continue
        depth, arguments, index = 1, [], index + 2
        while index < len(tokens) and depth:
            inner_kind, inner_value = tokens[index]
            depth += {"open": 1, "close": -1}.get(inner_kind, 0)
            if inner_kind == "argument":
                arguments.append(inner_value)
            index += 1
        yield value.lower(), arguments


def declared_cmake_options(source_dir):
    """The cache options that the source tree's CMake files declare."""
    options = set()
    for directory, subdirectories, files in os.walk(source_dir):
        # Hidden folders (.git, fetched sources) and configured build trees hold no project options.
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if not name.startswith(".")
            and not os.path.exists(os.path.join(directory, name, "CMakeCache.txt"))
        )
        for name in sorted(files):
            if name != "CMakeLists.txt" and not name.endswith(".cmake"):
                continue
            text = Path(directory, name).read_text(encoding="utf-8", errors="replace")
            for command, arguments in cmake_commands(text):
                declares = command in ("option", "cmake_dependent_option", "paraseq_choice_option") or (
                    command == "set" and "CACHE" in arguments[1:]
                )
                if declares and arguments and "${" not in arguments[0]:
                    options.add(arguments[0])
    return options


def keyword_string(directive, key):
    node = directive.keywords.get(key)
    return string_value(node) if node is not None else None


def rule_errors(recipe, recipe_path):
    """The rules that only a concretization or an install would otherwise reveal."""
    errors = []
    where = shown(recipe_path)
    if not recipe.source.startswith(SPDX_HEADER):
        errors.append(f"{where}:1: the recipe must start with Spack's copyright and SPDX header:\n{SPDX_HEADER}")

    cuda_arch = [d for d in recipe.directives if d.name == "variant" and d.args[:1] == ["cuda_arch"]]
    multi = cuda_arch[0].keywords.get("multi") if cuda_arch else None
    if not (isinstance(multi, ast.Constant) and multi.value is False):
        line = cuda_arch[0].line if cuda_arch else 1
        errors.append(
            f"{where}:{line}: declare variant(\"cuda_arch\", ..., multi=False, when=\"+cuda\"): Kokkos "
            "builds for one CUDA architecture, so a multi-valued cuda_arch does not concretize"
        )

    cuda_requirement = any(
        d.name == "requires"
        and keyword_string(d, "when") == "+cuda"
        and CUDA_KOKKOS_BUILDS & {arg.replace(" ", "") for arg in d.args if arg}
        for d in recipe.directives
    )
    if not cuda_requirement:
        errors.append(
            f'{where}: +cuda needs requires("^kokkos+wrapper", "^kokkos+cmake_lang", policy="any_of", '
            'when="+cuda"): Kokkos refuses +cuda without nvcc_wrapper unless it is compiled as a CMake '
            "CUDA language (or with %clang)"
        )

    for dependency in BOUNDED_DEPENDENCIES:
        specs = [
            d.args[0]
            for d in recipe.directives
            if d.name == "depends_on" and d.args and d.args[0]
            and re.match(rf"{re.escape(dependency)}(@|$|[\s+~])", d.args[0])
        ]
        if specs and not any(re.search(r"@[\w.]*:[\w.]+", spec) for spec in specs):
            errors.append(
                f"{where}: depends_on(\"{dependency}@LOW:HIGH\"): {dependency} has no upper bound; "
                "bound it by the newest version paraseq is tested with"
            )
    return errors


def check(recipe_path, source_dir):
    """Returns (errors, summary)."""
    try:
        recipe = read_recipe(recipe_path)
    except RecipeError as error:
        return [str(error)], None
    declared = declared_cmake_options(source_dir)
    errors = list(recipe.unreadable) + rule_errors(recipe, recipe_path)
    where = f"CMakeLists.txt or CMake module under {shown(source_dir)}"
    known_variants = set(recipe.variants) | INHERITED_VARIANTS

    for define in recipe.defines:
        location = f"{shown(recipe_path)}:{define.line}"
        if define.variant is not None and define.variant not in known_variants:
            errors.append(
                f"{location}: {define.option} is set from variant '{define.variant}', "
                "which the recipe does not declare"
            )
        if is_external_cmake_variable(define.option) or define.option in declared:
            continue
        if define.variant is None:
            errors.append(
                f"{location}: cmake_args passes CMake option {define.option}, which no {where} declares"
            )
        else:
            errors.append(
                f"{location}: variant '{define.variant}' maps to CMake option {define.option}, "
                f"which no {where} declares"
            )

    mapped = {define.variant for define in recipe.defines if define.variant is not None}
    for variant, line in recipe.variants.items():
        if variant in INHERITED_VARIANTS or variant in mapped or variant in recipe.forwarded:
            continue
        errors.append(
            f"{shown(recipe_path)}:{line}: variant '{variant}' reaches no CMake option: map it in "
            "cmake_args with self.define_from_variant, or forward it with "
            f'depends_on("<dependency>+{variant}", when="+{variant}")'
        )

    own_variants = [variant for variant in recipe.variants if variant not in INHERITED_VARIANTS]
    summary = (
        f"{shown(recipe_path)}: OK: {len(own_variants)} variants "
        f"({len(mapped & set(own_variants))} mapped to CMake options, "
        f"{len((set(own_variants) - mapped) & recipe.forwarded)} forwarded to dependencies), "
        f"{len(recipe.defines)} CMake options passed; "
        f"{len(declared)} options declared under {shown(source_dir)}"
    )
    return errors, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="the package.py to check")
    parser.add_argument(
        "--source-dir", type=Path, default=REPO_ROOT, help="the source tree whose CMake options count"
    )
    args = parser.parse_args()
    errors, summary = check(args.recipe, args.source_dir)
    if errors:
        for error in errors:
            print(f"check_spack_recipe: {error}", file=sys.stderr)
        return 1
    print(f"check_spack_recipe: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
