#pragma once
// The Runge–Kutta benchmarks' cases (bench_rk.cpp: rk4_fixed and versus_kokkos_ode;
// bench_rk_adaptive.cpp: dopri5_adaptive, a unit of its own, since each method's loop kernels are
// most of a unit's nvcc time): batched loops in fp32 over N = 2^10, 2^16, 2^20 trajectories of state size
// n = 2 (damped oscillators, the anchors' workload), 8 and 32 (y' = A y with a shared stable A),
// for 128 and 1000 steps of 0.01 (adaptive: over the same interval, rtol 1e-6, atol 1e-8),
// forward (gradient:0) and forward+gradient (gradient:1: solve_with_gradient; adaptive also
// gradient:2: solve_with_gradient given the step counts of a solve() run before the timing, as
// paraseq.odeint's backward runs it after its forward), fused and stepped.
//
// Counters: bytes are the compulsory traffic (read y0 and the parameters, write the final state;
// the gradient also reads its cotangent and writes the gradients); flops count the field and
// the stage arithmetic of the steps actually taken (adaptive: accepted and rejected attempts),
// three times over for forward+gradient (forward, recomputation, and the vector-Jacobian products).

#include "bench_support.hpp"

#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>

#include <Kokkos_Random.hpp>

#include <cmath>

namespace paraseq::bench::rk {

namespace ode = paraseq::ode;
using memory = Space::memory_space;
using View1 = Kokkos::View<float*, memory>;
using View2 = Kokkos::View<float**, memory>;

inline constexpr double dt = 0.01;

// Parameters of the benchmark's arguments; checkpoint_interval 0 is the default ceil(sqrt(steps)).
struct Case {
  int N, n, steps;
  bool gradient, counted_before, stepped;
  int checkpoint_interval;
  Case(const benchmark::State& state, int checkpoint_interval_)
      : N(1 << state.range(0)), n(int(state.range(1))), steps(int(state.range(2))), gradient(state.range(3) != 0),
        counted_before(state.range(3) == 2), stepped(state.range(4) != 0), checkpoint_interval(checkpoint_interval_) {}
};

// Accepted and rejected steps of all trajectories.
template <class Report>
long total_attempts(const Space& space, const Report& report) {
  const auto accepted = report.accepted, rejected = report.rejected;
  long total = 0;
  Kokkos::parallel_reduce(
      "paraseq::bench::attempts", Kokkos::RangePolicy<Space>(space, 0, accepted.extent(0)),
      KOKKOS_LAMBDA(int i, long& sum) { sum += accepted(i) + rejected(i); }, total);
  return total;
}

// Stage arithmetic per step beyond the field: n values per nonzero tableau entry, two flops each.
template <class Method>
constexpr double stage_flops(int n) {
  int entries = 0;
  for (int i = 0; i < Method::stages; ++i)
    for (int j = 0; j < Method::stages; ++j) entries += Method::a[i][j] != 0;
  for (int j = 0; j < Method::stages; ++j) entries += Method::b[j] != 0 && !Method::fsal;
  if (Method::embedded_order > 0)
    for (int j = 0; j < Method::stages; ++j) entries += Method::b[j] != Method::b_hat[j];
  return 2.0 * n * (entries + Method::stages);
}

template <class Method, class Problem>
void run_case(benchmark::State& state, const Case& c, const Problem& problem, double field_flops, double parameter_bytes) {
  Kokkos::Random_XorShift64_Pool<Space> pool(7);
  View2 y1("y1", c.N, c.n), cotangent("cotangent", c.N, c.n), y0_bar("y0_bar", c.N, c.n);
  Kokkos::fill_random(cotangent, pool, -1.0f, 1.0f);
  ode::SolveOptions options;
  options.mode = c.stepped ? ode::LoopMode::stepped : ode::LoopMode::fused;
  options.checkpoint_interval = c.checkpoint_interval;
  constexpr bool adaptive = ode::is_adaptive_method_v<Method>;
  const auto steps = [&] {
    if constexpr (adaptive) {
      ode::AdaptiveSteps interval;
      interval.t_end = c.steps * dt, interval.rtol = 1e-6, interval.atol = 1e-8;
      return interval;
    } else {
      return ode::FixedSteps::count(0, dt, c.steps);
    }
  }();

  // gradient:2: the step counts of a forward solve, as SolveOptions::accepted_steps.
  ode::Report<memory> forward_report;
  if (c.counted_before) {
    forward_report = ode::solve(Space{}, Method{}, problem, steps, ode::final_state(y1), options);
    options.accepted_steps = forward_report.accepted.data();
  }
  long attempts = -1; // counted on the first call, outside the timed ones
  auto work = [&](const Space& space) {
    const auto report =
        c.gradient ? ode::solve_with_gradient(space, Method{}, problem, steps, ode::final_state(y1),
                                              ode::final_state(cotangent), ode::Gradients<View2>{y0_bar}, options)
                   : ode::solve(space, Method{}, problem, steps, ode::final_state(y1), options);
    if (attempts < 0) attempts = adaptive ? total_attempts(space, report) : long(c.N) * c.steps;
  };
  work(Space{}); // counts the attempts for the counters
  const double evaluations = Method::fsal ? Method::stages - 1 : Method::stages;
  const double flops = (c.gradient ? 3 : 1) * double(attempts) * (evaluations * field_flops + stage_flops<Method>(c.n));
  const double state_bytes = double(c.N) * c.n * sizeof(float);
  const double bytes = (c.gradient ? 4 : 2) * state_bytes + parameter_bytes;
  paraseq::bench::time_fenced(state, bytes, flops, work);
  state.counters["steps_per_trajectory"] = double(attempts) / c.N;
}

template <class Method>
void run_method(benchmark::State& state, int checkpoint_interval = 0) {
  const Case c(state, checkpoint_interval);
  Kokkos::Random_XorShift64_Pool<Space> pool(3);
  View2 y0("y0", c.N, c.n);
  Kokkos::fill_random(y0, pool, -1.0f, 1.0f);
  if (c.n == 2) {
    View2 params("params", c.N, 2);
    auto k = Kokkos::subview(params, Kokkos::ALL, 0), damping = Kokkos::subview(params, Kokkos::ALL, 1);
    Kokkos::fill_random(k, pool, 1.0f, 4.0f);
    Kokkos::fill_random(damping, pool, 0.05f, 0.5f);
    run_case<Method>(state, c, ode::problem(ode::DampedOscillator{}, y0, params), 4, double(c.N) * 2 * sizeof(float));
  } else {
    // A = -I + B / sqrt(n) with B uniform in [-0.5, 0.5): stable, with all components coupled.
    View2 B("B", c.n, c.n);
    Kokkos::fill_random(B, pool, -0.5f, 0.5f);
    View1 A("A", c.n * c.n);
    const int n = c.n;
    Kokkos::parallel_for(
        "paraseq::bench::linear_A", Kokkos::RangePolicy<Space>(0, n * n), KOKKOS_LAMBDA(int e) {
          A(e) = B(e / n, e % n) / Kokkos::sqrt(float(n)) - float(e / n == e % n);
        });
    run_case<Method>(state, c, ode::problem(ode::Linear<>{n}, y0, ode::NoView{}, A), 2.0 * n * n,
                     double(n) * n * sizeof(float));
  }
}

// The arguments of rk4_fixed and dopri5_adaptive (gradient:2, adaptive steps only: given the
// forward's step counts).
inline void grid(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"log2N", "n", "steps", "gradient", "stepped"})
      ->ArgsProduct({{10, 16, 20}, {2, 8, 32}, {128, 1000}, {0, 1}, {0, 1}});
}
inline void adaptive_grid(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"log2N", "n", "steps", "gradient", "stepped"})
      ->ArgsProduct({{10, 16, 20}, {2, 8, 32}, {128, 1000}, {0, 1, 2}, {0, 1}});
}

} // namespace paraseq::bench::rk
