"""Finds and loads the compiled operators (libparaseq_torch.so) into torch.ops.paraseq.

Search order: the PARASEQ_TORCH_LIBRARY environment variable (a path to the library); the package
directory (an installed wheel); the repository's build tree, build/main first (what `tools/dev build`
makes), then the most recently built build/*/src/adapters/torch.
"""

import os
from pathlib import Path

import torch

LIBRARY_NAME = "libparaseq_torch.so"


def candidate_paths():
    configured = os.environ.get("PARASEQ_TORCH_LIBRARY")
    if configured:
        return [Path(configured)]
    package_dir = Path(__file__).resolve().parent
    build_dir = package_dir.parent.parent / "build"
    in_builds = sorted(build_dir.glob(f"*/src/adapters/torch/{LIBRARY_NAME}"),
                       key=lambda path: path.stat().st_mtime, reverse=True)
    preset = build_dir / "main" / "src" / "adapters" / "torch" / LIBRARY_NAME
    return [package_dir / LIBRARY_NAME, preset] + [path for path in in_builds if path != preset]


def load():
    """Loads the library once; returns its path."""
    candidates = candidate_paths()
    for path in candidates:
        if path.is_file():
            torch.ops.load_library(str(path))
            return path
    searched = "\n  ".join(str(path) for path in candidates)
    raise ImportError(
        f"paraseq: the compiled operators ({LIBRARY_NAME}) were not found. Searched:\n  {searched}\n"
        "Build them (`tools/dev build`, or cmake with -DPARASEQ_ENABLE_TORCH=ON), install the package "
        "(`pip install .`), or set PARASEQ_TORCH_LIBRARY to the library's path.")


LIBRARY_PATH = load()
