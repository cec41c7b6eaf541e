// The ceilings every other benchmark is compared with, measured in the same run: a copy kernel
// (bytes read + written per second) and an FMA kernel (flops per second).

#include "bench_support.hpp"

namespace {

using paraseq::bench::Space;

void ceiling_copy(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  Kokkos::View<float*, Space::memory_space> src("src", n), dst("dst", n);
  Kokkos::deep_copy(src, 1.0f);
  paraseq::bench::time_fenced(state, 2.0 * n * sizeof(float), 0, [&](const Space& space) {
    Kokkos::parallel_for("paraseq::bench::copy", Kokkos::RangePolicy<Space>(space, 0, n),
                         KOKKOS_LAMBDA(std::size_t i) { dst(i) = src(i); });
  });
}
PARASEQ_BENCHMARK(ceiling_copy)->Arg(1 << 26);

// The same copy through the runtime's own copy (cudaMemcpyAsync on CUDA): a check that the
// parallel_for copy above is a fair ceiling.
void ceiling_copy_runtime(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  Kokkos::View<float*, Space::memory_space> src("src", n), dst("dst", n);
  Kokkos::deep_copy(src, 1.0f);
  paraseq::bench::time_fenced(state, 2.0 * n * sizeof(float), 0,
                              [&](const Space& space) { Kokkos::deep_copy(space, dst, src); });
}
PARASEQ_BENCHMARK(ceiling_copy_runtime)->Arg(1 << 26);

// Eight independent FMA chains per element hide the FMA latency; the result is stored so the
// compiler keeps the arithmetic.
void ceiling_fma(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(0));
  constexpr int rounds = 256, chains = 8;
  Kokkos::View<float*, Space::memory_space> out("out", n);
  paraseq::bench::time_fenced(state, double(n) * sizeof(float), 2.0 * rounds * chains * n, [&](const Space& space) {
    Kokkos::parallel_for("paraseq::bench::fma", Kokkos::RangePolicy<Space>(space, 0, n), KOKKOS_LAMBDA(std::size_t i) {
      float acc[chains];
      for (int c = 0; c < chains; ++c) acc[c] = float(i % 7) * 1e-3f + c;
      for (int r = 0; r < rounds; ++r)
        for (int c = 0; c < chains; ++c) acc[c] = acc[c] * 0.999f + 0.001f;
      float sum = 0;
      for (int c = 0; c < chains; ++c) sum += acc[c];
      out(i) = sum;
    });
  });
}
PARASEQ_BENCHMARK(ceiling_fma)->Arg(1 << 20);

} // namespace
