#pragma once
// What the tests over MPI ranks share (test_mpi_scan.cpp, test_mpi_newton.cpp): this rank's place in
// MPI_COMM_WORLD, how a time axis is cut into slices, slicing Views along time, and the main that
// initialises MPI and makes every rank fail when one does.
#include "test_support.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace paraseq::test {

struct Place {
  int rank = 0;
  int size = 1;
};

inline Place world() {
  Place place;
  MPI_Comm_rank(MPI_COMM_WORLD, &place.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &place.size);
  return place;
}

// How the time axis is cut: the number of steps of each rank.
enum class Cut { uneven, empty_between, empty_first };

inline std::vector<int> steps_per_rank(Cut cut, int size) {
  std::vector<int> steps(size);
  for (int rank = 0; rank < size; ++rank) {
    if (cut == Cut::uneven) steps[rank] = rank + 2;
    else if (cut == Cut::empty_between) steps[rank] = rank == 1 ? 0 : 3 + rank; // 2 ranks: the last is empty
    else steps[rank] = rank == 0 ? 0 : 4;
  }
  return steps;
}

inline const char* cut_name(Cut cut) {
  return cut == Cut::uneven ? "uneven" : cut == Cut::empty_between ? "empty slice on rank 1" : "empty slice on rank 0";
}

inline constexpr Cut all_cuts[] = {Cut::uneven, Cut::empty_between, Cut::empty_first};

// This rank's slice [first, first + steps) of a sequence cut by `cut`.
struct Slice {
  int first = 0;
  int steps = 0;
  int total = 0;
};

inline Slice slice_of(Cut cut, const Place& place) {
  const std::vector<int> steps = steps_per_rank(cut, place.size);
  Slice slice;
  slice.first = std::accumulate(steps.begin(), steps.begin() + place.rank, 0);
  slice.steps = steps[place.rank];
  slice.total = std::accumulate(steps.begin(), steps.end(), 0);
  return slice;
}

// view(:, first : first + steps, ...) as a View of its own.
template <class View>
View time_slice(const View& full, int first, int steps, const View& like) {
  const auto range = std::make_pair(first, first + steps);
  if constexpr (View::rank == 3) Kokkos::deep_copy(like, Kokkos::subview(full, Kokkos::ALL, range, Kokkos::ALL));
  else if constexpr (View::rank == 4) Kokkos::deep_copy(like, Kokkos::subview(full, Kokkos::ALL, range, Kokkos::ALL, Kokkos::ALL));
  else Kokkos::deep_copy(like, Kokkos::subview(full, Kokkos::ALL, range, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
  return like;
}

inline Host3 host_time_slice(const Host3& full, const Slice& slice) {
  Host3 out("slice", full.extent(0), slice.steps, full.extent(2));
  for (std::size_t b = 0; b < full.extent(0); ++b)
    for (int t = 0; t < slice.steps; ++t)
      for (std::size_t n = 0; n < full.extent(2); ++n) out(b, t, n) = full(b, slice.first + t, n);
  return out;
}

// The message of the std::invalid_argument that call() throws.
template <class Call>
std::string invalid_argument_of(Call call) {
  try {
    call();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(no std::invalid_argument was thrown)";
}

// Prints the failures of a rank other than 0 (rank 0 keeps GoogleTest's full output).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::printf("[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                  result.line_number(), result.summary());
  }

private:
  int rank_;
};

// The body of a main: MPI and Kokkos around the tests; every rank fails when one does.
inline int run_mpi_tests(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    const Place place = world();
    if (place.rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(place.rank));
    }
    failed = RUN_ALL_TESTS();
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}

} // namespace paraseq::test
