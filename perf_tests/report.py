#!/usr/bin/env python3
"""Turns benchmark reports (run_benchmarks.py JSON) into the Markdown tables of docs/performance.md.

    report.py REPORT.json [--plots DIR]

Prints the machine line, every result with its percentage of the same run's copy ceiling, and the
ratio of the automatic plan to the forced sequential loop wherever both were measured.
"""

import argparse
import json


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


if __name__ == "__main__":
    main()
