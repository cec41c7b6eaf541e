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
#include <stdexcept>

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

// Fills a contiguous View with uniform values in [lo, hi) from `seed`. Kokkos::fill_random
// parallelises over the first extent only (128 rows per thread), so it would fill a [16, 4096, 3072]
// View, or a scan's [1, T, N], with a single GPU thread, for seconds per benchmark run (why
// benchmark runs before 87b6231 made no progress on the H200); the flat view of the span spreads
// the draws over the whole device.
template <class View>
void fill_uniform(const View& view, typename View::const_value_type lo, typename View::const_value_type hi, unsigned seed) {
  if (!view.span_is_contiguous()) throw std::invalid_argument("paraseq::bench::fill_uniform: the View must be contiguous");
  Kokkos::View<typename View::non_const_value_type*, typename View::memory_space, Kokkos::MemoryUnmanaged> flat(
      view.data(), view.span());
  Kokkos::Random_XorShift64_Pool<Space> pool(seed);
  Kokkos::fill_random(flat, pool, lo, hi);
}

// Registers a benchmark with the conventions above (manual time, median-friendly repetitions).
#define PARASEQ_BENCHMARK(fn) BENCHMARK(fn)->UseManualTime()->Unit(benchmark::kMicrosecond)

} // namespace paraseq::bench
