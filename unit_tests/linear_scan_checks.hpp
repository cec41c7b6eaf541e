#pragma once
// The checks the linear-scan tests share (test_linear_scan*.cpp): the decompositions to cover, a
// contractive A, and a scan forward and reverse against the sequential float64 reference.

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/sequential_reference.hpp>

#include "test_support.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace paraseq::test {

// The most threads a team kernel may have on the space (an empty one: a real kernel's registers
// may allow fewer).
template <class Space>
int team_size_limit() {
  return Kokkos::TeamPolicy<Space>(Space{}, 1, 1).team_size_max(
      KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<Space>::member_type&) {}, Kokkos::ParallelForTag{});
}

// Decompositions to cover: the automatic plan, the sequential loop, time chunks with one thread per
// team, windows of several sub-chunks (where the space allows teams of more than one thread), and
// time chunks found in two passes and in one (chunks of one window, chained by the look-back; with
// chunks of a few steps, hundreds of chunks in dozens of segments).
// At most `max_team_chunks` sub-chunks (and team_size_limit): a Dense map (up to 32 x 33 values,
// 8.4 KiB in double) per sub-chunk leaves room for 3 in OpenMP's 32 KiB of team scratch.
template <class Space>
std::vector<ScanConfig> decompositions(int max_team_chunks = 4) {
  const int team = std::min(max_team_chunks, team_size_limit<Space>());
  constexpr auto two = TimeSplit::two_pass, one = TimeSplit::single_pass;
  std::vector<ScanConfig> configs{ScanConfig{},          sequential_scan_config, ScanConfig{1, 5, 7, two},
                                  ScanConfig{1, 3, 2, two}, ScanConfig{1, 5, 7, one}, ScanConfig{1, 64, 2, one}};
  for (int p = 2; p <= team; p *= 2) {
    configs.push_back(ScanConfig{p, 3, 1});
    configs.push_back(ScanConfig{p, 4, 3, two});
    configs.push_back(ScanConfig{p, 4, 3, one});
  }
  if (team >= 3) { // the scan of the sub-chunk maps with a count that is not a power of two
    configs.push_back(ScanConfig{3, 5, 1});
    configs.push_back(ScanConfig{3, 2, 4, one});
  }
  return configs;
}

inline std::string describe(const ScanConfig& c) {
  return "team_chunks=" + std::to_string(c.team_chunks) + " chunk_length=" + std::to_string(c.chunk_length) +
         " time_chunks=" + std::to_string(c.time_chunks) + " time_split=" + std::to_string(int(c.time_split));
}

// Random A with long memory and order-dependent products: (1 - rho) I plus off-diagonal noise,
// with every row's absolute sum below 1 so the recurrence is contractive.
template <class View>
void fill_contractive(const View& A, int group, unsigned seed, double rho = 0.05) {
  fill_uniform(A, -rho / (2 * group), rho / (2 * group), seed);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, A);
  auto* data = host.data();
  const std::size_t block = std::size_t(group) * group;
  for (std::size_t e = 0; e < host.span(); e += block)
    for (int i = 0; i < group; ++i) data[e + i * group + i] += 1 - rho;
  Kokkos::deep_copy(A, host);
}

template <class Space, class T, class Structure, class AView>
void expect_matches_reference(Structure structure, const AView& A, int B, int T_steps, int N, double tolerance,
                              const std::vector<ScanConfig>& configs) {
  View3<T, Space> b("b", B, T_steps, N), h("h", B, T_steps, N), g("g", B, T_steps, N), lambda("lambda", B, T_steps, N);
  fill_uniform(b, -1, 1, 11);
  fill_uniform(g, -1, 1, 12);
  const auto A_host = to_host(A);
  const auto h_ref = reference::linear_recurrence(structure, A_host, to_host(b));
  const auto lambda_ref = reference::adjoint_recurrence(structure, A_host, to_host(g));
  for (const ScanConfig& config : configs) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(h, T(NAN));
    linear_scan<double>(Space{}, structure, A, b, h, config);
    EXPECT_LE(max_relative_error(h, h_ref), tolerance);
    Kokkos::deep_copy(lambda, T(NAN));
    linear_scan_reverse<double>(Space{}, structure, A, g, lambda, config);
    EXPECT_LE(max_relative_error(lambda, lambda_ref), tolerance);
  }
}

// The message of the std::invalid_argument that fn throws.
template <class Fn>
std::string thrown_message(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

} // namespace paraseq::test
