#!/usr/bin/env python3
"""The build cost of a build tree: its Ninja log as a JSON report of units and their times.

    perf_tests/build_cost.py BUILD_DIR [--out REPORT.json] [--machine NAME] [--commit SHA] [--top 10]
                             [--alone OUTPUT ...]

Reads BUILD_DIR/.ninja_log (the last build of every output; the wall time is meaningful for a
tree built once, from empty, by one Ninja run: each run restarts the log's clock), prints the
slowest units and, with --out, writes a report: the wall time (first start to last end), the CPU
time (the sum over units), and every unit with its seconds, slowest first. docs/performance.md
("Build cost") shows the numbers.
The commit is this checkout's HEAD unless --commit names it (a copy of the tree on another machine
may carry other git metadata than its sources).

--alone OUTPUT ... compiles those outputs again after the log is read, one at a time (Ninja with one
job, on a host that is otherwise idle), and reports their seconds as `units_alone`: what one unit
costs a user who compiles it by itself, e.g. an application unit that calls newton_solve, whose
time in a parallel build depends on what compiles beside it.
"""

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def read_ninja_log(path):
    """{output: (start_s, end_s)} of the latest build of each output (the log appends rebuilds)."""
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("# ninja log v"):
        raise SystemExit(f"build_cost.py: {path} is not a Ninja log (no '# ninja log v' header)")
    entries = {}
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        start_ms, end_ms, output = int(fields[0]), int(fields[1]), fields[3]
        entries[output] = (start_ms / 1000.0, end_ms / 1000.0)
    return entries


def unit_kind(output):
    if output.endswith((".o", ".obj")):
        return "compile"
    if output.endswith((".so", ".a", ".dylib")) or "/" not in output or Path(output).suffix == "":
        return "link"
    return "other"


def report(build_dir, machine, commit=None):
    entries = read_ninja_log(Path(build_dir) / ".ninja_log")
    units = sorted(({"output": output, "seconds": round(end - start, 3), "kind": unit_kind(output)}
                    for output, (start, end) in entries.items()), key=lambda unit: -unit["seconds"])
    starts = [start for start, _ in entries.values()]
    ends = [end for _, end in entries.values()]
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {
        "machine": machine or platform.node(),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "build_dir": str(build_dir),
        "wall_seconds": round(max(ends) - min(starts), 3) if entries else 0.0,
        "cpu_seconds": round(sum(unit["seconds"] for unit in units), 3),
        "slowest_compile_seconds": next((unit["seconds"] for unit in units if unit["kind"] == "compile"), 0.0),
        "units": units,
    }


def compile_alone(build_dir, outputs):
    """[{output, seconds}] of each output compiled again by itself (Ninja, one job)."""
    timed = []
    for output in outputs:
        (Path(build_dir) / output).unlink(missing_ok=True)
        start = time.perf_counter()
        subprocess.run(["ninja", "-C", str(build_dir), "-j", "1", output], check=True, capture_output=True)
        timed.append({"output": output, "seconds": round(time.perf_counter() - start, 3)})
    return timed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--machine", help="the machine's name in the report (default: the host name)")
    parser.add_argument("--commit", help="the sources' commit in the report (default: this checkout's HEAD)")
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest units to print")
    parser.add_argument("--alone", nargs="+", default=[], metavar="OUTPUT",
                        help="outputs (paths in the build tree) to compile again one at a time, timed")
    args = parser.parse_args(argv)
    result = report(args.build_dir, args.machine, args.commit)
    if args.alone:
        result["units_alone"] = compile_alone(args.build_dir, args.alone)
    print(f"build cost of {args.build_dir}: {result['wall_seconds']:.1f} s wall, {result['cpu_seconds']:.1f} s "
          f"of units, {len(result['units'])} units; the {args.top} slowest:")
    for unit in result["units"][:args.top]:
        print(f"  {unit['seconds']:8.1f} s  {unit['output']}")
    for unit in result.get("units_alone", []):
        print(f"  {unit['seconds']:8.1f} s  {unit['output']} (compiled alone)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
