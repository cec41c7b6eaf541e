#!/usr/bin/env python3
"""The communication cost of sequence parallelism (process_group=, docs/distributed.md) on the CPU: gloo ranks
spawned with torch.multiprocessing, each holding an equal slice of the time axis, against the one-process call.

For each number of ranks and each workload the script times every rank's call (wall clock, after a barrier, the
median of --repetitions calls after a first one) and, inside it, the collectives: each all_gather and all_reduce of
torch.distributed is wrapped to time it and to count the bytes this rank contributes, by what it carries (the
agreement of the arguments, the scans' maps, the Newton iterate's boundary state, the reductions of the residual
and of the need of an adjoint). "local" is the rest of the call: the slice's own work. A collective's time inside
the call includes waiting for the ranks that reach it later (the scan's ranks wait for the maps of the ranks before
them), so the script also replays the call's collectives alone, each after a barrier, on tensors of the same sizes:
"transfer" is their sum, the cost of moving the bytes. Every process runs one thread (OMP_NUM_THREADS=1, also the
one-process reference); with more ranks than cores the ranks share cores. Each rank also checks its slice against
the one-process result (the largest difference is in the report).

Workloads: linear_scan (diagonal, float64, B x T x N) and newton_apply of a ParaGRU (float64, B x T x H, a fixed
number of Newton iterations: NewtonConfig(max_iters=K, residual_fail=None)); the one-process reference is the same
call without process_group (for ParaGRU: its C++ operator, and the general path that the distributed solve runs).

    python3 perf_tests/distributed_cost.py --out perf_tests/results/DATE-MACHINE-distributed.json
    python3 perf_tests/distributed_cost.py --quick --out /tmp/quick.json     # tiny: checks that everything runs
"""

import argparse
import json
import os

os.environ["OMP_NUM_THREADS"] = "1"  # before paraseq starts Kokkos: one thread per process, ranks and reference
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import paraseq
from paraseq import NewtonConfig, ParaGRU, _distributed, _user_cell
from paraseq.newton import _BuiltinCellSteps, _projection

# What each collective carries, named by the function it runs in (see wrap_collectives).
CARRIERS = {"exchange_and_check": "agreement", "scan": "maps", "distributed_boundary": "boundary",
            "global_max": "reduction"}


class CollectiveLog:
    """Seconds and bytes (this rank's contribution) of the collectives run since reset(), by carrier."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds, self.bytes, self.calls, self.collectives = {}, {}, {}, []

    def add(self, carrier, seconds, sent, replay):
        self.seconds[carrier] = self.seconds.get(carrier, 0.0) + seconds
        self.bytes[carrier] = self.bytes.get(carrier, 0) + sent.numel() * sent.element_size()
        self.calls[carrier] = self.calls.get(carrier, 0) + 1
        self.collectives.append((carrier, replay, torch.zeros_like(sent)))


def transfer_seconds(collectives, barrier):
    """Each logged collective again, alone after a barrier, on zeros of its size: seconds by carrier."""
    seconds = {}
    for carrier, replay, tensor in collectives:
        barrier()
        begin = time.perf_counter()
        replay(tensor)
        seconds[carrier] = seconds.get(carrier, 0.0) + time.perf_counter() - begin
    return seconds


def wrap_collectives(log):
    """Times dist.all_gather and dist.all_reduce (the only collectives paraseq's distributed path runs) and
    attributes each to the paraseq function that called it, found on the stack."""
    def carrier():
        frame = sys._getframe(2)
        while frame is not None:
            name = CARRIERS.get(frame.f_code.co_name)
            if name is not None and frame.f_code.co_filename == _distributed.__file__:
                return name
            frame = frame.f_back
        return "other"

    all_gather, all_reduce = dist.all_gather, dist.all_reduce

    def timed_all_gather(tensors, tensor, **kwargs):
        begin = time.perf_counter()
        result = all_gather(tensors, tensor, **kwargs)
        replay = lambda zeros: all_gather([torch.empty_like(zeros) for _ in tensors], zeros, **kwargs)
        log.add(carrier(), time.perf_counter() - begin, tensor, replay)
        return result

    def timed_all_reduce(tensor, **kwargs):
        begin = time.perf_counter()
        result = all_reduce(tensor, **kwargs)
        log.add(carrier(), time.perf_counter() - begin, tensor, lambda zeros: all_reduce(zeros, **kwargs))
        return result

    dist.all_gather, dist.all_reduce = timed_all_gather, timed_all_reduce


def slice_of(tensor, rank, ranks):
    T = tensor.shape[1]
    return tensor[:, T * rank // ranks:T * (rank + 1) // ranks]


def scan_inputs(B, T, N):
    g = torch.Generator().manual_seed(1)
    A = 0.5 + 0.5 * torch.rand(B, T, N, generator=g, dtype=torch.float64)  # |A| < 1: a stable recurrence
    return A, torch.randn(B, T, N, generator=g, dtype=torch.float64)


def gru_inputs(B, T, H, iterations):
    torch.manual_seed(2)
    cell = ParaGRU(H, H, config=NewtonConfig(max_iters=iterations, residual_fail=None)).to(torch.float64)
    g = torch.Generator().manual_seed(3)
    return cell, torch.rand(B, T, H, generator=g, dtype=torch.float64) - 0.5


def workloads(args):
    """(name, shape dict, make(rank, ranks, group) -> (call, one_process_result_slice))."""
    for T in args.scan_T:
        shape = {"B": args.scan_B, "T": T, "N": args.scan_N}

        def make(rank, ranks, group, shape=shape):
            A, b = scan_inputs(shape["B"], shape["T"], shape["N"])
            if group is None:
                return lambda: paraseq.linear_scan(A, b), None
            A_r, b_r = slice_of(A, rank, ranks).contiguous(), slice_of(b, rank, ranks).contiguous()
            expected = slice_of(paraseq.linear_scan(A, b), rank, ranks)
            return lambda: paraseq.linear_scan(A_r, b_r, process_group=group), expected
        yield "linear_scan diag float64", shape, make
    for T in args.gru_T:
        shape = {"B": args.gru_B, "T": T, "H": args.gru_H, "iterations": args.iterations}

        def make(rank, ranks, group, shape=shape):
            cell, x = gru_inputs(shape["B"], shape["T"], shape["H"], shape["iterations"])
            if group is None:
                return lambda: cell(x), None
            x_r = slice_of(x, rank, ranks).contiguous()
            with torch.no_grad():  # the same iterations in one process: not converged, equal to rounding
                expected = slice_of(general_path(cell, x)[0], rank, ranks)
            return lambda: cell(x_r, process_group=group), expected
        yield "newton_apply ParaGRU float64", shape, make


def general_path(cell, x):
    """The general Newton path in one process, what the distributed solve runs over the ranks: the
    ParaGRU's step in PyTorch, Jacobians from torch.func, one linear_scan per iteration."""
    return _user_cell.solve(_user_cell.CellLayout(_BuiltinCellSteps(cell)), _projection(cell, x), None, cell.config,
                            False)


def one_process_general_path(args):
    for T in args.gru_T:
        cell, x = gru_inputs(args.gru_B, T, args.gru_H, args.iterations)
        with torch.no_grad():
            yield T, time_calls(lambda: general_path(cell, x), args.repetitions)


def time_calls(call, repetitions, barrier=None):
    """Median seconds of repetitions calls after a first one (each after a barrier when given)."""
    call()
    samples = []
    for _ in range(repetitions):
        if barrier:
            barrier()
        begin = time.perf_counter()
        call()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def worker(rank, ranks, init_file, out_dir, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks, init_method=f"file://{init_file}",
                            timeout=timedelta(seconds=600))
    log = CollectiveLog()
    wrap_collectives(log)
    group = dist.group.WORLD
    rows = []
    for name, shape, make in workloads(args):
        call, expected = make(rank, ranks, group)
        with torch.no_grad():
            got = call()
            error = (got - expected).abs().max().item() if got.numel() else 0.0
            total, collective, local, transfer = [], {}, [], {}
            for _ in range(args.repetitions):
                dist.barrier()
                log.reset()
                begin = time.perf_counter()
                call()
                elapsed = time.perf_counter() - begin
                total.append(elapsed)
                local.append(elapsed - sum(log.seconds.values()))
                for carrier, seconds in log.seconds.items():
                    collective.setdefault(carrier, []).append(seconds)
                calls, sent, collectives = dict(log.calls), dict(log.bytes), log.collectives
                for carrier, seconds in transfer_seconds(collectives, dist.barrier).items():
                    transfer.setdefault(carrier, []).append(seconds)
        rows.append({"workload": name, **shape, "rank": rank, "steps_on_rank": got.shape[1],
                     "median_s": statistics.median(total), "local_s": statistics.median(local),
                     "collective_s": {carrier: statistics.median(v) for carrier, v in collective.items()},
                     "transfer_s": {carrier: statistics.median(v) for carrier, v in transfer.items()},
                     "collective_calls": calls, "bytes_sent": sent, "max_abs_error_vs_one_process": error})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
        json.dump(rows, file)
    dist.destroy_process_group()


def run_ranks(ranks, args):
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(worker, args=(ranks, os.path.join(out_dir, "init"), out_dir, args), nprocs=ranks,
                           start_method="spawn")
        per_rank = []
        for rank in range(ranks):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as file:
                per_rank.append(json.load(file))
    return per_rank


def summarise(per_rank, ranks):
    """One row per workload: the slowest rank's time (the call's), the collectives of that rank and
    the largest bytes any rank sent, with every rank's numbers kept."""
    rows = []
    for index, first in enumerate(per_rank[0]):
        ranks_rows = [r[index] for r in per_rank]
        slowest = max(ranks_rows, key=lambda row: row["median_s"])
        row = {key: first[key] for key in ("workload", "B", "T", "N", "H", "iterations") if key in first}
        row.update({"ranks": ranks, "median_s": slowest["median_s"], "slowest_rank": slowest["rank"],
                    "collective_s": sum(slowest["collective_s"].values()), "local_s": slowest["local_s"],
                    "collective_s_by_carrier": slowest["collective_s"],
                    "transfer_s": max(sum(r["transfer_s"].values()) for r in ranks_rows),
                    "transfer_s_by_carrier": slowest["transfer_s"],
                    "bytes_sent_per_rank": max((r["bytes_sent"] for r in ranks_rows),
                                               key=lambda sent: sum(sent.values())),
                    "collective_calls": slowest["collective_calls"],
                    "max_abs_error_vs_one_process": max(r["max_abs_error_vs_one_process"] for r in ranks_rows),
                    "per_rank": ranks_rows})
        rows.append(row)
    return rows


def one_process(args):
    torch.set_num_threads(1)
    rows = []
    for name, shape, make in workloads(args):
        call, _ = make(0, 1, None)
        with torch.no_grad():
            rows.append({"workload": name, **shape, "ranks": 0, "median_s": time_calls(call, args.repetitions)})
    for T, seconds in one_process_general_path(args):
        rows.append({"workload": "newton_apply ParaGRU float64, general path", "B": args.gru_B, "T": T,
                     "H": args.gru_H, "iterations": args.iterations, "ranks": 0, "median_s": seconds})
    return rows


def print_table(results):
    print(f"{'workload':44} {'T':>6} {'ranks':>5} {'call ms':>9} {'collect ms':>10} {'transfer ms':>11} "
          f"{'local ms':>9} {'bytes/rank':>10}")
    for row in results:
        sent = sum(row.get("bytes_sent_per_rank", {}).values())
        print(f"{row['workload']:44} {row['T']:>6} {row['ranks'] or 'one':>5} {1e3 * row['median_s']:>9.2f} "
              f"{1e3 * row.get('collective_s', 0.0):>10.2f} {1e3 * row.get('transfer_s', 0.0):>11.2f} "
              f"{1e3 * row.get('local_s', row['median_s']):>9.2f} {sent:>10}")


def sizes(text):
    return [int(value) for value in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=sizes, default=[2, 4], help="numbers of gloo ranks, e.g. 2,4")
    parser.add_argument("--scan-T", type=sizes, default=[512, 2048, 8192])
    parser.add_argument("--scan-B", type=int, default=8)
    parser.add_argument("--scan-N", type=int, default=256)
    parser.add_argument("--gru-T", type=sizes, default=[256, 1024, 4096])
    parser.add_argument("--gru-B", type=int, default=8)
    parser.add_argument("--gru-H", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=3, help="the Newton iterations of every solve (fixed)")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--machine", default=f"{platform.machine()}, {os.cpu_count()} cores")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 ranks, 2 repetitions")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.scan_T, args.scan_B, args.scan_N = [2], [16], 2, 8
        args.gru_T, args.gru_B, args.gru_H, args.repetitions = [8], 2, 4, 2
    results = one_process(args)
    for ranks in args.ranks:
        results += summarise(run_ranks(ranks, args), ranks)
    print_table(results)
    try:
        sources = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        sources = None
    report = {"machine": args.machine, "cores": os.cpu_count(), "torch": torch.__version__, "backend": "gloo",
              "sources": sources, "command": " ".join(sys.argv), "threads_per_rank": 1,
              "oversubscribed": max(args.ranks) > (os.cpu_count() or 1),
              "repetitions": args.repetitions, "results": results}
    if args.out:
        with open(args.out, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
