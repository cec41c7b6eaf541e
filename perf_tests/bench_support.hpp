#pragma once
// Shared benchmark machinery. Every benchmark times fenced calls on the default execution space
// (manual time, so the fence is inside the measurement) and reports its compulsory traffic and
// arithmetic as counters; the runner (run_benchmarks.py) turns them into GB/s, GFLOP/s and a
// percentage of the ceilings measured in the same run by bench_ceilings.cpp.

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>

namespace paraseq::bench {

using Space = Kokkos::DefaultExecutionSpace;

// Times `work(space)` once per benchmark iteration, fenced, and records bytes and flops per call.
template <class Work>
void time_fenced(benchmark::State& state, double bytes, double flops, Work&& work) {
  Space space;
  work(space); // warm-up: first-touch, allocations, code paths
  space.fence();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    work(space);
    space.fence();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.counters["bytes"] = bytes;
  state.counters["flops"] = flops;
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Registers a benchmark with the conventions above (manual time, median-friendly repetitions).
#define PARASEQ_BENCHMARK(fn) BENCHMARK(fn)->UseManualTime()->Unit(benchmark::kMicrosecond)

} // namespace paraseq::bench
