// paraseq::mpi::linear_scan and linear_scan_reverse over the ranks of MPI_COMM_WORLD (ctest runs this
// with 2 and with 4 ranks). Every rank builds the same full sequence from fixed seeds, cuts its own
// slice of the time axis, and compares its slice of the distributed result with paraseq::linear_scan
// of the full sequence and with the float64 sequential loops of sequential_reference.hpp.
#include <paraseq/core/mpi_scan.hpp>
#include <paraseq/core/sequential_reference.hpp>

#include "mpi_test_support.hpp"
#include "test_support.hpp"

#include <Kokkos_Core.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using paraseq::test::all_cuts;
using paraseq::test::Cut;
using paraseq::test::cut_name;
using paraseq::test::Host3;
using paraseq::test::host_time_slice;
using paraseq::test::invalid_argument_of;
using paraseq::test::Place;
using paraseq::test::Slice;
using paraseq::test::slice_of;
using paraseq::test::time_slice;
using paraseq::test::world;
using ::testing::HasSubstr;

// A's View type of each structure, and the state size the tests use with it.
template <class Structure, class T>
struct Coefficients;
template <class T>
struct Coefficients<paraseq::Diagonal, T> {
  using View = paraseq::test::View3<T, Space>;
  static constexpr int n = 5;
  static View make(int B, int steps, int N) { return View("A", B, steps, N); }
};
template <class T>
struct Coefficients<paraseq::BlockDiagonal<2>, T> {
  using View = paraseq::test::View5<T, Space>;
  static constexpr int n = 4;
  static View make(int B, int steps, int N) { return View("A", B, steps, N / 2, 2, 2); }
};
template <class T>
struct Coefficients<paraseq::Dense, T> {
  using View = paraseq::test::View4<T, Space>;
  static constexpr int n = 3;
  static View make(int B, int steps, int N) { return View("A", B, steps, N, N); }
};

constexpr int batch = 2;

// The full problem, the same on every rank (fixed seeds), and this rank's slice of it.
template <class Structure, class T>
struct Problem {
  using Coeffs = Coefficients<Structure, T>;
  using A_view = typename Coeffs::View;
  using Values = paraseq::test::View3<T, Space>;
  static constexpr int n = Coeffs::n;

  Slice slice;
  A_view A_full, A;
  Values b_full, b;
  paraseq::test::View2<T, Space> h0{"h0", batch, n};

  Problem(Cut cut, const Place& place, unsigned seed) : slice(slice_of(cut, place)) {
    const int d = paraseq::group_size<Structure>(n);
    A_full = Coeffs::make(batch, slice.total, n);
    b_full = Values("b", batch, slice.total, n);
    // |A|'s rows sum to less than 0.9: the recurrence neither grows nor vanishes over the sequence.
    paraseq::test::fill_uniform(A_full, -0.9 / d, 0.9 / d, seed);
    paraseq::test::fill_uniform(b_full, -1.0, 1.0, seed + 1);
    paraseq::test::fill_uniform(h0, -1.0, 1.0, seed + 2);
    A = time_slice(A_full, slice.first, slice.steps, Coeffs::make(batch, slice.steps, n));
    b = time_slice(b_full, slice.first, slice.steps, Values("b_slice", batch, slice.steps, n));
  }
  Values output() const { return Values("out", batch, slice.steps, n); }
};

// The slice's distributed result against paraseq::linear_scan of the full sequence and the float64
// sequential loops.
template <class Structure, class T, class View>
void expect_slice_matches(const Problem<Structure, T>& problem, const View& distributed,
                          const typename Problem<Structure, T>::Values& one_process, const Host3& reference,
                          double tolerance, const std::string& what) {
  const Host3 one_process_slice = host_time_slice(paraseq::test::as_double3(one_process), problem.slice);
  const Host3 reference_slice = host_time_slice(reference, problem.slice);
  EXPECT_EQ(int(distributed.extent(1)), problem.slice.steps) << what;
  EXPECT_LE(paraseq::test::max_relative_error(paraseq::test::as_double3(distributed), one_process_slice), tolerance)
      << what << ": against paraseq::linear_scan of the full sequence";
  EXPECT_LE(paraseq::test::max_relative_error(paraseq::test::as_double3(distributed), reference_slice), tolerance)
      << what << ": against the float64 sequential reference";
}

template <class Structure>
void check_forward(Cut cut, bool with_h0) {
  const Place place = world();
  Problem<Structure, double> problem(cut, place, 11);
  auto h = problem.output();
  typename Problem<Structure, double>::Values full("full", batch, problem.slice.total, problem.n);
  Host3 reference;
  if (with_h0) {
    paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, Structure{}, problem.A, problem.b, h, problem.h0);
    paraseq::linear_scan(Space{}, Structure{}, problem.A_full, problem.b_full, full, problem.h0);
    reference = paraseq::reference::linear_recurrence(Structure{}, paraseq::test::to_host(problem.A_full),
                                                      paraseq::test::to_host(problem.b_full), paraseq::test::to_host(problem.h0));
  } else {
    paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, Structure{}, problem.A, problem.b, h);
    paraseq::linear_scan(Space{}, Structure{}, problem.A_full, problem.b_full, full);
    reference = paraseq::reference::linear_recurrence(Structure{}, paraseq::test::to_host(problem.A_full),
                                                      paraseq::test::to_host(problem.b_full));
  }
  expect_slice_matches(problem, h, full, reference, 1e-12,
                       std::string(Structure::name) + ", " + cut_name(cut) + (with_h0 ? ", h0 given" : ", no h0") +
                           ", rank " + std::to_string(place.rank) + " of " + std::to_string(place.size));
}

template <class Structure>
void check_reverse(Cut cut) {
  const Place place = world();
  Problem<Structure, double> problem(cut, place, 23);
  auto lambda = problem.output();
  typename Problem<Structure, double>::Values full("full", batch, problem.slice.total, problem.n);
  paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, Structure{}, problem.A, problem.b, lambda);
  paraseq::linear_scan_reverse(Space{}, Structure{}, problem.A_full, problem.b_full, full);
  const Host3 reference = paraseq::reference::adjoint_recurrence(Structure{}, paraseq::test::to_host(problem.A_full),
                                                                 paraseq::test::to_host(problem.b_full));
  expect_slice_matches(problem, lambda, full, reference, 1e-12,
                       std::string(Structure::name) + " reverse, " + cut_name(cut) + ", rank " +
                           std::to_string(place.rank) + " of " + std::to_string(place.size));
}

TEST(MpiScan, ForwardDiagonalMatchesOneProcess) {
  for (Cut cut : all_cuts)
    for (bool with_h0 : {false, true}) check_forward<paraseq::Diagonal>(cut, with_h0);
}

TEST(MpiScan, ForwardBlockDiagonalMatchesOneProcess) {
  for (Cut cut : all_cuts)
    for (bool with_h0 : {false, true}) check_forward<paraseq::BlockDiagonal<2>>(cut, with_h0);
}

TEST(MpiScan, ForwardDenseMatchesOneProcess) {
  for (Cut cut : all_cuts)
    for (bool with_h0 : {false, true}) check_forward<paraseq::Dense>(cut, with_h0);
}

TEST(MpiScan, ReverseDiagonalMatchesOneProcess) {
  for (Cut cut : all_cuts) check_reverse<paraseq::Diagonal>(cut);
}

TEST(MpiScan, ReverseBlockDiagonalMatchesOneProcess) {
  for (Cut cut : all_cuts) check_reverse<paraseq::BlockDiagonal<2>>(cut);
}

TEST(MpiScan, ReverseDenseMatchesOneProcess) {
  for (Cut cut : all_cuts) check_reverse<paraseq::Dense>(cut);
}

// float Views: the maps are composed in float; the result is the float64 one to float rounding.
TEST(MpiScan, FloatMatchesReference) {
  const Place place = world();
  Problem<paraseq::Dense, float> problem(Cut::uneven, place, 31);
  auto h = problem.output();
  paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Dense{}, problem.A, problem.b, h, problem.h0);
  const Host3 reference = paraseq::reference::linear_recurrence(
      paraseq::Dense{}, paraseq::test::to_host(problem.A_full), paraseq::test::to_host(problem.b_full),
      paraseq::test::to_host(problem.h0));
  EXPECT_LE(paraseq::test::max_relative_error(paraseq::test::as_double3(h), host_time_slice(reference, problem.slice)), 1e-5);
}

TEST(MpiScan, BitwiseRepeatable) {
  const Place place = world();
  Problem<paraseq::Dense, double> dense(Cut::uneven, place, 41);
  auto first = dense.output(), second = dense.output();
  paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Dense{}, dense.A, dense.b, first, dense.h0);
  paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Dense{}, dense.A, dense.b, second, dense.h0);
  EXPECT_TRUE(paraseq::test::bitwise_equal(first, second)) << "forward, rank " << place.rank;
  paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, paraseq::Dense{}, dense.A, dense.b, first);
  paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, paraseq::Dense{}, dense.A, dense.b, second);
  EXPECT_TRUE(paraseq::test::bitwise_equal(first, second)) << "reverse, rank " << place.rank;

  Problem<paraseq::Diagonal, double> diagonal(Cut::empty_between, place, 43);
  auto third = diagonal.output(), fourth = diagonal.output();
  paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, diagonal.A, diagonal.b, third);
  paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, diagonal.A, diagonal.b, fourth);
  EXPECT_TRUE(paraseq::test::bitwise_equal(third, fourth)) << "diagonal forward, rank " << place.rank;
}

// ---- errors: every rank raises, and the ranks stay in step for the next call ---------------------

// A valid call after an error: it would hang or fail if a rank had been left inside a collective.
void expect_ranks_in_step() {
  check_forward<paraseq::Diagonal>(Cut::uneven, true);
}

template <class T>
paraseq::test::View3<T, Space> values(int steps, int n) {
  paraseq::test::View3<T, Space> view("values", batch, steps, n);
  paraseq::test::fill_uniform(view, -1.0, 1.0, 5);
  return view;
}

TEST(MpiScanErrors, RanksDisagreeOnN) {
  const Place place = world();
  const int n = 2 + place.rank;
  auto A = values<double>(3, n), b = values<double>(3, n), h = values<double>(3, n);
  const std::string message = invalid_argument_of(
      [&] { paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h); });
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::linear_scan: argument 'b' has state size N 2 on rank 0, 3 on rank 1"));
  EXPECT_THAT(message, HasSubstr("expected the same on every rank of 'comm' (only the number of steps T may differ)"));
  expect_ranks_in_step();
}

TEST(MpiScanErrors, RanksDisagreeOnStructure) {
  const Place place = world();
  auto b = values<double>(3, 4), h = values<double>(3, 4);
  std::string message;
  if (place.rank == 0) {
    auto A = values<double>(3, 4);
    message = invalid_argument_of([&] { paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h); });
  } else {
    paraseq::test::View5<double, Space> A("A", batch, 3, 2, 2, 2);
    message = invalid_argument_of(
        [&] { paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::BlockDiagonal<2>{}, A, b, h); });
  }
  EXPECT_THAT(message, HasSubstr("argument 'structure' has the value Diagonal on rank 0, BlockDiagonal<2> on rank 1"));
  expect_ranks_in_step();
}

TEST(MpiScanErrors, RanksDisagreeOnValueType) {
  const Place place = world();
  std::string message;
  if (place.rank % 2 == 0) {
    auto A = values<float>(3, 2), g = values<float>(3, 2), lambda = values<float>(3, 2);
    message = invalid_argument_of(
        [&] { paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, g, lambda); });
  } else {
    auto A = values<double>(3, 2), g = values<double>(3, 2), lambda = values<double>(3, 2);
    message = invalid_argument_of(
        [&] { paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, g, lambda); });
  }
  EXPECT_THAT(message, HasSubstr("paraseq::mpi::linear_scan_reverse: argument 'g' has value type float on rank 0, double on rank 1"));
  expect_ranks_in_step();
}

TEST(MpiScanErrors, RanksDisagreeOnWhetherH0IsGiven) {
  const Place place = world();
  auto A = values<double>(3, 2), b = values<double>(3, 2), h = values<double>(3, 2);
  paraseq::test::View2<double, Space> h0("h0", batch, 2);
  const std::string message = invalid_argument_of([&] {
    if (place.rank == 0) paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h, h0);
    else paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h);
  });
  EXPECT_THAT(message, HasSubstr("argument 'h0' has a View on rank(s) 0 and none on rank(s) 1"));
  EXPECT_THAT(message, HasSubstr("expected h0 on every rank of 'comm' (it is read on rank 0 only) or on none"));
  expect_ranks_in_step();
}

TEST(MpiScanErrors, RanksCallDifferentFunctions) {
  const Place place = world();
  auto A = values<double>(3, 2), b = values<double>(3, 2), h = values<double>(3, 2);
  const std::string message = invalid_argument_of([&] {
    if (place.rank == 0) paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h);
    else paraseq::mpi::linear_scan_reverse(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h);
  });
  EXPECT_THAT(message, HasSubstr("call different functions: paraseq::mpi::linear_scan on rank 0, "
                                 "paraseq::mpi::linear_scan_reverse on rank 1"));
  expect_ranks_in_step();
}

// The last rank's h has the wrong number of steps: it raises its own error, the others name it.
TEST(MpiScanErrors, OneRanksBadShapeReachesEveryRank) {
  const Place place = world();
  const int bad_rank = place.size - 1;
  auto A = values<double>(3, 2), b = values<double>(3, 2);
  auto h = values<double>(place.rank == bad_rank ? 4 : 3, 2);
  const std::string message = invalid_argument_of(
      [&] { paraseq::mpi::linear_scan(Space{}, MPI_COMM_WORLD, paraseq::Diagonal{}, A, b, h); });
  if (place.rank == bad_rank)
    EXPECT_THAT(message, HasSubstr("paraseq::mpi::linear_scan: argument 'h' has shape [2, 4, 2], expected shape [2, 3, 2]"));
  else
    EXPECT_THAT(message, HasSubstr("the arguments of rank(s) " + std::to_string(bad_rank) +
                                   " of 'comm' were refused there (their error names the argument)"));
  expect_ranks_in_step();
}

} // namespace

int main(int argc, char** argv) { return paraseq::test::run_mpi_tests(argc, argv); }
