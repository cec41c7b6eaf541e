#!/usr/bin/env python3
"""Turns benchmark reports (run_benchmarks.py JSON) into the Markdown tables of docs/performance.md.

    report.py REPORT.json [--plots DIR]

Prints the machine line, every result with its percentage of the same run's copy ceiling, the
ratio of the automatic plan to the forced sequential loop wherever both were measured, and the
Newton benchmarks' automatic mode against the fastest mode forced at the same shape (docs/performance.md's
target: within 10%).
"""

import argparse
import json
import re


def machine_line(report):
    machine = report["machine"]
    parts = [machine.get("gpu") or machine.get("cpu", "unknown CPU")]
    context = report.get("context", {})
    if "execution_space" in context:
        parts.append(f"Kokkos {context.get('kokkos_version')} {context['execution_space']}, "
                     f"concurrency {context.get('concurrency')}")
    if report["versions"].get("compiler"):
        parts.append(report["versions"]["compiler"])
    return "; ".join(parts)


def results_table(report):
    lines = ["| benchmark | time | GB/s | % of copy | GFLOP/s |", "| --- | ---: | ---: | ---: | ---: |"]
    overhead = []
    for r in report["results"]:
        if r["name"].startswith("torch_overhead/"):
            overhead.append(r)
            continue
        pct = f"{r['pct_copy_bandwidth']:.0f}%" if r["pct_copy_bandwidth"] is not None else "–"
        name = r["name"].replace("/manual_time", "")
        lines.append(f"| `{name}` | {r['seconds'] * 1e3:.3f} ms | {r['GBps']:.1f} | {pct} | {r['GFLOPps']:.1f} |")
    if overhead:
        lines += ["", "| torch operator, per call | device | time | over torch.add |", "| --- | --- | ---: | ---: |"]
        for r in overhead:
            ratio = f"{r['time_over_copy_time']:.1f}x" if r.get("time_over_copy_time") else "–"
            lines.append(f"| `{r['name'].split(':', 1)[1]}` | {r['device']} | {r['seconds'] * 1e6:.2f} µs | {ratio} |")
    return "\n".join(lines)


def plan_ratio_table(report):
    """Automatic plan against the sequential loop, for benchmarks measured both ways."""
    by_name = {r["name"]: r for r in report["results"]}
    lines = ["| benchmark | automatic | sequential | sequential / automatic |", "| --- | ---: | ---: | ---: |"]
    for name, r in by_name.items():
        if "sequential:0" not in name:
            continue
        other = by_name.get(name.replace("sequential:0", "sequential:1"))
        if other:
            short = name.replace("/sequential:0", "").replace("/manual_time", "")
            lines.append(f"| `{short}` | {r['seconds'] * 1e3:.3f} ms | {other['seconds'] * 1e3:.3f} ms | "
                         f"{other['seconds'] / r['seconds']:.2f}x |")
    return "\n".join(lines)


# paraseq::NewtonMode's values, as the benchmarks' `mode` argument takes them.
NEWTON_MODES = {0: "automatic", 1: "newton", 2: "fused", 3: "sequential", 4: "one_pass"}
AUTOMATIC_WITHIN = 1.10


def mode_choice_table(report):
    """Each Newton benchmark's automatic mode (mode:0) against the fastest mode forced at the same shape."""
    shapes = {}
    for r in report["results"]:
        match = re.fullmatch(r"(.*)/mode:(\d+)", r["name"].replace("/manual_time", ""))
        if match:
            shapes.setdefault(match.group(1), {})[int(match.group(2))] = r["seconds"]
    lines = ["| benchmark | automatic | fastest forced mode | automatic / fastest |", "| --- | ---: | --- | ---: |"]
    for shape, modes in shapes.items():
        forced = {mode: seconds for mode, seconds in modes.items() if mode != 0}
        if 0 not in modes or not forced:
            continue
        fastest = min(forced, key=forced.get)
        ratio = modes[0] / forced[fastest]
        verdict = "" if ratio <= AUTOMATIC_WITHIN else f" (over {AUTOMATIC_WITHIN:.2f}x)"
        lines.append(f"| `{shape}` | {modes[0] * 1e3:.3f} ms | {NEWTON_MODES.get(fastest, fastest)}, "
                     f"{forced[fastest] * 1e3:.3f} ms | {ratio:.2f}x{verdict} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    args = parser.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    print(f"Machine: {machine_line(report)}\n")
    print(results_table(report))
    print()
    print(plan_ratio_table(report))
    print()
    print(mode_choice_table(report))


if __name__ == "__main__":
    main()
