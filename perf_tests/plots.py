#!/usr/bin/env python3
"""Draws the PNG plots of docs/performance.md from benchmark reports (run_benchmarks.py JSON).

    plots.py --out docs/img [--compare LABEL=COMPARE.json] LABEL=REPORT.json [LABEL=REPORT.json ...]

One figure per question, with one line per report (machine):
  scan_bandwidth.png   diagonal scan: % of the run's copy bandwidth against B*N (fixed B*N*T per report)
  newton_modes.png     ParaGRU forward time per mode and shape
  rk_time.png          RK4 / DP5 time against the number of trajectories N
  speedups.png         compare.py: each implementation's time per workload, and its ratio to paraseq's
  time_against_T.png   compare.py's sweep: time per step of the ParaGRU forward (B = 1, H = 256) and the
                       one-channel scan against T, paraseq and the peers, with the HBM floor
  time_against_BH.png  compare.py's sweep: the ParaGRU forward at T = 4096 against B x H
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(pairs):
    reports = []
    for pair in pairs:
        label, path = pair.split("=", 1)
        with open(path) as f:
            reports.append((label, json.load(f)["results"]))
    return reports


def matching(results, prefix, **shape):
    return [r for r in results if r["name"].startswith(prefix + "/") and
            all(r["shape"].get(k) == v for k, v in shape.items())]


def save(fig, ax, out, name, **legend):
    """Adds the legend and writes the figure, unless none of the reports had data for it."""
    if ax.has_data():
        ax.legend(**legend)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=120)
        print(f"wrote {os.path.join(out, name)}")
    plt.close(fig)


def scan_bandwidth(reports, out):
    """Each report at its largest B*N*T (2^26 in the full suite, 2^22 in the quick one)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, results in reports:
        scans = matching(results, "scan_diagonal_forward")
        if not scans:
            continue
        total = max(r["shape"]["log2BN"] + r["shape"]["log2T"] for r in scans)
        for sequential, style in ((0, "-o"), (1, "--x")):
            rows = sorted((r["shape"]["log2BN"], r["pct_copy_bandwidth"])
                          for r in scans if r["shape"]["sequential"] == sequential
                          and r["shape"]["log2BN"] + r["shape"]["log2T"] == total and r["pct_copy_bandwidth"])
            if rows:
                ax.plot(*zip(*rows), style,
                        label=f"{label}, 2^{total}, {'sequential loop' if sequential else 'automatic plan'}")
    ax.set(xlabel="log2(B·N) at fixed B·N·T, fp32", ylabel="% of copy bandwidth (same run)",
           title="Diagonal linear scan")
    ax.grid(alpha=0.3)
    save(fig, ax, out, "scan_bandwidth.png", fontsize=7)


def newton_modes(reports, out):
    """A bar per (report, mode) that has data, grouped by shape."""
    modes = {0: "automatic", 1: "newton", 2: "fused", 3: "sequential"}
    key = lambda r: (r["shape"]["B"], r["shape"]["T"], r["shape"]["H"])
    series, shapes = [], set()
    for label, results in reports:
        rows = matching(results, "gru_forward")
        for m, mode in modes.items():
            times = {key(r): r["seconds"] * 1e3 for r in rows if r["shape"]["mode"] == m}
            if times:
                series.append((f"{label} {mode}", times))
                shapes |= set(times)
    shapes = sorted(shapes)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(series))
    for index, (name, times) in enumerate(series):
        ax.bar([i + index * width for i in range(len(shapes))], [times.get(s, 0) for s in shapes], width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], [f"{b}×{t}×{h}" for b, t, h in shapes], fontsize=8)
    ax.set(yscale="log", ylabel="ms", xlabel="(B, T, H)", title="ParaGRU forward, K = 3, fp32")
    save(fig, ax, out, "newton_modes.png", fontsize=7)


def rk_time(reports, out):
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, results in reports:
        for bench, style in (("rk4_fixed", "-o"), ("dopri5_adaptive", "--s")):
            rows = sorted((r["shape"]["log2N"], r["seconds"] * 1e3)
                          for r in matching(results, bench, n=2, steps=1000, gradient=0, stepped=0))
            if rows:
                ax.plot(*zip(*rows), style, label=f"{label} {bench}")
    ax.set(yscale="log", xlabel="log2(N trajectories), n = 2, 1000 steps", ylabel="ms",
           title="Batched Runge–Kutta, fused loop")
    ax.grid(alpha=0.3)
    save(fig, ax, out, "rk_time.png", fontsize=8)


def speedups(comparisons, out):
    """One panel per compare.py report: a bar per (workload, implementation), log time, labelled with
    the ratio to the fastest paraseq implementation of the same workload and shape."""
    for label, path in comparisons:
        with open(path) as f:
            rows = [r for r in json.load(f)["results"] if r.get("ms")]
        groups = {}
        for r in rows:
            shape = ",".join(f"{k}={r[k]}" for k in ("B", "T", "H", "N", "steps") if k in r)
            groups.setdefault((r["workload"], shape), []).append(r)
        bars, names, colors = [], [], []
        for (workload, shape), members in groups.items():
            best = min((m["ms"] for m in members if m["implementation"].startswith("paraseq")), default=None)
            for m in sorted(members, key=lambda m: m["ms"]):
                ratio = f"  ({m['ms'] / best:.2g}x)" if best and not m["implementation"].startswith("paraseq") else ""
                names.append(f"{workload} {shape}: {m['implementation']}{ratio}")
                bars.append(m["ms"])
                colors.append("tab:blue" if m["implementation"].startswith("paraseq") else "tab:gray")
        if not bars:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.22 * len(bars) + 1))
        ax.barh(range(len(bars)), bars, color=colors)
        ax.set_yticks(range(len(bars)), names, fontsize=6)
        ax.invert_yaxis()
        ax.set(xscale="log", xlabel="ms per call (blue: paraseq; in brackets: times paraseq's best)")
        # Right-aligned: the axes are narrow beside the long bar labels, so a centred title is cut off.
        ax.set_title(f"paraseq against what users run instead ({label}, one run)", loc="right", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "speedups.png"), dpi=120)
        plt.close(fig)


def sweeps(comparisons, out):
    """compare.py's sweep section: one line per implementation, time per step (T) or per channel (B x H)."""
    for label, path in comparisons:
        with open(path) as f:
            rows = [r for r in json.load(f)["results"] if r.get("ms")]
        panels = (("time_against_T.png", (("gru_forward_against_T", "ParaGRU forward, B = 1, H = 256"),
                                          ("scan_against_T", "diagonal scan, one channel")), "T",
                   lambda r: r["T"], lambda r: r["ms"] * 1e6 / r["T"], "ns per step"),
                  ("time_against_BH.png", (("gru_forward_against_BH", "ParaGRU forward, T = 4096"),), "B x H",
                   lambda r: r["B"] * r["H"], lambda r: r["ms"] * 1e6 / (r["B"] * r["H"]), "ns per channel"))
        for name, workloads, xlabel, x, y, ylabel in panels:
            members = [[r for r in rows if r["workload"] == workload] for workload, _ in workloads]
            if not any(members):
                continue
            fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
            for ax, (workload, title), found in zip(axes[0], workloads, members):
                for implementation in dict.fromkeys(r["implementation"] for r in found):
                    line = sorted((x(r), y(r)) for r in found if r["implementation"] == implementation)
                    style = "-o" if implementation.startswith("paraseq") else ":" if "floor" in implementation else "--x"
                    ax.plot(*zip(*line), style, label=implementation)
                ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=f"{title} ({label})")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(os.path.join(out, name), dpi=120)
            print(f"wrote {os.path.join(out, name)}")
            plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/img")
    parser.add_argument("--compare", action="append", default=[], help="LABEL=COMPARE.json (perf_tests/compare.py)")
    parser.add_argument("reports", nargs="*", help="LABEL=REPORT.json")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    reports = load(args.reports)
    for draw in (scan_bandwidth, newton_modes, rk_time):
        draw(reports, args.out)
    comparisons = [pair.split("=", 1) for pair in args.compare]
    speedups(comparisons, args.out)
    sweeps(comparisons, args.out)


if __name__ == "__main__":
    main()
