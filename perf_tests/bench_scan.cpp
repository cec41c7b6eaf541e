// Linear-recurrence scan throughput. Arguments: log2(B*N), log2(T), and the decomposition
// (0 = automatic plan, 1 = forced sequential-in-time loop, 2 = the one-pass time split, 3 = the
// two-pass time split; 2 and 3 on devices only), so one run gives every side of each choice for
// each (B*N, T). Compulsory traffic: read A and b, write h.

#include <paraseq/core/linear_scan.hpp>

#include "bench_support.hpp"

#include <exception>

namespace {

using paraseq::bench::Space;
using Array3 = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;

paraseq::ScanConfig decomposition(std::int64_t mode) {
  if (mode == 2) return paraseq::ScanConfig{0, 0, 0, paraseq::TimeSplit::single_pass};
  if (mode == 3) return paraseq::ScanConfig{0, 0, 0, paraseq::TimeSplit::two_pass};
  return mode == 1 ? paraseq::sequential_scan_config : paraseq::ScanConfig{};
}

void fill(const auto& view, float lo, float hi) { paraseq::bench::fill_uniform(view, lo, hi, 12345); }

// Diagonal A: [1, T, B*N] (the scan does not distinguish batch from channel for a diagonal A).
template <bool Reverse>
void scan_diagonal(benchmark::State& state) {
  const int channels = 1 << state.range(0), steps = 1 << state.range(1);
  Array3 A("A", 1, steps, channels), b("b", 1, steps, channels), h("h", 1, steps, channels);
  fill(A, 0.9f, 1.0f);
  fill(b, -1.0f, 1.0f);
  const double elements = double(channels) * steps;
  paraseq::bench::time_fenced(state, 12.0 * elements, 2.0 * elements, [&](const Space& space) {
    if constexpr (Reverse) paraseq::linear_scan_reverse(space, paraseq::Diagonal{}, A, b, h, decomposition(state.range(2)));
    else paraseq::linear_scan(space, paraseq::Diagonal{}, A, b, h, decomposition(state.range(2)));
  });
}

void scan_block2(benchmark::State& state) {
  const int channels = 1 << state.range(0), steps = 1 << state.range(1);
  Kokkos::View<float*****, Kokkos::LayoutRight, Space::memory_space> A("A", 1, steps, channels / 2, 2, 2);
  Array3 b("b", 1, steps, channels), h("h", 1, steps, channels);
  fill(A, -0.5f, 0.5f);
  fill(b, -1.0f, 1.0f);
  const double elements = double(channels) * steps;
  paraseq::bench::time_fenced(state, (2 + 1 + 1) * 4.0 * elements, 4.0 * elements, [&](const Space& space) {
    paraseq::linear_scan(space, paraseq::BlockDiagonal<2>{}, A, b, h, decomposition(state.range(2)));
  });
}

// Dense A: [B, T, 16, 16]; range(0) is log2(B).
void scan_dense16(benchmark::State& state) {
  constexpr int N = 16;
  const int batch = 1 << state.range(0), steps = 1 << state.range(1);
  Kokkos::View<float****, Kokkos::LayoutRight, Space::memory_space> A("A", batch, steps, N, N);
  Array3 b("b", batch, steps, N), h("h", batch, steps, N);
  fill(A, -0.05f, 0.05f);
  fill(b, -1.0f, 1.0f);
  const double steps_total = double(batch) * steps;
  paraseq::bench::time_fenced(state, 4.0 * steps_total * (N * N + 2 * N), 2.0 * steps_total * N * N,
                              [&](const Space& space) {
                                paraseq::linear_scan(space, paraseq::Dense{}, A, b, h, decomposition(state.range(2)));
                              });
}

// One channel x 2^log2T steps in the one-pass scan with the window forced: P sub-chunks (threads)
// per team of L steps each (the device plan's P = 256, L = 16: windows of 4096 steps). Devices only,
// where the one-pass scan stages its windows; a run shows what another window would gain.
void scan_one_channel_window(benchmark::State& state) {
  const int steps = 1 << state.range(0);
  Array3 A("A", 1, steps, 1), b("b", 1, steps, 1), h("h", 1, steps, 1);
  fill(A, 0.9f, 1.0f);
  fill(b, -1.0f, 1.0f);
  const paraseq::ScanConfig window{int(state.range(1)), int(state.range(2)), 0, paraseq::TimeSplit::single_pass};
  try {
    paraseq::bench::time_fenced(state, 12.0 * steps, 2.0 * steps, [&](const Space& space) {
      paraseq::linear_scan(space, paraseq::Diagonal{}, A, b, h, window);
    });
  } catch (const std::exception& error) { // a window whose team does not fit this device
    state.SkipWithError(error.what());
  }
}

// (log2 B*N, log2 T) pairs: 2^22 elements for the quick suite, 2^26 for the full one.
void diagonal_grid(benchmark::internal::Benchmark* bench) {
  for (auto [bn, t] : {std::pair{0, 22}, {6, 16}, {10, 12}, {14, 8}, {0, 26}, {8, 18}, {12, 14}, {14, 12}, {16, 10}, {20, 6}}) {
    for (int mode : {0, 1}) bench->Args({bn, t, mode});
    if (!paraseq::runs_on_host<Space> && bn + t == 26 && bn <= 12)
      for (int mode : {2, 3}) bench->Args({bn, t, mode});
  }
  bench->ArgNames({"log2BN", "log2T", "sequential"});
}

PARASEQ_BENCHMARK(scan_diagonal<false>)->Name("scan_diagonal_forward")->Apply(diagonal_grid);
[[maybe_unused]] const bool one_channel_windows_registered = [] {
  if constexpr (!paraseq::runs_on_host<Space>)
    for (int P : {64, 128, 256, 512})
      for (int L : {4, 8, 16})
        benchmark::RegisterBenchmark("scan_one_channel_window", scan_one_channel_window)
            ->Args({26, P, L})
            ->ArgNames({"log2T", "P", "L"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  return true;
}();
PARASEQ_BENCHMARK(scan_diagonal<true>)
    ->Name("scan_diagonal_reverse")
    ->Args({10, 12, 0})
    ->Args({14, 12, 0})
    ->ArgNames({"log2BN", "log2T", "sequential"});
PARASEQ_BENCHMARK(scan_block2)
    ->Args({10, 12, 0})
    ->Args({10, 12, 1})
    ->Args({14, 12, 0})
    ->ArgNames({"log2BN", "log2T", "sequential"});
PARASEQ_BENCHMARK(scan_dense16)
    ->Args({0, 16, 0})
    ->Args({0, 16, 1})
    ->Args({6, 12, 0})
    ->Args({10, 12, 0})
    ->ArgNames({"log2B", "log2T", "sequential"});

} // namespace
