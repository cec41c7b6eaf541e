// paraseq demo: solve a batch of long linear recurrences h_t = a_t h_{t-1} + b_t with the ordered
// parallel scan, check it against the plain sequential loop, and show what each costs.
//
//   tools/dev demo

#include <paraseq/core/linear_scan.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using Space = Kokkos::DefaultExecutionSpace;
  using Array = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;
  const int batch = 2, steps = 1 << 20, channels = 4;

  Space space;
  Array a("a", batch, steps, channels), b("b", batch, steps, channels);
  Array h_parallel("h_parallel", batch, steps, channels), h_sequential("h_sequential", batch, steps, channels);
  Kokkos::Random_XorShift64_Pool<Space> pool(2026);
  Kokkos::fill_random(space, a, pool, 0.99f, 1.0f);
  Kokkos::fill_random(space, b, pool, -1.0f, 1.0f);

  auto timed = [&](const char* label, const paraseq::ScanConfig& config, const Array& h) {
    paraseq::linear_scan(space, paraseq::Diagonal{}, a, b, h, config); // warm-up
    space.fence();
    const auto start = std::chrono::steady_clock::now();
    paraseq::linear_scan(space, paraseq::Diagonal{}, a, b, h, config);
    space.fence();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const auto plan = paraseq::plan_scan<paraseq::Diagonal, float>(
        space, paraseq::ScanShape{batch, steps, channels, 1}, config);
    std::printf("  %-22s %8.2f ms   (time chunks %d, sub-chunks per team %d)\n", label, ms, plan.time_chunks,
                plan.team_chunks);
    return ms;
  };

  std::printf("paraseq demo on %s with concurrency %d: B=%d, T=%d, N=%d (float)\n", Space::name(),
              space.concurrency(), batch, steps, channels);
  const double parallel_ms = timed("ordered parallel scan", {}, h_parallel);
  const double sequential_ms = timed("sequential loop", paraseq::sequential_scan_config, h_sequential);

  float max_difference = 0;
  Kokkos::parallel_reduce(
      "paraseq::demo::compare", Kokkos::RangePolicy<Space>(space, 0, std::size_t(batch) * steps * channels),
      KOKKOS_LAMBDA(std::size_t i, float& worst) {
        worst = Kokkos::fmax(worst, Kokkos::fabs(h_parallel.data()[i] - h_sequential.data()[i]));
      },
      Kokkos::Max<float>(max_difference));
  std::printf("  speed-up %.2fx, max |parallel - sequential| = %.3g\n", sequential_ms / parallel_ms, max_difference);
  return max_difference < 1e-2f ? 0 : 1;
}
