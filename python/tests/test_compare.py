"""perf_tests/compare.py at toy sizes on the CPU: every comparison runs, and paraseq agrees with the
independent PyTorch implementations it is timed against (the eager Newton solve, the sequential
loop, the eager and the compiled RK4 loops) and with every peer library that runs here, so the GPU
comparison measures equal answers. Every peer is in the report for each of its workloads: measured,
refused (its CUDA-only kernels, on the CPU) or missing, with the error that importing it raises."""

import importlib.metadata
import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER_WORKLOADS = {
    "pararnn-torch": {"gru_forward", "gru_layer_forward", "gru_layer_forward_backward", "scan_forward",
                      "scan_forward_backward", "user_gru_forward", "user_gru_forward_backward",
                      "gru_forward_against_T", "gru_forward_against_BH", "scan_against_T", "gru_head_forward",
                      "gru_head_forward_backward", "gru_packed_forward", "gru_packed_forward_backward",
                      "slstm_forward", "slstm_forward_backward", "gru_decode", "slstm_decode"},
    "accelerated-scan": {"scan_forward", "scan_forward_backward", "scan_against_T"},
    "flash-linear-attention": {"scan_forward", "scan_forward_backward"},
    "torchode": {"rk4_fixed", "dopri5_adaptive"},
    "torchdiffeq": {"rk4_fixed", "dopri5_adaptive", "user_rk4_fixed"},
}
# Triton and CUDA kernels: on the CPU they refuse, where their module imports at all (accelerated_scan.warp
# compiles its CUDA source when imported, which needs the CUDA toolkit).
CUDA_ONLY = {"pararnn-torch newton_gru_fused (Triton)", "pararnn-torch scan_diag (triton)", "accelerated-scan warp",
             "accelerated-scan scalar", "flash-linear-attention chunk_hgrn", "flash-linear-attention fused_recurrent_hgrn"}
IMPORT_ERRORS = r"""
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        errors[name] = None
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {error}"
print(json.dumps(errors))
"""


def test_compare_script_runs_every_comparison_and_agrees(tmp_path):
    out = tmp_path / "compare.json"
    subprocess.run([sys.executable, str(ROOT / "perf_tests" / "compare.py"), "--quick", "--device", "cpu",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())["results"]
    implementations = {entry["implementation"] for entry in results}
    for expected in ("paraseq fused", "paraseq scan", "paraseq sequential", "paraseq auto",
                     "PyTorch eager Newton K=3 (doubling scan)", "PyTorch sequential loop", "paraseq linear_scan",
                     "paraseq odeint rk4", "paraseq odeint dopri5", "PyTorch eager RK4 loop",
                     "torch.compile unrolled RK4 loop", "paraseq ParaGRU (built-in)", "paraseq user cell, compiled path",
                     "paraseq user cell, general path", "paraseq DampedOscillator (built-in)",
                     "paraseq user function, compiled path", "paraseq user function, general path",
                     "paraseq ParaGRU(mix='head')", "paraseq ParaGRU", "paraseq ParaSLSTM", "paraseq ParaGRU.step",
                     "paraseq ParaSLSTM.step", "PyTorch loop of the step's equations"):
        assert expected in implementations
    peer_workloads = {}
    for entry in results:
        if "peer" in entry:
            peer_workloads.setdefault(entry["peer"], set()).add(entry["workload"])
    assert peer_workloads == PEER_WORKLOADS

    modules = sorted({entry["module"] for entry in results if "module" in entry})
    imported = subprocess.run([sys.executable, "-c", IMPORT_ERRORS, *modules], check=True, capture_output=True,
                              text=True, timeout=300)
    import_errors = json.loads(imported.stdout.strip().splitlines()[-1])
    for entry in results:
        if "missing" in entry:
            if "module" in entry:  # the text of the error that importing the module raises
                error = import_errors[entry["module"]]
                assert error is not None and error.startswith(entry["missing"]), (entry, error)
            else:  # diffrax, imported in its own process
                assert entry["implementation"] == "diffrax"
                assert importlib.util.find_spec("jax") is None or importlib.util.find_spec("diffrax") is None
            continue
        if "peer" in entry:
            peer = entry["peer"]
            assert f"{peer} {importlib.metadata.version(peer)}" in entry["version"]
        if "refused" in entry:
            assert entry["implementation"] in CUDA_ONLY, entry
            continue
        assert entry["ms"] > 0
        for key, value in entry.items():
            if key.startswith(("max_abs_diff", "max_rel_grad_diff")):
                assert value <= 1e-5, (entry["implementation"], key, value)
