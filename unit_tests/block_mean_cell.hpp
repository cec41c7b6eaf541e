#pragma once
// The block cell of the cell tests (test_cells.cpp, test_cells_block.cpp): a user cell with 3 x 3
// Jacobian blocks and a state size given at run time.

#include <paraseq/core/structure.hpp>

#include <Kokkos_Core.hpp>

namespace paraseq::test {

// Blocks of three channels coupled through their mean: f_i = tanh(s * sum over the block of h_j + u_i).
// A run-time state size that must be a multiple of 3; no parameters.
template <class MemorySpace>
struct BlockMeanCell {
  using structure = BlockDiagonal<3>;
  static constexpr int max_inputs_per_group = 3;
  static constexpr int max_params_per_group = 1;
  int n;
  double s;

  int state_size() const { return n; }
  int input_size() const { return n; }
  int param_count() const { return 0; }
  KOKKOS_FUNCTION int inputs_per_group() const { return 3; }
  KOKKOS_FUNCTION int params_per_group() const { return 0; }
  KOKKOS_FUNCTION int input_column(int g, int k) const { return 3 * g + k; }
  KOKKOS_FUNCTION int param_index(int, int) const { return 0; }
  void check(const char*) const {}

  template <class Acc>
  KOKKOS_FUNCTION void step(int, const Acc* h, const Acc* u, Acc* f) const {
    for (int i = 0; i < 3; ++i) f[i] = Kokkos::tanh(Acc(s) * (h[0] + h[1] + h[2]) + u[i]);
  }
  template <class Acc>
  KOKKOS_FUNCTION void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    step(g, h, u, f);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) J[i * 3 + j] = Acc(s) * (Acc(1) - f[i] * f[i]);
  }
  template <class Acc>
  KOKKOS_FUNCTION void vjp(int g, const Acc* h, const Acc* u, const Acc* mu, Acc* dh, Acc* du, Acc*) const {
    Acc f[3];
    step(g, h, u, f);
    Acc total = 0;
    for (int i = 0; i < 3; ++i) {
      du[i] = mu[i] * (Acc(1) - f[i] * f[i]);
      total += du[i];
    }
    for (int j = 0; j < 3; ++j) dh[j] = Acc(s) * total;
  }
};

} // namespace paraseq::test
