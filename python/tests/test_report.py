"""perf_tests/report.py on a run_benchmarks.py report: the Newton benchmarks' automatic mode against the fastest
mode forced at the same shape, with the ratios above docs/performance.md's 10% marked, and shapes without an
automatic or a forced measurement left out."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def result(name, ms):
    return {"name": f"{name}/manual_time", "seconds": ms * 1e-3, "GBps": 1.0, "GFLOPps": 1.0,
            "pct_copy_bandwidth": None}


def test_report_compares_the_automatic_mode_with_the_fastest_forced_mode(tmp_path):
    report = {"machine": {"gpu": "a GPU"}, "versions": {}, "context": {}, "results": [
        result("gru_forward/B:1/T:65536/H:256/mode:1", 5.0), result("gru_forward/B:1/T:65536/H:256/mode:4", 0.5),
        result("gru_forward/B:1/T:65536/H:256/mode:0", 0.52),
        result("gru_forward/B:1/T:262144/H:1/mode:1", 0.36), result("gru_forward/B:1/T:262144/H:1/mode:3", 0.9),
        result("gru_forward/B:1/T:262144/H:1/mode:0", 0.40),
        result("gru_forward/B:8/T:16384/H:512/mode:2", 1.0),  # no automatic measurement: left out
        result("gru_forward/B:2/T:16/H:4/mode:0", 1.0),  # no forced mode: left out
    ]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    printed = subprocess.run([sys.executable, str(ROOT / "perf_tests" / "report.py"), str(path)],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    table = printed[printed.index("| benchmark | automatic | fastest forced mode"):].strip().splitlines()
    assert table[2:] == [
        "| `gru_forward/B:1/T:65536/H:256` | 0.520 ms | one_pass, 0.500 ms | 1.04x |",
        "| `gru_forward/B:1/T:262144/H:1` | 0.400 ms | newton, 0.360 ms | 1.11x (over 1.10x) |",
    ]
