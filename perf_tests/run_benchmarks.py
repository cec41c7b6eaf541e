#!/usr/bin/env python3
"""Runs the paraseq performance suite and writes one JSON report.

The report names the machine and the versions, and gives for every benchmark its shape, median
time, compulsory bytes and flops, the achieved GB/s and GFLOP/s, and the percentage of the copy
and FMA ceilings measured in the same run (bench_ceilings.cpp).

Regression check (--baseline FILE): each benchmark's time is divided by the copy kernel's time of
the same run, so a machine that is uniformly slower or busier does not look like a regression;
a normalised time more than --threshold (default 15%) above the baseline's is flagged.

    run_benchmarks.py --build-dir build/main [--quick] [--out report.json] [--baseline base.json]
    run_benchmarks.py --raw gbench.json --build-dir DIR --out report.json   (a run made elsewhere)

--timeout SECONDS runs each benchmark in a process of its own and reports those that outrun it
(the GPU runs use it: one pathological case must not cost the whole run).

When the build has the PyTorch operators (src/adapters/torch/libparaseq_torch.so) and torch imports,
the run also times the operators' per-call overhead (torch_overhead/...: tiny calls, back to back)
on --torch-device; those times are normalised by torch.add's of the same run instead of the copy's.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys

# The quick suite: the ceilings and every benchmark at 2^22 elements or fewer; under 2 minutes on 2 cores.
QUICK_FILTER = (r"ceiling_|log2BN:(0/log2T:22|6/log2T:16|10/log2T:12|14/log2T:8)/|log2B:0/log2T:16|log2B:6/log2T:12"
                r"|gru_forward(_backward)?/B:1/T:262144/H:1/"
                r"|(rk4_fixed|dopri5_adaptive)/log2N:10/n:2/steps:128/gradient:[012]/stepped:0")
COPY_CEILINGS = ("ceiling_copy", "ceiling_copy_runtime")
REFERENCE_KERNEL = "ceiling_copy"
FMA_CEILING = "ceiling_fma"


def machine_description():
    info = {"platform": platform.platform(), "processor": platform.processor()}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            models = re.findall(r"^model name\s*:\s*(.*)$", cpuinfo.read(), re.M)
        if models:
            info["cpu"] = models[0]
            info["cpu_threads"] = len(models)
    except OSError:
        pass
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if gpu.returncode == 0:
            info["gpu"] = gpu.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def build_versions(build_dir):
    versions = {}
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as cache:
            text = cache.read()
        for key in ("CMAKE_CXX_COMPILER", "CMAKE_CUDA_COMPILER", "Kokkos_DIR"):
            match = re.search(rf"^{key}:\w+=(.*)$", text, re.M)
            if match:
                versions[key] = match.group(1)
        compiler = versions.get("CMAKE_CXX_COMPILER")
        if compiler:
            versions["compiler"] = subprocess.run([compiler, "--version"], capture_output=True,
                                                  text=True).stdout.splitlines()[0]
    except OSError:
        pass
    try:
        import torch  # noqa: PLC0415 - optional

        versions["torch"] = torch.__version__
    except ImportError:
        versions["torch"] = None
    return versions


def benchmark_command(executable, benchmark_filter, repetitions, min_time):
    command = [executable, "--benchmark_format=json", f"--benchmark_repetitions={repetitions}",
               "--benchmark_report_aggregates_only=true", f"--benchmark_min_time={min_time}s"]
    if benchmark_filter:
        command.append(f"--benchmark_filter={benchmark_filter}")
    return command


class BenchmarkFailed(RuntimeError):
    pass


def run_json(command, what, timeout=None):
    """Runs one benchmark command and returns its JSON report; a failure raises BenchmarkFailed
    (a timeout subprocess.TimeoutExpired) to the caller."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise BenchmarkFailed(f"run_benchmarks: {what} failed with exit code {result.returncode}")
    return json.loads(result.stdout)


def run_suite(executable, benchmark_filter, repetitions, min_time):
    """The whole selection in one process: a failure ends the run."""
    try:
        return run_json(benchmark_command(executable, benchmark_filter, repetitions, min_time), executable)
    except BenchmarkFailed as failure:
        raise SystemExit(str(failure))


def run_each(executable, benchmark_filter, repetitions, min_time, timeout, partial_path=None):
    """Every benchmark in a process of its own, stopped after `timeout` seconds: one slow or failing
    case costs its timeout or its exit, not the run, and is reported as timed out or failed. The raw
    results so far are rewritten to partial_path after each benchmark, so an interrupted run keeps
    what it measured."""
    listed = subprocess.run([executable, "--benchmark_list_tests"] +
                            ([f"--benchmark_filter={benchmark_filter}"] if benchmark_filter else []),
                            capture_output=True, text=True, check=True).stdout.split()
    raw = {"context": {}, "benchmarks": [], "timed_out": [], "failed": []}
    for name in listed:
        command = benchmark_command(executable, "^" + re.escape(name) + "$", repetitions, min_time)
        try:
            one = run_json(command, name, timeout)
        except subprocess.TimeoutExpired:
            raw["timed_out"].append(name)
            print(f"{name}: timed out after {timeout} s", flush=True)
        except BenchmarkFailed as failure:
            raw["failed"].append(name)
            print(failure, flush=True)
        else:
            raw["context"] = one.get("context", {})
            raw["benchmarks"].extend(one["benchmarks"])
            print(f"{name}: done", flush=True)
        if partial_path:
            with open(partial_path, "w") as partial:
                json.dump(raw, partial)
    return raw


def summarize(raw):
    medians = [b for b in raw["benchmarks"] if b.get("aggregate_name") == "median"]
    if not medians:  # one repetition gives no aggregates
        medians = [b for b in raw["benchmarks"] if b.get("run_type") == "iteration"]
    results = []
    for bench in medians:
        name = bench["run_name"]
        seconds = bench["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[bench["time_unit"]]
        shape = dict(re.findall(r"(\w+):(-?\d+)", name))
        results.append({
            "name": name,
            "shape": {k: int(v) for k, v in shape.items()},
            "seconds": seconds,
            "bytes": bench.get("bytes", 0.0),
            "flops": bench.get("flops", 0.0),
            "GBps": bench.get("bytes", 0.0) / seconds * 1e-9,
            "GFLOPps": bench.get("flops", 0.0) / seconds * 1e-9,
        })
    by_name = {r["name"].split("/")[0]: r for r in results}
    # The bandwidth ceiling is the faster of the parallel_for copy and the runtime's copy; the
    # regression check divides by the parallel_for copy, a kernel launched like the benchmarks'.
    copies = [by_name[name] for name in COPY_CEILINGS if name in by_name]
    ceiling = max(copies, key=lambda r: r["GBps"]) if copies else None
    reference = by_name.get(REFERENCE_KERNEL)
    fma = by_name.get(FMA_CEILING)
    for r in results:
        r["pct_copy_bandwidth"] = 100.0 * r["GBps"] / ceiling["GBps"] if ceiling and r["bytes"] else None
        r["pct_fma_peak"] = 100.0 * r["GFLOPps"] / fma["GFLOPps"] if fma and r["flops"] else None
        r["time_over_copy_time"] = r["seconds"] / reference["seconds"] if reference else None
    return results


TORCH_REFERENCE = "torch_overhead/op:torch.add"


def torch_overhead(build_dir, device):
    """Per-call time of the operators on tiny inputs (their fixed cost: checks, dispatch, autograd,
    launch) next to torch.add on tensors of the same size, or [] without torch or the library."""
    library = os.path.join(build_dir, "src", "adapters", "torch", "libparaseq_torch.so")
    if not os.path.isfile(library) and "PARASEQ_TORCH_LIBRARY" not in os.environ:
        return []
    os.environ.setdefault("PARASEQ_TORCH_LIBRARY", os.path.abspath(library))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    try:
        import torch  # noqa: PLC0415 - optional
        import paraseq  # noqa: PLC0415
        from torch_check import median_call_microseconds  # noqa: PLC0415
    except ImportError as error:
        print(f"run_benchmarks: no torch operator overhead ({error})")
        return []
    A = torch.full((1, 1, 1), 0.5, device=device)
    b = torch.ones(1, 1, 1, device=device)
    A_grad = A.clone().requires_grad_()
    oscillator = paraseq.fields.DampedOscillator(torch.ones(1, device=device), torch.zeros(1, device=device))
    y0 = torch.ones(1, 2, device=device)
    ends = torch.tensor([0.0, 0.01])
    calls = {
        "torch.add": lambda: torch.add(A, b),
        "linear_scan": lambda: torch.ops.paraseq.linear_scan(A, b, None, "diag", False),
        "linear_scan_recording_autograd": lambda: torch.ops.paraseq.linear_scan(A_grad, b, None, "diag", False),
        "odeint_rk4_one_step": lambda: paraseq.odeint(oscillator, y0, ends, method="rk4", step_size=0.01),
    }
    return [{"name": f"torch_overhead/op:{name}", "shape": {}, "device": device,
             "seconds": median_call_microseconds(call, device) * 1e-6, "bytes": 0.0, "flops": 0.0, "GBps": 0.0,
             "GFLOPps": 0.0, "pct_copy_bandwidth": None, "pct_fma_peak": None} for name, call in calls.items()]


def normalise_torch_overhead(results):
    """The operators' per-call times over torch.add's of the same run (their in-run reference)."""
    reference = next((r for r in results if r["name"] == TORCH_REFERENCE), None)
    for r in results:
        if r["name"].startswith("torch_overhead/"):
            r["time_over_copy_time"] = r["seconds"] / reference["seconds"] if reference else None


def compare(results, baseline, threshold):
    """(rows, drift): rows of (name, baseline normalised time, this run's, ratio, ratio over the
    suite's drift, flagged); drift is the median ratio of the suite. A benchmark is flagged when it
    moved more than `threshold` beyond the whole suite: the copy kernel that normalises the times is
    itself bandwidth-bound and moves differently from latency-bound benchmarks on a shared machine
    (on the 2-core machine its time varied 1.6x between idle runs while the scans' did not)."""
    base = {r["name"]: r for r in baseline["results"]}
    pairs = []
    for r in results:
        old = base.get(r["name"])
        if not old or not r["time_over_copy_time"] or not old.get("time_over_copy_time"):
            continue
        if r["name"].startswith("ceiling_") or r["name"] == TORCH_REFERENCE:
            continue
        pairs.append((r["name"], old["time_over_copy_time"], r["time_over_copy_time"]))
    ratios = sorted(new / old for _, old, new in pairs)
    drift = ratios[len(ratios) // 2] if ratios else 1.0
    rows = [(name, old, new, new / old, new / old / drift, new / old / drift > 1 + threshold) for name, old, new in pairs]
    return rows, drift


def print_table(results):
    width = max([len("benchmark")] + [len(r["name"]) for r in results])
    print(f"{'benchmark':{width}} {'time':>11} {'GB/s':>9} {'%copy':>6} {'GFLOP/s':>9}")
    for r in results:
        if r["name"].startswith("torch_overhead/"):
            ratio = f"{r['time_over_copy_time']:.1f}x torch.add" if r["time_over_copy_time"] else ""
            print(f"{r['name']:{width}} {r['seconds'] * 1e6:9.2f}us  {r['device']:>4} {ratio}")
            continue
        pct = f"{r['pct_copy_bandwidth']:.0f}" if r["pct_copy_bandwidth"] is not None else "-"
        print(f"{r['name']:{width}} {r['seconds'] * 1e3:9.3f}ms {r['GBps']:9.2f} {pct:>6} {r['GFLOPps']:9.2f}")


def print_comparison(rows):
    width = max([len("benchmark")] + [len(row[0]) for row in rows])
    print(f"  {'benchmark':{width}} {'baseline':>9} {'this run':>9} {'ratio':>7} {'/ drift':>7}")
    for name, old, new, ratio, relative, flagged in rows:
        print(f"  {name:{width}} {old:9.3f} {new:9.3f} {ratio:6.2f}x {relative:6.2f}x {'SLOWER' if flagged else ''}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build/main")
    parser.add_argument("--quick", action="store_true", help="the small suite CI runs (report only)")
    parser.add_argument("--filter", default=None, help="a Google Benchmark filter regex (overrides --quick's)")
    parser.add_argument("--out", default=None, help="where to write the JSON report")
    parser.add_argument("--baseline", default=None, help="a report to compare with")
    parser.add_argument("--threshold", type=float, default=0.15)
    parser.add_argument("--fail-on-regression", action="store_true")
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None,
                        help="run each benchmark in its own process, stopped after this many seconds (reported)")
    parser.add_argument("--raw", default=None,
                        help="summarise this Google Benchmark JSON (from a run elsewhere) instead of running")
    parser.add_argument("--machine", default=None,
                        help="with --raw: the machine the run was made on (this machine is described otherwise)")
    parser.add_argument("--summary", action="store_true",
                        help="print one line per finding instead of the tables (the JSON report keeps them)")
    parser.add_argument("--torch-device", default="cpu",
                        help="the device of the torch operator overhead (cpu or cuda; skipped with --raw)")
    args = parser.parse_args()

    executable = os.path.join(args.build_dir, "perf_tests", "paraseq_benchmarks")
    benchmark_filter = args.filter or (QUICK_FILTER if args.quick else None)
    repetitions = args.repetitions or (5 if args.quick else 10)
    if args.raw:
        with open(args.raw) as raw_file:
            raw = json.load(raw_file)
    elif args.timeout:
        raw = run_each(executable, benchmark_filter, repetitions, 0.05 if args.quick else 0.2, args.timeout,
                       args.out + ".raw" if args.out else None)
    else:
        raw = run_suite(executable, benchmark_filter, repetitions, 0.05 if args.quick else 0.2)
    results = summarize(raw)
    if not args.raw:
        results += torch_overhead(args.build_dir, args.torch_device)
        normalise_torch_overhead(results)
    report = {
        "machine": {"description": args.machine} if args.machine else machine_description(),
        "versions": build_versions(args.build_dir),
        "context": raw.get("context", {}),
        "suite": "quick" if args.quick and not args.filter else "full",
        "results": results,
        "timed_out": raw.get("timed_out", []),
        "failed": raw.get("failed", []),
    }
    if not args.summary:
        print_table(report["results"])
    for name in report["timed_out"]:
        print(f"{name} timed out after {args.timeout} s")
    for name in report["failed"]:
        print(f"{name} failed")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1)
        print(f"report written to {args.out}")
    regressions = 0
    if args.baseline:
        with open(args.baseline) as base_file:
            rows, drift = compare(report["results"], json.load(base_file), args.threshold)
        regressions = sum(1 for row in rows if row[5])
        if not args.summary:
            print(f"\nagainst {args.baseline} (time / copy-kernel time of the same run, then over the suite's "
                  f"median ratio {drift:.2f}; flagged above +{args.threshold:.0%}):")
            print_comparison(rows)
        print(f"{len(report['results'])} benchmarks run; {regressions} of {len(rows)} compared with {args.baseline} "
              f"more than {args.threshold:.0%} slower than the suite's drift")
        if drift > 1 + args.threshold:
            print(f"the whole suite moved {drift:.2f}x against the copy kernel: a busy or different machine, or a "
                  f"regression in a path every benchmark shares; compare on a quiet machine")
    elif args.summary:
        print(f"{len(report['results'])} benchmarks run")
    if regressions and args.fail_on_regression:
        raise SystemExit(1)
    if report["failed"]:
        raise SystemExit(f"run_benchmarks: {len(report['failed'])} benchmarks failed (the report has the rest)")


if __name__ == "__main__":
    main()
