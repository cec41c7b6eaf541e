"""perf_tests/compare.py at toy sizes on the CPU: every comparison runs, and paraseq agrees with the
independent PyTorch implementations it is timed against (the eager Newton solve, the sequential
loop, the eager and the compiled RK4 loops), so the GPU comparison measures equal answers."""

import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPTIONAL = {"torchdiffeq": "torchdiffeq", "diffrax": "diffrax"}


def test_compare_script_runs_every_comparison_and_agrees(tmp_path):
    out = tmp_path / "compare.json"
    subprocess.run([sys.executable, str(ROOT / "perf_tests" / "compare.py"), "--quick", "--device", "cpu",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())["results"]
    implementations = {entry["implementation"] for entry in results}
    for expected in ("paraseq fused", "paraseq scan", "paraseq sequential", "paraseq auto",
                     "PyTorch eager Newton K=3 (doubling scan)", "PyTorch sequential loop", "paraseq odeint rk4",
                     "paraseq odeint dopri5", "PyTorch eager RK4 loop", "torch.compile unrolled RK4 loop"):
        assert expected in implementations
    for entry in results:
        if "missing" in entry:  # only an optional package that is not installed may be missing
            assert entry["implementation"] in OPTIONAL
            assert importlib.util.find_spec(OPTIONAL[entry["implementation"]]) is None
            continue
        assert entry["ms"] > 0
        for key, value in entry.items():
            if key.startswith("max_abs_diff"):
                assert value <= 1e-5, (entry["implementation"], key, value)
