// paraseq::mpi::newton_solve and newton_backward for a cell of one's own with a dense Jacobian (the
// Elman cell of elman_cell.hpp, DenseUpTo<4>): a unit of its own, because it compiles the
// one-process newton mode's dense scans. Against the float64 loop and the one-process functions.
#include <paraseq/solvers/mpi_newton.hpp>

#include "elman_cell.hpp"
#include "mpi_test_support.hpp"
#include "test_support.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using memory = Space::memory_space;
using namespace paraseq::test;
using Elman = ElmanCell<double, memory, 4>;
using Modes = std::integral_constant<paraseq::CompiledNewtonModes, paraseq::CompiledNewtonModes::newton>;

TEST(MpiNewtonDense, ElmanMatchesLoopAndOneProcess) {
  const Place place = world();
  constexpr int batch = 2, n = 3;
  for (Cut cut : all_cuts) {
    const Slice slice = slice_of(cut, place);
    const std::string what = std::string(cut_name(cut)) + ", rank " + std::to_string(place.rank);
    const auto W = contractive_matrix<Space>(n, 3);
    const Elman cell{W};
    View3<double, Space> u_full("u", batch, slice.total, n), g_full("g", batch, slice.total, n);
    View2<double, Space> h0("h0", batch, n);
    fill_uniform(u_full, -1.0, 1.0, 4);
    fill_uniform(g_full, -1.0, 1.0, 5);
    fill_uniform(h0, -0.5, 0.5, 6);
    const auto u = time_slice(u_full, slice.first, slice.steps, View3<double, Space>("u", batch, slice.steps, n));
    const auto g = time_slice(g_full, slice.first, slice.steps, View3<double, Space>("g", batch, slice.steps, n));

    // Two iterations: the one-process newton mode's iterate.
    paraseq::NewtonConfig config;
    config.max_iters = 2;
    config.mode = paraseq::NewtonMode::newton;
    View3<double, Space> h("h", batch, slice.steps, n), full("full", batch, slice.total, n);
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h, config, h0);
    paraseq::newton_solve<Modes::value>(Space{}, cell, u_full, full, config, h0);
    EXPECT_LE(max_relative_error(h, host_time_slice(as_double3(full), slice)), 1e-12) << what << ", 2 iterations";

    // Converged: the float64 loop; then the gradients against one process at that solution.
    config.max_iters = 40;
    config.residual_atol = 1e-13;
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h, config, h0);
    const Host3 looped = elman_sequential(to_host(W), to_host(u_full), to_host(h0));
    EXPECT_LE(max_relative_error(h, host_time_slice(looped, slice)), 1e-12) << what << ", converged";
    paraseq::newton_solve<Modes::value>(Space{}, cell, u_full, full, config, h0);
    const auto h_solution = time_slice(full, slice.first, slice.steps, View3<double, Space>("h", batch, slice.steps, n));
    View3<double, Space> du("du", batch, slice.steps, n), du_full("du_full", batch, slice.total, n);
    View1<double, Space> dW("dW", n * n), dW_full("dW_full", n * n);
    View2<double, Space> dh0("dh0", batch, n), dh0_full("dh0_full", batch, n);
    paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, cell, u, h_solution, g, du, dW, h0, dh0, config);
    paraseq::newton_backward<Modes::value>(Space{}, cell, u_full, full, g_full, du_full, dW_full, h0, dh0_full, config);
    EXPECT_LE(max_relative_error(du, host_time_slice(as_double3(du_full), slice)), 1e-12) << what << ", du";
    EXPECT_LE(max_relative_error(dW, to_host(dW_full)), 1e-12) << what << ", dW";
    if (place.rank == 0) EXPECT_LE(max_relative_error(dh0, as_double2(dh0_full)), 1e-12) << what << ", dh0";
  }
}

} // namespace
