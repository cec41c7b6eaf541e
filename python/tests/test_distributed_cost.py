"""perf_tests/distributed_cost.py at toy sizes on 2 gloo CPU ranks: it runs, each rank's slice equals the
one-process result, and the bytes each rank sends are the cost model of docs/distributed.md: per
linear_scan one all_gather of the maps (B x 2N values for a diagonal scan) after the agreement (24
int64); per Newton iteration one boundary (B x H) and one map exchange (B x 2H), one more boundary for
the solution, and one reduction (whether any rank needs the adjoint)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLOAT64 = 8
AGREEMENT_BYTES = 24 * 8


def test_distributed_cost_script_runs_and_counts_the_documented_bytes(tmp_path):
    out = tmp_path / "distributed_cost.json"
    subprocess.run([sys.executable, str(ROOT / "perf_tests" / "distributed_cost.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    report = json.loads(out.read_text())
    distributed = [row for row in report["results"] if row["ranks"] == 2]
    assert {row["workload"] for row in distributed} == {"linear_scan diag float64", "newton_apply ParaGRU float64"}
    for row in distributed:
        assert row["max_abs_error_vs_one_process"] <= 1e-12, row["workload"]
        assert row["median_s"] > 0 and row["transfer_s"] > 0
        if row["workload"].startswith("linear_scan"):
            B, N = row["B"], row["N"]
            assert row["bytes_sent_per_rank"] == {"agreement": AGREEMENT_BYTES, "maps": B * 2 * N * FLOAT64}
            assert row["collective_calls"] == {"agreement": 1, "maps": 1}
        else:
            B, H, K = row["B"], row["H"], row["iterations"]
            assert row["collective_calls"] == {"agreement": 1, "boundary": K + 1, "maps": K, "reduction": 1}
            assert row["bytes_sent_per_rank"] == {"agreement": AGREEMENT_BYTES, "boundary": (K + 1) * B * H * FLOAT64,
                                                  "maps": K * B * 2 * H * FLOAT64, "reduction": FLOAT64}
