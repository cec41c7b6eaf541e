// Uses the installed headers: h_t = 0.5 h_{t-1} + 1 from h_{-1} = 0 has the closed form 2 (1 - 0.5^(t+1)).
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
  std::printf("installed paraseq: max error against the closed form %.3g\n", worst);
  return worst < 1e-14 ? 0 : 1;
}
