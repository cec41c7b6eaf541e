// A ParaGRU over a sequence whose time axis is split across MPI ranks: each rank holds its slice of
// the inputs, paraseq::mpi::newton_solve solves the recurrence h_t = f(h_{t-1}, u_t) on all slices at
// once (Newton's method, one distributed scan per iteration), and paraseq::mpi::newton_backward
// gives the gradient of L = sum of h, dL/du on each rank's slice and dL/dtheta on every rank.
// The check: each rank runs the plain loop over the steps up to the end of its slice and compares
// its slice; rank 0 compares dL/dtheta with the one-process newton_backward of the whole sequence.
// Run it with e.g. `mpirun -np 2 ./paraseq_mpi_newton_gru`; CI runs it on 2 ranks.

#include <paraseq/paraseq.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

using Space = Kokkos::DefaultExecutionSpace;
using View1 = Kokkos::View<double*, Kokkos::LayoutRight, Space::memory_space>;
using View2 = Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space>;
using View3 = Kokkos::View<double***, Kokkos::LayoutRight, Space::memory_space>;

constexpr int B = 4, H = 32;
constexpr long total = 1 << 12;

// Steps [first, first + count) of the pre-projected inputs, the same formula on every rank.
View3 inputs(long first, long count) {
  View3 u("u", B, count, 3 * H);
  auto host = Kokkos::create_mirror_view(u);
  for (int b = 0; b < B; ++b)
    for (long t = 0; t < count; ++t)
      for (int k = 0; k < 3 * H; ++k) host(b, t, k) = std::sin(0.01 * double(first + t) * (k + 1) + b);
  Kokkos::deep_copy(u, host);
  return u;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1, failed = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    View2 a("a", 3, H), h0("h0", B, H);
    auto a_host = Kokkos::create_mirror_view(a);
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < H; ++i) a_host(k, i) = std::cos(1.0 + k * H + i);
    Kokkos::deep_copy(a, a_host);
    Kokkos::deep_copy(h0, 0.5);
    const paraseq::ParaGRU<double> cell{a};

    const long first = total * rank / ranks, count = total * (rank + 1) / ranks - first;
    const View3 u = inputs(first, count), h("h", B, count, H);
    paraseq::NewtonConfig config;
    config.max_iters = 30;
    config.residual_atol = 1e-12; // every rank stops after the same iteration: the largest |F| of all slices
    paraseq::NewtonStats<Space::memory_space> stats;
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h, config, h0, &stats);

    // The plain loop from t = 0 to the end of this rank's slice.
    paraseq::NewtonConfig loop;
    loop.mode = paraseq::NewtonMode::sequential;
    const View3 u_prefix = inputs(0, first + count), h_prefix("h_prefix", B, first + count, H);
    paraseq::newton_solve(Space{}, cell, u_prefix, h_prefix, loop, h0);
    const auto mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
    const auto looped = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h_prefix);
    double solve_error = 0;
    for (int b = 0; b < B; ++b)
      for (long t = 0; t < count; ++t)
        for (int i = 0; i < H; ++i) solve_error = std::max(solve_error, std::fabs(mine(b, t, i) - looped(b, first + t, i)));

    View3 g("g", B, count, H), du("du", B, count, 3 * H);
    View1 dparams("dparams", cell.param_count());
    View2 dh0("dh0", B, H);
    Kokkos::deep_copy(g, 1.0);
    paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, cell, u, h, g, du, dparams, h0, dh0, config);

    double largest_solve_error = 0;
    MPI_Reduce(&solve_error, &largest_solve_error, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      View3 g_all("g_all", B, total, H), du_all("du_all", B, total, 3 * H);
      View1 dparams_all("dparams_all", cell.param_count());
      Kokkos::deep_copy(g_all, 1.0);
      const View3 u_all = inputs(0, total), h_all("h_all", B, total, H);
      paraseq::newton_solve(Space{}, cell, u_all, h_all, loop, h0);
      paraseq::newton_backward(Space{}, cell, u_all, h_all, g_all, du_all, dparams_all, h0);
      const auto d_mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, dparams);
      const auto d_all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, dparams_all);
      double gradient_error = 0, gradient_scale = 0;
      for (int p = 0; p < cell.param_count(); ++p) {
        gradient_error = std::max(gradient_error, std::fabs(d_mine(p) - d_all(p)));
        gradient_scale = std::max(gradient_scale, std::fabs(d_all(p)));
      }
      gradient_error /= gradient_scale;
      failed = !(largest_solve_error < 1e-10) || !(gradient_error < 1e-10);
      std::printf("ParaGRU, B = %d, H = %d, T = %ld on %d rank(s) of %s: %d Newton iterations, largest difference "
                  "from the plain loop %.2e, dL/dtheta against one process %.2e (relative) (%s)\n",
                  B, H, total, ranks, Space::name(), stats.iterations, largest_solve_error, gradient_error,
                  failed ? "FAILED" : "ok");
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return failed;
}
