// Batched Runge–Kutta loops in fp32: fixed-step RK4, forward and forward+gradient, fused and
// stepped (the cases: bench_rk.hpp; adaptive Dormand–Prince 5(4): bench_rk_adaptive.cpp). With
// Kokkos Kernels, KokkosODE's RK4 and RKDP run the oscillators for comparison.

#include "bench_rk.hpp"

#ifdef PARASEQ_HAVE_KOKKOSKERNELS
#include <paraseq/loops/kokkos_kernels.hpp>
#endif

namespace {

namespace ode = paraseq::ode;
using namespace paraseq::bench::rk;
using paraseq::bench::Space;

void rk4_fixed(benchmark::State& state) { run_method<ode::RK4>(state); }
PARASEQ_BENCHMARK(rk4_fixed)->Apply(grid);

// The RK4 gradient of the oscillators over 1000 steps against its checkpoint interval k (the
// default is ceil(sqrt(1000)) = 32): the backward pass replays k steps at a time into a buffer of k
// states per trajectory, which a GPU's L2 cache holds only while the resident trajectories' k states
// fit, and the forward pass writes steps / k checkpoints.
void rk4_gradient_interval(benchmark::State& state) { run_method<ode::RK4>(state, int(state.range(5))); }
PARASEQ_BENCHMARK(rk4_gradient_interval)
    ->ArgNames({"log2N", "n", "steps", "gradient", "stepped", "interval"})
    ->ArgsProduct({{16, 20}, {2}, {1000}, {1}, {0}, {4, 8, 16, 32, 64}});

#ifdef PARASEQ_HAVE_KOKKOSKERNELS
// paraseq (impl 0) against KokkosODE (impl 1) on double-precision oscillators: fixed RK4 (method 0)
// and adaptive Dormand–Prince (method 1, RKDP in KokkosODE) at rtol 1e-6, atol 1e-8. paraseq's
// fused loops alone: the library's compiled instances.
void versus_kokkos_ode(benchmark::State& state) {
  using KokkosODE::Experimental::ODE_params;
  using KokkosODE::Experimental::RK_type;
  using Double2 = Kokkos::View<double**, memory>;
  const int N = 1 << state.range(0), steps = int(state.range(1));
  const bool adaptive = state.range(2) != 0, kokkos = state.range(3) != 0;
  Kokkos::Random_XorShift64_Pool<Space> pool(3);
  Double2 y0("y0", N, 2), params("params", N, 2), y1("y1", N, 2);
  Kokkos::fill_random(y0, pool, -1.0, 1.0);
  Kokkos::fill_random(Kokkos::subview(params, Kokkos::ALL, 0), pool, 1.0, 4.0);
  Kokkos::fill_random(Kokkos::subview(params, Kokkos::ALL, 1), pool, 0.05, 0.5);
  Kokkos::View<int*, memory> counts("counts", N);
  const auto problem = ode::problem(ode::DampedOscillator{}, y0, params);
  ode::AdaptiveSteps interval;
  interval.t_end = steps * dt, interval.rtol = 1e-6, interval.atol = 1e-8;
  paraseq::bench::time_fenced(state, 6.0 * N * sizeof(double), 0, [&](const Space& space) {
    if (kokkos && adaptive)
      ode::kokkos_ode_solve<RK_type::RKDP>(space, problem, 0, steps * dt, ODE_params(100, 1000000, 1e-8, 1e-6, 1e-12), y1,
                                           counts);
    else if (kokkos)
      ode::kokkos_ode_solve<RK_type::RK4>(space, problem, 0, steps * dt, ODE_params(steps), y1, counts);
    else if (adaptive)
      ode::solve<ode::CompiledModes::fused_only>(space, ode::DormandPrince5{}, problem, interval, ode::final_state(y1));
    else
      ode::solve<ode::CompiledModes::fused_only>(space, ode::RK4{}, problem, ode::FixedSteps::count(0, dt, steps),
                                                 ode::final_state(y1));
  });
}
PARASEQ_BENCHMARK(versus_kokkos_ode)->ArgNames({"log2N", "steps", "adaptive", "kokkos"})->ArgsProduct({{10, 16}, {1000}, {0, 1}, {0, 1}});
#endif

} // namespace
