#pragma once
// Derivative checks that the cell tests share: a cell's Jacobian and vjp against central
// differences of its step, and a solve's gradients against central differences of a float64 loss.

#include <paraseq/core/structure.hpp>
#include <paraseq/solvers/cell.hpp>

#include "test_support.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>

namespace paraseq::test {

// For every group of `cell` at (h, u): [2 g] = max |J - J_fd| (central differences of step; with a
// cell's linearize_diagonal also its distance to linearize's f and J's diagonal) and
// [2 g + 1] = max |vjp's dh - J^T mu|, both relative to the largest entry of J; on the host.
// (The return type is spelled out: nvcc refuses an extended lambda in a function whose return type
// is deduced.)
template <class Space, class Cell>
Kokkos::View<double*, Kokkos::HostSpace> cell_derivative_errors(const Cell& cell, const View1<double, Space>& h,
                                                                const View1<double, Space>& u,
                                                                const View1<double, Space>& mu) {
  using structure = typename Cell::structure;
  constexpr int D = structure::max_group_size;
  const int N = cell.state_size(), d = paraseq::detail::cell_group_size(cell), groups = N / d;
  View1<double, Space> errors("errors", 2 * groups);
  Kokkos::parallel_for(
      "test::cell_derivatives", Kokkos::RangePolicy<Space>(0, groups), KOKKOS_LAMBDA(int g) {
        double hg[D], ug[Cell::max_inputs_per_group], mug[D], f[D], J[D * D], up[D], down[D], dh[D],
            du[Cell::max_inputs_per_group], dp[Cell::max_params_per_group];
        for (int i = 0; i < d; ++i) {
          hg[i] = h(g * d + i);
          mug[i] = mu(g * d + i);
        }
        for (int k = 0; k < cell.inputs_per_group(); ++k) ug[k] = u(cell.input_column(g, k));
        cell.linearize(g, hg, ug, f, J);
        double jacobian_error = 0, vjp_error = 0, scale = 1e-300;
        for (int j = 0; j < d; ++j) {
          const double saved = hg[j], step = 1e-6;
          hg[j] = saved + step;
          cell.step(g, hg, ug, up);
          hg[j] = saved - step;
          cell.step(g, hg, ug, down);
          hg[j] = saved;
          for (int i = 0; i < d; ++i) {
            jacobian_error = Kokkos::fmax(jacobian_error, Kokkos::fabs(J[i * d + j] - (up[i] - down[i]) / (2 * step)));
            scale = Kokkos::fmax(scale, Kokkos::fabs(J[i * d + j]));
          }
        }
        if constexpr (paraseq::detail::has_cell_linearize_diagonal<Cell, double>) {
          // The quasi Jacobian's own path: linearize's f and the diagonal of its J.
          double f_diag[D], J_diag[D];
          cell.linearize_diagonal(g, hg, ug, f_diag, J_diag);
          for (int i = 0; i < d; ++i)
            jacobian_error = Kokkos::fmax(jacobian_error, Kokkos::fmax(Kokkos::fabs(f_diag[i] - f[i]),
                                                                       Kokkos::fabs(J_diag[i] - J[i * d + i])));
        }
        cell.vjp(g, hg, ug, mug, dh, du, dp);
        for (int j = 0; j < d; ++j) {
          double transposed = 0;
          for (int i = 0; i < d; ++i) transposed += J[i * d + j] * mug[i];
          vjp_error = Kokkos::fmax(vjp_error, Kokkos::fabs(dh[j] - transposed));
        }
        errors(2 * g) = jacobian_error / scale;
        errors(2 * g + 1) = vjp_error / scale;
      });
  return to_host(errors);
}

// Compares `analytic` (a gradient laid out as the `count` doubles at `values`) with central
// differences of loss() in each of those values, which are perturbed in place and restored:
// max |error| relative to the largest difference quotient <= 1e-6.
template <class Analytic, class Loss>
void expect_gradient_matches_central_differences(const Analytic& analytic, double* values, std::size_t count,
                                                 const Loss& loss, const char* name) {
  auto host = to_host(analytic);
  double error = 0, scale = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const double saved = values[i];
    values[i] = saved + 1e-6;
    const double up = loss();
    values[i] = saved - 1e-6;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / 2e-6;
    error = std::fmax(error, std::fabs(host.data()[i] - numeric));
    scale = std::fmax(scale, std::fabs(numeric));
  }
  EXPECT_LE(error / scale, 1e-6) << name;
}

} // namespace paraseq::test
