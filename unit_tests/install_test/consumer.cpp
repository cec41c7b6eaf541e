// Uses the installed headers: h_t = 0.5 h_{t-1} + 1 from h_{-1} = 0 has the closed form 2 (1 - 0.5^(t+1)),
// and RK4 on the undamped oscillator y'' = -y from (1, 0) gives (cos t, -sin t).
#include <paraseq/paraseq.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const int steps = 64;
  Kokkos::View<double***> a("a", 1, steps, 3), b("b", 1, steps, 3), h("h", 1, steps, 3);
  Kokkos::deep_copy(a, 0.5);
  Kokkos::deep_copy(b, 1.0);
  paraseq::linear_scan(Kokkos::DefaultExecutionSpace{}, paraseq::Diagonal{}, a, b, h);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  double worst = 0;
  for (int t = 0; t < steps; ++t)
    for (int n = 0; n < 3; ++n) worst = std::fmax(worst, std::fabs(host(0, t, n) - 2 * (1 - std::pow(0.5, t + 1))));
  std::printf("installed paraseq: scan's max error against the closed form %.3g\n", worst);

  const int trajectories = 4, rk_steps = 1000;
  const double dt = 1e-3;
  Kokkos::View<double**> y0("y0", trajectories, 2), params("params", trajectories, 2), y1("y1", trajectories, 2);
  auto y0_host = Kokkos::create_mirror_view(y0);
  auto params_host = Kokkos::create_mirror_view(params);
  for (int i = 0; i < trajectories; ++i) y0_host(i, 0) = 1, y0_host(i, 1) = 0, params_host(i, 0) = 1, params_host(i, 1) = 0;
  Kokkos::deep_copy(y0, y0_host);
  Kokkos::deep_copy(params, params_host);
  namespace ode = paraseq::ode;
  ode::solve<ode::CompiledModes::fused_only>(Kokkos::DefaultExecutionSpace{}, ode::RK4{},
                                             ode::problem(ode::DampedOscillator{}, y0, params),
                                             ode::FixedSteps::count(0, dt, rk_steps), ode::final_state(y1));
  auto y1_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y1);
  double rk_worst = 0;
  for (int i = 0; i < trajectories; ++i)
    rk_worst = std::fmax(rk_worst, std::fmax(std::fabs(y1_host(i, 0) - std::cos(1.0)), std::fabs(y1_host(i, 1) + std::sin(1.0))));
  std::printf("installed paraseq: RK4's max error against the closed form %.3g\n", rk_worst);
  return worst < 1e-14 && rk_worst < 1e-12 ? 0 : 1;
}
