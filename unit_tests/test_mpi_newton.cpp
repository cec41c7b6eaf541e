// paraseq::mpi::newton_solve and newton_backward over the ranks of MPI_COMM_WORLD (ctest runs this
// with 2 and with 4 ranks). Every rank builds the same full problem from fixed seeds, cuts its own
// slice of the time axis, and compares its slice of the distributed result with the one-process
// paraseq::newton_solve / newton_backward of the full sequence (their newton mode: the same Newton
// iterates, so also before convergence) and with the one-process sequential loop.
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/mpi_newton.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "mpi_test_support.hpp"
#include "test_support.hpp"

#include <Kokkos_Core.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using memory = Space::memory_space;
using paraseq::InitialGuess;
using paraseq::NewtonConfig;
using paraseq::NewtonJacobian;
using paraseq::NewtonMode;
using paraseq::test::all_cuts;
using paraseq::test::as_double2;
using paraseq::test::as_double3;
using paraseq::test::Cut;
using paraseq::test::cut_name;
using paraseq::test::fill_uniform;
using paraseq::test::host_time_slice;
using paraseq::test::invalid_argument_of;
using paraseq::test::max_relative_error;
using paraseq::test::Place;
using paraseq::test::Slice;
using paraseq::test::slice_of;
using paraseq::test::time_slice;
using paraseq::test::world;
using ::testing::HasSubstr;
using View1 = paraseq::test::View1<double, Space>;
using View2 = paraseq::test::View2<double, Space>;
using View3 = paraseq::test::View3<double, Space>;
using GRU = paraseq::ParaGRU<double, memory>;
using LSTM = paraseq::ParaLSTM<double, memory>;

constexpr int batch = 2;

// A built-in cell with hidden size H and parameters from a fixed seed.
template <class Cell>
Cell make_cell(int hidden, unsigned seed) {
  View2 a("a", 3, hidden);
  fill_uniform(a, -1.5, 1.5, seed);
  if constexpr (std::is_same_v<Cell, GRU>) {
    return GRU{a};
  } else {
    View2 p("p", 2, hidden);
    fill_uniform(p, -1.5, 1.5, seed + 1);
    return LSTM{a, p};
  }
}

template <class Cell>
const char* cell_name() {
  return std::is_same_v<Cell, GRU> ? "ParaGRU" : "ParaLSTM";
}

// The full problem, the same on every rank, and this rank's slice of it.
template <class Cell>
struct Problem {
  static constexpr int hidden = 3;
  Slice slice;
  Cell cell = make_cell<Cell>(hidden, 7);
  int n = cell.state_size(), inputs = cell.input_size();
  View3 u_full, u, g_full, g;
  View2 h0{"h0", batch, n};

  Problem(Cut cut, const Place& place, unsigned seed) : slice(slice_of(cut, place)) {
    u_full = View3("u", batch, slice.total, inputs);
    g_full = View3("g", batch, slice.total, n);
    fill_uniform(u_full, -1.5, 1.5, seed);
    fill_uniform(g_full, -1.0, 1.0, seed + 1);
    fill_uniform(h0, -0.8, 0.8, seed + 2);
    u = time_slice(u_full, slice.first, slice.steps, View3("u_slice", batch, slice.steps, inputs));
    g = time_slice(g_full, slice.first, slice.steps, View3("g_slice", batch, slice.steps, n));
  }
  View3 states() const { return View3("h", batch, slice.steps, n); }
  View3 full_states() const { return View3("h_full", batch, slice.total, n); }
};

NewtonConfig newton_mode(NewtonConfig config) {
  config.mode = NewtonMode::newton;
  return config;
}

std::string where(const char* cell, Cut cut, const std::string& what) {
  const Place place = world();
  return std::string(cell) + ", " + cut_name(cut) + ", " + what + ", rank " + std::to_string(place.rank) + " of " +
         std::to_string(place.size);
}

// The distributed solve against the one-process newton mode with the same config (h0 given or not).
template <class Cell>
void check_forward(Cut cut, const NewtonConfig& config, bool with_h0, const std::string& what) {
  const Place place = world();
  Problem<Cell> problem(cut, place, 11);
  auto h = problem.states(), full = problem.full_states();
  if (config.initial_guess == InitialGuess::given) {
    fill_uniform(full, -0.5, 0.5, 3);
    h = time_slice(full, problem.slice.first, problem.slice.steps, h);
  }
  if (with_h0) {
    // Only rank 0 reads h0: the others pass an empty View.
    const View2 h0 = place.rank == 0 ? problem.h0 : View2();
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, h0);
    paraseq::newton_solve(Space{}, problem.cell, problem.u_full, full, newton_mode(config), problem.h0);
  } else {
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config);
    paraseq::newton_solve(Space{}, problem.cell, problem.u_full, full, newton_mode(config));
  }
  EXPECT_EQ(int(h.extent(1)), problem.slice.steps);
  EXPECT_LE(max_relative_error(h, host_time_slice(as_double3(full), problem.slice)), 1e-12)
      << where(cell_name<Cell>(), cut, what + (with_h0 ? ", h0 given" : ", no h0"));
}

NewtonConfig iterations(int k) {
  NewtonConfig config;
  config.max_iters = k;
  return config;
}

// Two iterations are far from the solution: equal iterates mean the same Newton steps.
TEST(MpiNewton, IteratesMatchOneProcess) {
  for (Cut cut : all_cuts)
    for (bool with_h0 : {false, true}) {
      check_forward<GRU>(cut, iterations(2), with_h0, "2 iterations");
      check_forward<LSTM>(cut, iterations(2), with_h0, "2 iterations");
    }
}

TEST(MpiNewton, ConfigurationsMatchOneProcess) {
  NewtonConfig zeros = iterations(3), given = iterations(2), damped = iterations(3), picard = iterations(2), quasi = iterations(4);
  zeros.initial_guess = InitialGuess::zeros;
  given.initial_guess = InitialGuess::given;
  damped.omega = 0.7;
  picard.picard_iters = 2;
  quasi.jacobian = NewtonJacobian::quasi;
  for (Cut cut : all_cuts) {
    check_forward<GRU>(cut, zeros, true, "zero guess");
    check_forward<LSTM>(cut, given, true, "given guess");
    check_forward<GRU>(cut, damped, true, "omega 0.7");
    check_forward<LSTM>(cut, picard, true, "2 Picard sweeps");
    check_forward<LSTM>(cut, quasi, true, "quasi Jacobian");
  }
}

// Converged under residual_atol: the one-process loop's result, after as many iterations as one
// process runs (the stop is decided on the global residual).
template <class Cell>
void check_converged(Cut cut) {
  const Place place = world();
  Problem<Cell> problem(cut, place, 17);
  NewtonConfig config;
  config.max_iters = 40;
  config.residual_atol = 1e-11;
  auto h = problem.states(), looped = problem.full_states(), full = problem.full_states();
  paraseq::NewtonStats<memory> stats, one_process;
  paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0, &stats);
  paraseq::newton_solve(Space{}, problem.cell, problem.u_full, full, newton_mode(config), problem.h0, &one_process);
  NewtonConfig loop;
  loop.mode = NewtonMode::sequential;
  paraseq::newton_solve(Space{}, problem.cell, problem.u_full, looped, loop, problem.h0);
  const std::string what = where(cell_name<Cell>(), cut, "converged");
  EXPECT_LE(max_relative_error(h, host_time_slice(as_double3(looped), problem.slice)), 1e-12) << what;
  EXPECT_EQ(stats.iterations, one_process.iterations) << what;
  EXPECT_GT(stats.iterations, 1) << what;
  EXPECT_EQ(stats.mode, NewtonMode::newton) << what;
  const auto residual = paraseq::test::to_host(stats.residual);
  const auto converged = paraseq::test::to_host(stats.converged);
  for (int b = 0; b < batch; ++b) {
    EXPECT_LE(residual(b), 1e-11) << what;
    EXPECT_EQ(converged(b), 1) << what;
  }
}

TEST(MpiNewton, ConvergedMatchesSequentialLoop) {
  for (Cut cut : all_cuts) {
    check_converged<GRU>(cut);
    check_converged<LSTM>(cut);
  }
}

// One iteration leaves max |F| of order 0.1: the global residual of each batch element, on every
// rank, is the one-process one, and residual_fail throws on every rank.
TEST(MpiNewton, StatsAndDivergenceAreGlobal) {
  const Place place = world();
  for (Cut cut : all_cuts) {
    Problem<LSTM> problem(cut, place, 19);
    NewtonConfig config = iterations(1);
    auto h = problem.states(), full = problem.full_states();
    paraseq::NewtonStats<memory> stats, one_process;
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0, &stats);
    paraseq::newton_solve(Space{}, problem.cell, problem.u_full, full, newton_mode(config), problem.h0, &one_process);
    const auto residual = paraseq::test::to_host(stats.residual), expected = paraseq::test::to_host(one_process.residual);
    for (int b = 0; b < batch; ++b) {
      EXPECT_GT(expected(b), 1e-3) << "batch " << b;
      EXPECT_NEAR(residual(b), expected(b), 1e-12 * expected(b)) << where("ParaLSTM", cut, "1 iteration");
    }

    config.residual_fail = 1e-9;
    bool thrown = false;
    try {
      paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0);
    } catch (const paraseq::NewtonDivergenceError& error) {
      thrown = true;
      EXPECT_EQ(error.iteration(), 1);
      EXPECT_NEAR(error.residual(), std::max(expected(0), expected(1)), 1e-12);
    }
    EXPECT_TRUE(thrown) << where("ParaLSTM", cut, "residual_fail");
  }
}

// Gradients against the one-process newton_backward at the one-process solution.
template <class Cell>
void check_backward(Cut cut) {
  const Place place = world();
  Problem<Cell> problem(cut, place, 29);
  NewtonConfig config;
  config.max_iters = 40;
  config.residual_atol = 1e-13;
  auto full = problem.full_states();
  paraseq::newton_solve(Space{}, problem.cell, problem.u_full, full, newton_mode(config), problem.h0);
  const auto h = time_slice(full, problem.slice.first, problem.slice.steps, problem.states());

  View3 du("du", batch, problem.slice.steps, problem.inputs), du_full("du_full", batch, problem.slice.total, problem.inputs);
  View1 dparams("dparams", problem.cell.param_count()), dparams_full("dparams_full", problem.cell.param_count());
  // Only rank 0 reads h0 and writes dh0: the others pass empty Views.
  View2 dh0 = place.rank == 0 ? View2("dh0", batch, problem.n) : View2(), dh0_full("dh0_full", batch, problem.n);
  paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, problem.g, du, dparams,
                                place.rank == 0 ? problem.h0 : View2(), dh0, config);
  paraseq::newton_backward(Space{}, problem.cell, problem.u_full, full, problem.g_full, du_full, dparams_full, problem.h0,
                           dh0_full, newton_mode(config));
  const std::string what = where(cell_name<Cell>(), cut, "backward");
  EXPECT_LE(max_relative_error(du, host_time_slice(as_double3(du_full), problem.slice)), 1e-12) << what << ": du";
  EXPECT_LE(max_relative_error(dparams, paraseq::test::to_host(dparams_full)), 1e-12) << what << ": dparams";
  if (place.rank == 0) EXPECT_LE(max_relative_error(dh0, as_double2(dh0_full)), 1e-12) << what << ": dh0";

  // Every rank holds the same parameter gradient, bit for bit.
  const auto mine = paraseq::test::to_host(dparams);
  std::vector<double> rank0(mine.data(), mine.data() + mine.extent(0));
  MPI_Bcast(rank0.data(), int(rank0.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(rank0.data(), mine.data(), rank0.size() * sizeof(double)), 0) << what << ": dparams on rank 0";
}

TEST(MpiNewton, GradientsMatchOneProcess) {
  for (Cut cut : all_cuts) {
    check_backward<GRU>(cut);
    check_backward<LSTM>(cut);
  }
}

// float Views: the solve and the gradients in float, against one process in float.
TEST(MpiNewton, FloatMatchesOneProcess) {
  using FloatGRU = paraseq::ParaGRU<float, memory>;
  using F2 = paraseq::test::View2<float, Space>;
  using F3 = paraseq::test::View3<float, Space>;
  using F1 = paraseq::test::View1<float, Space>;
  const Place place = world();
  const Slice slice = slice_of(Cut::empty_between, place);
  constexpr int hidden = 4;
  F2 a("a", 3, hidden), h0("h0", batch, hidden);
  fill_uniform(a, -1.5, 1.5, 3);
  fill_uniform(h0, -0.8, 0.8, 4);
  const FloatGRU cell{a};
  F3 u_full("u", batch, slice.total, 3 * hidden), g_full("g", batch, slice.total, hidden);
  fill_uniform(u_full, -1.5, 1.5, 5);
  fill_uniform(g_full, -1.0, 1.0, 6);
  const F3 u = time_slice(u_full, slice.first, slice.steps, F3("u", batch, slice.steps, 3 * hidden));
  const F3 g = time_slice(g_full, slice.first, slice.steps, F3("g", batch, slice.steps, hidden));
  F3 h("h", batch, slice.steps, hidden), full("full", batch, slice.total, hidden);
  const NewtonConfig config = iterations(6);
  paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h, config, h0);
  paraseq::newton_solve(Space{}, cell, u_full, full, newton_mode(config), h0);
  EXPECT_LE(max_relative_error(h, host_time_slice(as_double3(full), slice)), 1e-5) << "forward, rank " << place.rank;

  F3 du("du", batch, slice.steps, 3 * hidden), du_full("du_full", batch, slice.total, 3 * hidden);
  F1 dparams("dparams", cell.param_count()), dparams_full("dparams_full", cell.param_count());
  paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, cell, u, h, g, du, dparams, h0);
  paraseq::newton_backward(Space{}, cell, u_full, full, g_full, du_full, dparams_full, h0, paraseq::NoGradient{},
                           newton_mode(config));
  EXPECT_LE(max_relative_error(du, host_time_slice(as_double3(du_full), slice)), 1e-5) << "du, rank " << place.rank;
  EXPECT_LE(max_relative_error(dparams, paraseq::test::to_host(dparams_full)), 1e-5) << "dparams, rank " << place.rank;
}

TEST(MpiNewton, BitwiseRepeatable) {
  const Place place = world();
  Problem<LSTM> problem(Cut::uneven, place, 41);
  auto first = problem.states(), second = problem.states();
  const NewtonConfig config = iterations(3);
  paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, first, config, problem.h0);
  paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, second, config, problem.h0);
  EXPECT_TRUE(paraseq::test::bitwise_equal(first, second)) << "forward, rank " << place.rank;
  View3 du1("du", batch, problem.slice.steps, problem.inputs), du2("du", batch, problem.slice.steps, problem.inputs);
  View1 dp1("dp", problem.cell.param_count()), dp2("dp", problem.cell.param_count());
  paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, first, problem.g, du1, dp1, problem.h0);
  paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, first, problem.g, du2, dp2, problem.h0);
  EXPECT_TRUE(paraseq::test::bitwise_equal(du1, du2)) << "du, rank " << place.rank;
  EXPECT_TRUE(paraseq::test::bitwise_equal(dp1, dp2)) << "dparams, rank " << place.rank;
}

// ---- errors: every rank raises, and the ranks stay in step for the next call ---------------------

// A valid call after an error: it would hang or fail if a rank had been left inside a collective.
void expect_ranks_in_step() { check_forward<GRU>(Cut::uneven, iterations(2), true, "after an error"); }

TEST(MpiNewtonErrors, RanksDisagreeOnStateSize) {
  const Place place = world();
  const GRU cell = make_cell<GRU>(2 + place.rank, 3);
  View3 u("u", batch, 3, cell.input_size()), h("h", batch, 3, cell.state_size());
  const std::string message = invalid_argument_of([&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h); });
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::newton_solve: argument 'cell' has state size N 2 on rank 0, 3 on rank 1"));
  EXPECT_THAT(message, HasSubstr("expected the same on every rank of 'comm' (only the number of steps T may differ)"));
  expect_ranks_in_step();
}

TEST(MpiNewtonErrors, RanksDisagreeOnCell) {
  const Place place = world();
  std::string message;
  if (place.rank == 0) {
    const GRU cell = make_cell<GRU>(4, 3);
    View3 u("u", batch, 3, cell.input_size()), h("h", batch, 3, cell.state_size());
    message = invalid_argument_of([&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h); });
  } else {
    const LSTM cell = make_cell<LSTM>(2, 3);
    View3 u("u", batch, 3, cell.input_size()), h("h", batch, 3, cell.state_size());
    message = invalid_argument_of([&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, cell, u, h); });
  }
  EXPECT_THAT(message, HasSubstr("argument 'cell' has the Jacobian structure Diagonal on rank 0, BlockDiagonal<2> on rank 1"));
  expect_ranks_in_step();
}

TEST(MpiNewtonErrors, RanksDisagreeOnConfig) {
  const Place place = world();
  Problem<GRU> problem(Cut::uneven, place, 5);
  auto h = problem.states();
  NewtonConfig config;
  config.max_iters = 3 + place.rank;
  std::string message = invalid_argument_of(
      [&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0); });
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::newton_solve: argument 'config.max_iters' has value 3 on rank 0, 4 on rank 1"));
  config = NewtonConfig{};
  if (place.rank == 1) config.residual_atol = 1e-8;
  message = invalid_argument_of(
      [&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0); });
  EXPECT_THAT(message, HasSubstr("argument 'config.residual_atol' has a value on rank(s) 1 and none on rank(s) 0"));
  config.residual_atol = place.rank == 1 ? 1e-8 : 1e-9;
  message = invalid_argument_of(
      [&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0); });
  EXPECT_THAT(message, HasSubstr("argument 'config.residual_atol' has value 1.0000000000000001e-09 on rank 0, 1e-08 on rank 1"));
  expect_ranks_in_step();
}

TEST(MpiNewtonErrors, RanksDisagreeOnWhetherH0AndStatsAreGiven) {
  const Place place = world();
  Problem<GRU> problem(Cut::uneven, place, 5);
  auto h = problem.states();
  std::string message = invalid_argument_of([&] {
    if (place.rank == 0) paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, {}, problem.h0);
    else paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h);
  });
  EXPECT_THAT(message, HasSubstr("argument 'h0' has a View on rank(s) 0 and none on rank(s) 1"));
  paraseq::NewtonStats<memory> stats;
  message = invalid_argument_of([&] {
    paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, {}, problem.h0,
                               place.rank == 0 ? &stats : nullptr);
  });
  EXPECT_THAT(message, HasSubstr("argument 'stats' has a NewtonStats on rank(s) 0 and none on rank(s) 1"));
  expect_ranks_in_step();
}

TEST(MpiNewtonErrors, RanksCallDifferentFunctions) {
  const Place place = world();
  Problem<GRU> problem(Cut::uneven, place, 5);
  auto h = problem.states();
  View3 du("du", batch, problem.slice.steps, problem.inputs);
  View1 dparams("dparams", problem.cell.param_count());
  const std::string message = invalid_argument_of([&] {
    if (place.rank == 0) paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h);
    else paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, problem.g, du, dparams);
  });
  EXPECT_THAT(message, HasSubstr("call different functions: paraseq::mpi::newton_solve on rank 0, "
                                 "paraseq::mpi::newton_backward on rank 1"));
  expect_ranks_in_step();
}

// The last rank's du has the wrong number of steps: it raises its own error, the others name it.
TEST(MpiNewtonErrors, OneRanksBadShapeReachesEveryRank) {
  const Place place = world();
  const int bad_rank = place.size - 1;
  Problem<GRU> problem(Cut::uneven, place, 5);
  auto h = problem.states();
  View3 du("du", batch, problem.slice.steps + (place.rank == bad_rank ? 1 : 0), problem.inputs);
  View1 dparams("dparams", problem.cell.param_count());
  const std::string message = invalid_argument_of([&] {
    paraseq::mpi::newton_backward(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, problem.g, du, dparams);
  });
  if (place.rank == bad_rank)
    EXPECT_THAT(message, HasSubstr("paraseq::mpi::newton_backward: argument 'du' has shape [2, " +
                                   std::to_string(problem.slice.steps + 1) + ", 9]"));
  else
    EXPECT_THAT(message, HasSubstr("the arguments of rank(s) " + std::to_string(bad_rank) +
                                   " of 'comm' were refused there (their error names the argument)"));
  expect_ranks_in_step();
}

// Settings every rank refuses alike: a mode other than newton, the one-process checks.
TEST(MpiNewtonErrors, BadConfigIsRefusedOnEveryRank) {
  const Place place = world();
  Problem<GRU> problem(Cut::uneven, place, 5);
  auto h = problem.states();
  NewtonConfig config;
  config.mode = NewtonMode::fused;
  std::string message = invalid_argument_of(
      [&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0); });
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::newton_solve: argument 'config.mode' has the value NewtonMode::fused, "
                                 "expected NewtonMode::automatic or NewtonMode::newton"));
  config = NewtonConfig{};
  config.omega = 2;
  message = invalid_argument_of(
      [&] { paraseq::mpi::newton_solve(Space{}, MPI_COMM_WORLD, problem.cell, problem.u, h, config, problem.h0); });
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::newton_solve: argument 'config.omega' has value 2"));
  expect_ranks_in_step();
}

} // namespace

int main(int argc, char** argv) { return paraseq::test::run_mpi_tests(argc, argv); }
