// paraseq demo: two recurrences over 2^26 values and an ODE ensemble, each solved by paraseq and by
// the loop a user would write on one CPU thread. The demo checks that they agree, times both, and
// prints the H200's time for the same call next to them (perf_tests/results/2026-12-01-h200.json,
// commit 7ea1451; the ensemble: 2026-11-29-h200.json):
//   * a ParaGRU layer's recurrence over a batch of sequences (B=16, T=4096, H=1024): many
//     independent channels, where paraseq runs the loop itself on every thread (on a GPU, where the
//     channels do not fill the device, Newton's method over the whole sequence);
//   * the diagonal linear recurrence h_t = a_t h_{t-1} + b_t as one channel of 2^26 steps, which has
//     no parallelism but time: the ordered scan's case;
//   * an ensemble of 2^16 damped oscillators, RK4 over 1000 steps: independent trajectories, which
//     every thread of a CPU shares (the built-in field's loop is compiled into the paraseq library).
//
//   tools/dev demo

#include <paraseq/paraseq.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using memory = Space::memory_space;
using Array2 = Kokkos::View<float**, Kokkos::LayoutRight, memory>;
using Array3 = Kokkos::View<float***, Kokkos::LayoutRight, memory>;
using HostArray3 = Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace>;

template <class F>
double milliseconds(const F& f) {
  f(); // warm-up: first-touch pages, Kokkos' scratch
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

float max_difference(const Array3& paraseq_result, const HostArray3& loop) {
  const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, paraseq_result);
  float worst = 0;
  for (std::size_t i = 0; i < result.size(); ++i) worst = std::max(worst, std::abs(result.data()[i] - loop.data()[i]));
  return worst;
}

void report(const std::string& plan, double paraseq_ms, double loop_ms, float difference, double h200_ms,
            const char* why) {
  std::printf("  paraseq's plan: %s\n", plan.c_str());
  std::printf("  one CPU thread, plain loop  %9.2f ms\n", loop_ms);
  std::printf("  paraseq                     %9.2f ms   %.1fx the loop's speed, max |difference| %.2g\n", paraseq_ms,
              loop_ms / paraseq_ms, difference);
  std::printf("  the same call on one H200   %9.3f ms   (%.0fx this machine's loop)\n", h200_ms, loop_ms / h200_ms);
  std::printf("  %s\n", why);
}

float logistic(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The ParaGRU recurrence of src/solvers/cells.hpp from pre-projected inputs u [B, T, 3H] (gates z, r,
// c): h_t = h + z (c - h), z = logistic(a_z h + u_z), r = logistic(a_r h + u_r),
// c = tanh(a_c (h r) + u_c). Returns whether paraseq and the loop agree.
bool gru(const Space& space) {
  const int B = 16, T = 4096, H = 1024;
  std::printf("\nParaGRU recurrence, K = 3 Newton iterations where Newton runs: B=%d, T=%d, H=%d\n", B, T, H);
  Array3 u("u", B, T, 3 * H), h("h", B, T, H);
  Array2 a("a", 3, H);
  Kokkos::Random_XorShift64_Pool<Space> pool(2026);
  Kokkos::fill_random(space, u, pool, -1.0f, 1.0f);
  Kokkos::fill_random(space, a, pool, -0.5f, 0.5f);
  const paraseq::ParaGRU<float, memory> cell{a};
  paraseq::NewtonStats<memory> stats;
  paraseq::newton_solve(space, cell, u, h, {}, paraseq::ZeroInitialState{}, &stats);
  const double paraseq_ms = milliseconds([&] {
    paraseq::newton_solve(space, cell, u, h);
    space.fence();
  });

  const auto u_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, u);
  const auto a_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
  HostArray3 loop("loop", B, T, H);
  const double loop_ms = milliseconds([&] {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int g = 0; g < H; ++g) {
          const float before = t > 0 ? loop(b, t - 1, g) : 0.0f;
          const float z = logistic(a_host(0, g) * before + u_host(b, t, g));
          const float r = logistic(a_host(1, g) * before + u_host(b, t, H + g));
          const float c = std::tanh(a_host(2, g) * (before * r) + u_host(b, t, 2 * H + g));
          loop(b, t, g) = before + z * (c - before);
        }
  });

  const std::string plan = stats.mode == paraseq::NewtonMode::sequential
                               ? "the loop over time, the " + std::to_string(B * H) + " channels spread over the threads"
                               : "Newton's method over the whole sequence, " + std::to_string(stats.iterations) +
                                     " iterations";
  const float difference = max_difference(h, loop);
  report(plan, paraseq_ms, loop_ms, difference, 0.801,
         "A host runs this loop on its threads; a GPU, whose threads outnumber the channels, solves every "
         "step at once.");
  return difference < 1e-3f; // exp, tanh and division round differently inside the library
}

// Returns whether paraseq and the loop agree.
bool long_channel(const Space& space) {
  const int steps = 1 << 26;
  std::printf("\nDiagonal linear recurrence, one channel: B=1, T=%d, N=1\n", steps);
  Array3 a("a", 1, steps, 1), b("b", 1, steps, 1), h("h", 1, steps, 1);
  Kokkos::Random_XorShift64_Pool<Space> pool(2027);
  Kokkos::fill_random(space, a, pool, 0.99f, 1.0f);
  Kokkos::fill_random(space, b, pool, -1.0f, 1.0f);
  const double paraseq_ms = milliseconds([&] {
    paraseq::linear_scan(space, paraseq::Diagonal{}, a, b, h);
    space.fence();
  });

  const auto a_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
  const auto b_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
  HostArray3 loop("loop", 1, steps, 1);
  const double loop_ms = milliseconds([&] {
    float state = 0;
    for (int t = 0; t < steps; ++t) loop(0, t, 0) = state = a_host(0, t, 0) * state + b_host(0, t, 0);
  });

  const auto plan = paraseq::plan_scan<paraseq::Diagonal, float>(space, paraseq::ScanShape{1, steps, 1, 1}, {});
  const std::string described =
      plan.time_chunks == 1 && plan.team_chunks == 1
          ? std::string("the loop over time (too few threads for splitting time to pay)")
          : "time split into " + std::to_string(plan.time_chunks) + " chunks of " + std::to_string(plan.team_chunks) +
                " sub-chunks, " + (plan.single_pass ? "one pass" : "two passes");
  const float difference = max_difference(h, loop);
  report(described, paraseq_ms, loop_ms, difference, 0.954,
         "The ordered scan composes chunks of steps and re-runs them, about twice the loop's work, so a host "
         "gains at most half its thread count; a GPU's thousands of threads are what this case is for.");
  return difference < 1e-2f; // both sum about 1/(1 - 0.99) terms of b in float, in different orders
}

// y'' = -k y - c y' per trajectory, k in [1, 4), c in [0.05, 0.5), from y0 in [-1, 1)^2: RK4 with
// dt = 0.01. Returns whether paraseq and the loop agree.
bool ensemble(const Space& space) {
  const int N = 1 << 16, steps = 1000;
  const float dt = 0.01f;
  std::printf("\nRK4 ensemble: N=%d damped oscillators, %d steps\n", N, steps);
  Array2 y0("y0", N, 2), params("params", N, 2), y1("y1", N, 2);
  Kokkos::Random_XorShift64_Pool<Space> pool(2028);
  Kokkos::fill_random(space, y0, pool, -1.0f, 1.0f);
  Kokkos::fill_random(space, Kokkos::subview(params, Kokkos::ALL, 0), pool, 1.0f, 4.0f);
  Kokkos::fill_random(space, Kokkos::subview(params, Kokkos::ALL, 1), pool, 0.05f, 0.5f);
  namespace ode = paraseq::ode;
  const double paraseq_ms = milliseconds([&] {
    ode::solve<ode::CompiledModes::fused_only>(space, ode::RK4{}, ode::problem(ode::DampedOscillator{}, y0, params),
                                               ode::FixedSteps::count(0, dt, steps), ode::final_state(y1));
    space.fence();
  });

  const auto y0_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y0);
  const auto params_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, params);
  HostArray3 loop("loop", N, 1, 2);
  const double loop_ms = milliseconds([&] {
    for (int i = 0; i < N; ++i) {
      const float k = params_host(i, 0), c = params_host(i, 1);
      auto field = [&](float y, float v, float& dy, float& dv) { dy = v, dv = -k * y - c * v; };
      float y = y0_host(i, 0), v = y0_host(i, 1);
      for (int step = 0; step < steps; ++step) {
        float k1y, k1v, k2y, k2v, k3y, k3v, k4y, k4v;
        field(y, v, k1y, k1v);
        field(y + 0.5f * dt * k1y, v + 0.5f * dt * k1v, k2y, k2v);
        field(y + 0.5f * dt * k2y, v + 0.5f * dt * k2v, k3y, k3v);
        field(y + dt * k3y, v + dt * k3v, k4y, k4v);
        y += dt / 6 * (k1y + 2 * k2y + 2 * k3y + k4y);
        v += dt / 6 * (k1v + 2 * k2v + 2 * k3v + k4v);
      }
      loop(i, 0, 0) = y, loop(i, 0, 1) = v;
    }
  });

  const float difference = max_difference(Array3(y1.data(), N, 1, 2), loop);
  report("one trajectory per thread at a time, the whole time loop in one kernel", paraseq_ms, loop_ms, difference,
         0.241,
         "Independent trajectories need no parallelism in time: every thread of a CPU or a GPU takes its own.");
  return difference < 1e-4f; // the same steps; the stages' sums round in a different order
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const Space space;
  std::printf("paraseq demo on %s, %d threads (float)\n", Space::name(), space.concurrency());
  const bool gru_agrees = gru(space);
  const bool scan_agrees = long_channel(space);
  const bool ensemble_agrees = ensemble(space);
  return gru_agrees && scan_agrees && ensemble_agrees ? 0 : 1;
}
