#!/usr/bin/env python3
"""Generates docs/api.md, the API reference, from the sources.

    python3 tools/api_reference.py            # writes docs/api.md
    python3 tools/api_reference.py --check    # fails if docs/api.md is not what the sources give

The Python part is every name in paraseq.__all__ and every field of paraseq.fields, with its
signature and its numpydoc docstring (imports paraseq, so it needs torch and the operator library).
The C++ part is every declaration at namespace scope of paraseq, paraseq::mpi and paraseq::ode in
the public headers (not in a `detail` namespace), with the comment above it.
"""

import argparse
import inspect
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "docs" / "api.md"
HEADERS = [
    "core/linear_scan.hpp", "core/mpi_scan.hpp", "core/structure.hpp", "core/views.hpp", "core/ordered_scan.hpp",
    "core/workspace.hpp",
    "solvers/newton_config.hpp", "solvers/cell.hpp", "solvers/cells.hpp", "solvers/newton.hpp", "solvers/cell_step.hpp",
    "solvers/newton_backward.hpp", "solvers/mpi_newton.hpp", "solvers/input_projection.hpp",
    "loops/options.hpp", "loops/field.hpp", "loops/fields.hpp", "loops/tableaus.hpp", "loops/integrate.hpp",
]
SECTION = re.compile(r"^(Parameters|Returns|Raises|Attributes|Notes)\n-+$", re.M)


# --- Python: numpydoc to Markdown.

def markdown_docstring(doc):
    """The summary and extended text as paragraphs; Parameters/Returns/Raises/Attributes as lists."""
    parts = SECTION.split(inspect.cleandoc(doc))
    lines = [parts[0].strip(), ""]
    for title, body in zip(parts[1::2], parts[2::2]):
        lines.append(f"**{title}**")
        lines.append("")
        if title == "Notes":
            lines += [body.strip(), ""]
            continue
        entry = None
        for line in body.strip("\n").splitlines():
            if line and not line.startswith(" "):
                if entry:
                    lines.append(entry)
                name, _, kind = line.partition(" : ")
                entry = f"- `{name.strip()}`" + (f" ({kind.strip()})" if kind else "") + ":"
            elif entry is not None:
                entry += " " + line.strip()
        if entry:
            lines.append(entry)
        lines.append("")
    return "\n".join(lines)


def python_entries():
    import paraseq
    import paraseq.fields as fields
    names = [(f"paraseq.{name}", getattr(paraseq, name)) for name in paraseq.__all__
             if name not in ("fields", "LIBRARY_PATH")]
    names += [(f"paraseq.fields.{name}", getattr(fields, name))
              for name in ("DampedOscillator", "LotkaVolterra", "SIR", "Linear", "MLP")]
    out = ["## Python (`import paraseq`)", "",
           "`paraseq.LIBRARY_PATH` is the path of the operator library that was loaded. Every function raises "
           "the exceptions its Raises section lists, with a message naming the argument, what was given and "
           "what was expected.", ""]
    for qualified, obj in names:
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = ""
        kind = "class" if inspect.isclass(obj) else "function"
        out += [f"### `{qualified}`", "", f"```python\n{kind} {qualified.split('.')[-1]}{signature}\n```", ""]
        out.append(markdown_docstring(obj.__doc__ or "(no docstring)"))
        if inspect.isclass(obj):
            for method in ("forward", "step", "sequential"):
                member = obj.__dict__.get(method)
                if member is not None and member.__doc__:
                    out += [f"`{method}{inspect.signature(member)}`: {inspect.cleandoc(member.__doc__)}", ""]
    return out


# --- C++: declarations at namespace scope, outside `detail`.

def strip_code(line):
    """The line without its // comment and string contents (for counting braces)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0].replace("{}", "")  # an empty initialiser (`= {}`) opens no block


def header_entries(path):
    entries, comment, statement = [], [], []
    stack = []  # per open brace: "namespace", "detail" or "block"
    for raw in path.read_text().splitlines():
        line = raw.strip()
        at_namespace_scope = all(kind == "namespace" for kind in stack) and stack
        if not statement and at_namespace_scope:
            if line.startswith("//"):
                comment.append(line[2:].strip())
                continue
            if not line or line.startswith("#"):
                comment = [] if not line else comment
                continue
        code = strip_code(raw)
        if not statement and at_namespace_scope and not re.match(r"(namespace|}|extern template|template [a-z])", line):
            statement = [line]
        elif statement:
            statement.append(line)
        for char in code:
            if char == "{":
                opening = code.split("{")[0].strip()
                if opening.startswith("namespace"):
                    stack.append("detail" if "detail" in opening else "namespace")
                else:
                    stack.append("block")
                if statement and len(stack) >= 1 and stack[-1] == "block" and all(k == "namespace" for k in stack[:-1]):
                    entries.append((comment, statement))
                    statement, comment = [], []
            elif char == "}":
                stack.pop()
            elif char == ";" and statement and all(kind == "namespace" for kind in stack):
                entries.append((comment, statement))
                statement, comment = [], []
        if not statement and line.startswith("namespace"):
            comment = []
    return entries


def declaration_text(statement):
    text = " ".join(statement).replace("{}", "\0")
    text = re.sub(r"\s*\{.*$", "", text).rstrip(";").strip().replace("\0", "{}")
    return re.sub(r"\s+", " ", text)


def cpp_entries():
    out = ["## C++ (`#include <paraseq/paraseq.hpp>`)", "",
           "Every declaration of the public headers at namespace scope (`paraseq`, `paraseq::mpi`, `paraseq::ode`), "
           "with the comment above it; the headers say more (`paraseq/core/mpi_scan.hpp` and "
           "`paraseq/solvers/mpi_newton.hpp` are included when paraseq was built with MPI, `PARASEQ_HAVE_MPI`). Every function checks its arguments and throws "
           "`std::invalid_argument` naming the argument, what was given and what was expected.", ""]
    for header in HEADERS:
        entries = [(c, s) for c, s in header_entries(REPO / "src" / header) if s]
        if not entries:
            continue
        out += [f"### `paraseq/{header}`", ""]
        for comment, statement in entries:
            out += ["```cpp", declaration_text(statement), "```", ""]
            if comment:
                out += [" ".join(comment), ""]
    return out


def generate():
    lines = ["# API reference", "",
             "Generated by `tools/api_reference.py` from the sources (CI checks that it is current). The guides: "
             "[torch.md](torch.md) (Python), [solvers.md](solvers.md), [loops.md](loops.md), "
             "[numerics.md](numerics.md).", ""]
    lines += python_entries() + cpp_entries()
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/api.md differs from the sources")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print("docs/api.md is not current: run python3 tools/api_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
