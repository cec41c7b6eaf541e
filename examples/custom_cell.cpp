// A cell of your own: a leaky tanh unit h_t = (1 - a) h_{t-1} + a tanh(w h_{t-1} + u_t) per channel,
// solved by newton_solve and checked against the sequential loop. A cell needs no vjp unless
// newton_backward runs it. A user-written cell takes the header path: this file compiles the
// solver's kernels for it (the built-in cells come compiled
// with the paraseq library, docs/architecture.md, "Compiled instances").
#include <paraseq/paraseq.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <cmath>
#include <cstdio>

struct LeakyTanh {
  using structure = paraseq::Diagonal;
  static constexpr int max_inputs_per_group = 1;
  static constexpr int max_params_per_group = 0;
  int channels;
  float a, w;

  int state_size() const { return channels; }
  int input_size() const { return channels; }
  int param_count() const { return 0; }
  KOKKOS_FUNCTION int inputs_per_group() const { return 1; }
  KOKKOS_FUNCTION int params_per_group() const { return 0; }
  KOKKOS_FUNCTION int input_column(int g, int) const { return g; }
  KOKKOS_FUNCTION int param_index(int, int) const { return 0; }
  void check(const char*) const {}

  template <class Acc>
  KOKKOS_FUNCTION void step(int, const Acc* h, const Acc* u, Acc* f) const {
    f[0] = (Acc(1) - Acc(a)) * h[0] + Acc(a) * Kokkos::tanh(Acc(w) * h[0] + u[0]);
  }
  template <class Acc>
  KOKKOS_FUNCTION void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    const Acc c = Kokkos::tanh(Acc(w) * h[0] + u[0]);
    step(g, h, u, f);
    J[0] = (Acc(1) - Acc(a)) + Acc(a) * Acc(w) * (Acc(1) - c * c);
  }
};

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using space = Kokkos::DefaultExecutionSpace;
  using View3 = Kokkos::View<float***, Kokkos::LayoutRight, space::memory_space>;
  const int B = 4, T = 4096, N = 64;
  View3 u("u", B, T, N), h("h", B, T, N), h_loop("h_loop", B, T, N);
  Kokkos::Random_XorShift64_Pool<space> pool(1);
  Kokkos::fill_random(u, pool, -1.0f, 1.0f);
  const LeakyTanh cell{N, 0.5f, 0.9f};

  paraseq::NewtonConfig newton;
  newton.mode = paraseq::NewtonMode::newton;
  newton.max_iters = 8;
  paraseq::newton_solve(space{}, cell, u, h, newton);
  paraseq::NewtonConfig loop;
  loop.mode = paraseq::NewtonMode::sequential;
  paraseq::newton_solve(space{}, cell, u, h_loop, loop);

  const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h_loop);
  double largest = 0;
  for (int i = 0; i < B; ++i)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < N; ++c) largest = std::fmax(largest, std::fabs(double(a(i, t, c)) - double(b(i, t, c))));
  std::printf("custom cell: max |newton - loop| = %.3g over (%d, %d, %d)\n", largest, B, T, N);
  return largest < 1e-4 ? 0 : 1;
}
