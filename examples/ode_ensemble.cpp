// An ensemble of damped oscillators y'' = -k y - c y' with per-trajectory k and c, integrated with
// fixed-step RK4 and adaptive Dormand–Prince 5(4), checked against the closed form, and
// differentiated with respect to the initial states and the parameters. docs/loops.md walks
// through it; CI builds it (paraseq_ode_ensemble).

#include <paraseq/paraseq.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>

namespace ode = paraseq::ode;

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using Space = Kokkos::DefaultExecutionSpace;
  using View2 = Kokkos::View<double**, Space::memory_space>;
  using View3 = Kokkos::View<double***, Space::memory_space>;
  const int N = 1 << 14;

  // y0 [N, 2] = (1, 0); params [N, 2] = (k, c) with k in [1, 4), c = 0.1.
  View2 y0("y0", N, 2), params("params", N, 2);
  Kokkos::parallel_for("setup", N, KOKKOS_LAMBDA(int i) {
    y0(i, 0) = 1, y0(i, 1) = 0;
    params(i, 0) = 1 + 3.0 * i / N, params(i, 1) = 0.1;
  });
  const auto problem = ode::problem(ode::DampedOscillator{}, y0, params);
  Space space;

  // 1000 RK4 steps of 0.01, the whole loop in one kernel: the final state [N, 2].
  View2 y_rk4("y_rk4", N, 2);
  ode::solve(space, ode::RK4{}, problem, ode::FixedSteps::count(0, 0.01, 1000), ode::final_state(y_rk4));

  // Adaptive steps on [0, 10], observed at t = 2.5, 5, 7.5 and 10 through the dense output.
  ode::AdaptiveSteps adaptive;
  adaptive.t_end = 10, adaptive.rtol = 1e-8, adaptive.atol = 1e-10;
  adaptive.observe_at({2.5, 5, 7.5, 10});
  View3 observed("observed", N, 4, 2);
  const auto report = ode::solve(space, ode::DormandPrince5{}, problem, adaptive, ode::observed(observed));

  // Gradients of L = sum_i y_i(10) with respect to y0 and (k, c), through the adaptive steps taken.
  View2 y_end("y_end", N, 2), ones("ones", N, 2), y0_bar("y0_bar", N, 2), params_bar("params_bar", N, 2);
  Kokkos::deep_copy(ones, 1.0);
  adaptive.observation_times.clear();
  ode::solve_with_gradient(space, ode::DormandPrince5{}, problem, adaptive, ode::final_state(y_end),
                           ode::final_state(ones), ode::Gradients<View2, View2>{y0_bar, params_bar});

  // The last trajectory against the closed form y(t) = exp(-c t / 2) (cos w t + c / (2 w) sin w t).
  auto rk4 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y_rk4);
  auto obs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, observed);
  auto grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, params_bar);
  const double k = 1 + 3.0 * (N - 1) / N, c = 0.1, w = std::sqrt(k - c * c / 4);
  auto exact = [&](double t) { return std::exp(-c * t / 2) * (std::cos(w * t) + c / (2 * w) * std::sin(w * t)); };
  std::printf("%d oscillators on %s\n", N, Space::name());
  std::printf("  RK4, 1000 steps:      y(10) = %.12f, error %.1e\n", rk4(N - 1, 0), std::fabs(rk4(N - 1, 0) - exact(10)));
  std::printf("  DP5, at most %d steps: y(10) = %.12f, error %.1e\n", report.max_accepted, obs(N - 1, 3, 0),
              std::fabs(obs(N - 1, 3, 0) - exact(10)));
  std::printf("  dL/dk = %.6f, dL/dc = %.6f for the last trajectory\n", grad(N - 1, 0), grad(N - 1, 1));
  return 0;
}
