"""docs/api.md is what tools/api_reference.py generates from the sources: the API reference cannot
drift from the docstrings and the public headers."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_api_reference_is_current():
    spec = importlib.util.spec_from_file_location("api_reference", REPO / "tools" / "api_reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (REPO / "docs" / "api.md").read_text() == generator.generate(), \
        "docs/api.md is not current: run python3 tools/api_reference.py (in the main environment)"
