// paraseq demo: the diagonal recurrence h_t = a_t h_{t-1} + b_t over 2^26 values, in the two shapes
// that decide how it runs: many independent channels, and one very long channel. Each is solved by
// paraseq::linear_scan and by the loop a user would write on one CPU thread; the demo checks that
// they agree, times both, and prints the H200's time for the same call next to them.
//
//   tools/dev demo

#include <paraseq/core/linear_scan.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Array = Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space>;

struct Case {
  const char* title;
  int batch, steps, channels;
  double h200_ms; // docs/performance.md: perf_tests/results/2026-12-01-h200.json, commit 7ea1451
  const char* why;
};

template <class F>
double milliseconds(const F& f) {
  f(); // warm-up: first-touch pages, Kokkos' scratch
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Returns false if paraseq and the loop disagree.
bool run(const Space& space, const Case& c) {
  const paraseq::ScanShape shape{c.batch, c.steps, c.channels, 1};
  Array a("a", c.batch, c.steps, c.channels), b("b", c.batch, c.steps, c.channels), h("h", c.batch, c.steps, c.channels);
  Kokkos::Random_XorShift64_Pool<Space> pool(2026);
  Kokkos::fill_random(space, a, pool, 0.99f, 1.0f);
  Kokkos::fill_random(space, b, pool, -1.0f, 1.0f);
  const double scan_ms = milliseconds([&] {
    paraseq::linear_scan(space, paraseq::Diagonal{}, a, b, h);
    space.fence();
  });

  // The loop over time on one CPU thread, channels innermost (the order that reads memory in sequence).
  const auto a_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
  const auto b_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
  Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> loop("loop", c.batch, c.steps, c.channels);
  const double loop_ms = milliseconds([&] {
    for (int i = 0; i < c.batch; ++i)
      for (int t = 0; t < c.steps; ++t)
        for (int n = 0; n < c.channels; ++n)
          loop(i, t, n) = a_host(i, t, n) * (t > 0 ? loop(i, t - 1, n) : 0.0f) + b_host(i, t, n);
  });

  const auto h_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  float worst = 0;
  for (std::size_t i = 0; i < h_host.size(); ++i) worst = std::max(worst, std::abs(h_host.data()[i] - loop.data()[i]));

  const auto plan = paraseq::plan_scan<paraseq::Diagonal, float>(space, shape, {});
  std::printf("\n%s: B=%d, T=%d, N=%d\n", c.title, c.batch, c.steps, c.channels);
  if (plan.time_chunks == 1 && plan.team_chunks == 1)
    std::printf("  paraseq's plan: the loop over time, the %d channels spread over the space's threads\n",
                c.batch * c.channels);
  else
    std::printf("  paraseq's plan: time split into %d chunks of %d sub-chunks each (%s)\n", plan.time_chunks,
                plan.team_chunks, plan.single_pass ? "one pass" : "two passes");
  std::printf("  one CPU thread, plain loop  %9.2f ms\n", loop_ms);
  std::printf("  paraseq::linear_scan        %9.2f ms   %.1fx the loop's speed, max |difference| %.2g\n", scan_ms,
              loop_ms / scan_ms, worst);
  std::printf("  the same call on one H200   %9.3f ms   (%.0fx this machine's loop)\n", c.h200_ms, loop_ms / c.h200_ms);
  std::printf("  %s\n", c.why);
  // Both sum up to ~1/(1 - 0.99) terms of b in float, in different orders.
  return worst < 1e-2f;
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const Space space;
  std::printf("paraseq demo on %s, %d threads (float)\n", Space::name(), space.concurrency());
  const Case cases[] = {
      {"Many channels", 16, 1 << 12, 1 << 10, 0.245,
       "Enough independent channels fill every thread: paraseq runs the loop itself, on all of them."},
      {"One long channel", 1, 1 << 26, 1, 0.954,
       "One channel has no parallelism but time: the ordered scan composes chunks of steps and re-runs them, "
       "about twice the loop's work, so a host gains at most half its thread count; a GPU's thousands of threads "
       "are what this case is for."},
  };
  bool agree = true;
  for (const Case& c : cases) agree = run(space, c) && agree;
  return agree ? 0 : 1;
}
