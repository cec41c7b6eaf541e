"""Registers, stack frame, shared and local memory of CUDA kernels, from `cuobjdump -res-usage` on stdin, for the
kernels whose demangled name matches a regular expression: a JSON list on stdout, one entry per kernel and
architecture, the name cut to the functor's type (Kokkos wraps every functor in its launch templates).

    cuobjdump -res-usage libparaseq.so | python3 perf_tests/resource_usage.py 'OnePassNewton<|ScanKernel<'

ptxas's own report (`nvcc -Xptxas -v`) gives the same numbers while compiling; this reads them from what was built.
"""
import json
import re
import shutil
import subprocess
import sys

NAME_LIMIT = 400  # characters of a demangled name kept: enough for the functor and its first arguments


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None or not names:
        return names
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def kernels(lines):
    """(architecture, mangled name, resources) for each function of cuobjdump's report."""
    arch, name = None, None
    for line in lines:
        line = line.strip()
        if line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.startswith("Function "):
            name = line[len("Function "):].rstrip(":")
        elif name is not None and line.startswith("REG:"):
            resources = {key.lower(): int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            yield arch, name, resources
            name = None


def main():
    pattern = re.compile(sys.argv[1])
    found = list(kernels(sys.stdin))
    names = demangle([name for _, name, _ in found])
    out, seen = [], set()
    for (arch, _, resources), name in zip(found, names):
        match = pattern.search(name)
        if match is None:
            continue
        functor = name[match.start():][:NAME_LIMIT]
        if (arch, functor) in seen:  # the same kernel in two objects
            continue
        seen.add((arch, functor))
        out.append({"arch": arch, "kernel": functor, **resources})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
