#pragma once
// The team policies of paraseq's kernels, and the launch arithmetic they share.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace paraseq::detail {

KOKKOS_INLINE_FUNCTION constexpr long ceil_div(long a, long b) { return (a + b - 1) / b; }

// Level-1 scratch that every team launch asks for. Kokkos' CUDA backend (4.6) looks for its level-1
// scratch buffer at every team launch and, while it has none, allocates one of the requested size,
// 0 bytes included: a cudaMalloc per launch (one per linear_scan operator call in
// perf_tests/torch_check.py). A few bytes per team give the first launch a buffer the later ones reuse.
inline constexpr int level1_scratch_bytes_per_team = 16;

// A team policy on `space` with `league` teams of `team_size` threads (Kokkos::AUTO allowed) and
// `level0_bytes` of team scratch in level 0 (on-chip).
template <class ExecSpace, class Tag = void, class TeamSize>
auto team_policy(const ExecSpace& space, int league, TeamSize team_size, std::size_t level0_bytes = 0, int vector_length = 1) {
  using policy_t = std::conditional_t<std::is_void_v<Tag>, Kokkos::TeamPolicy<ExecSpace>, Kokkos::TeamPolicy<ExecSpace, Tag>>;
  policy_t policy(space, league, team_size, vector_length);
  policy.set_scratch_size(0, Kokkos::PerTeam(level0_bytes));
  policy.set_scratch_size(1, Kokkos::PerTeam(level1_scratch_bytes_per_team));
  return policy;
}

} // namespace paraseq::detail
