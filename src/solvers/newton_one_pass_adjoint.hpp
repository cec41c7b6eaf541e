#pragma once
// The one-pass mode's adjoint (see newton_backward.hpp): the fused adjoint's windows
// (newton_fused_adjoint.hpp, FusedAdjoint::run_window) taken by different teams at once, as the
// one-pass forward takes the forward's (newton_one_pass.hpp).
//
// The adjoint nu_t = J_t^T (g_t + nu_{t+1}), nu_T = 0, is one affine recurrence backwards in time
// at the converged trajectory, so a window needs one thing from the windows after it: the nu
// entering its last step. A team owns one window, one batch element and one tile of groups; it
// reads the window's u, h and g once, composes its threads' maps into the window's map
// nu_in -> nu_out and publishes it, looks back to the nearest later window that has published the
// nu leaving it, applies the maps of the windows in between one by one and publishes the nu leaving
// its own first step (exchange_through_look_back of newton_fused.hpp: per group, in words tagged
// with the call, TaggedWord). Then it re-runs its steps from that nu as the fused adjoint does and writes du once.
// Every published nu is its window's map applied to the later window's nu, wherever a look-back
// stopped: the result is bitwise reproducible. Teams take windows in the order they start (a
// ticket, from the last window to the first), so every window a team waits for belongs to a team
// that has started: the waits end on GPUs and with OpenMP.
//
// Parameter sums: the team adds its threads' sums in thread order, one row per window and batch
// element; newton_backward adds the rows in a fixed order (sum_partials). No atomics.
// Memory traffic: u, h and g read once, du written once, plus per window one map and one nu of
// every group and the window's parameter row.

#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/newton_fused.hpp>
#include <paraseq/solvers/newton_fused_adjoint.hpp>
#include <paraseq/solvers/newton_one_pass.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace paraseq::detail {

// The one-pass adjoint's chain for one team (window, batch element, tile). Windows are numbered in
// the order the adjoint runs them: order 0 is the sequence's last window.
template <class Acc, int D, int LookBackReadAhead>
struct OnePassAdjointChain {
  static constexpr bool needs_window_map = true;
  static constexpr int MapSize = map_size<D>, W = words_per_value<Acc>;

  TaggedWord* maps;  // [windows][B][groups][MapSize][W], by order: window maps nu_in -> nu_out
  TaggedWord* nus;   // [windows][B][groups][D][W], by order: the nu leaving each window's first step
  std::uint32_t tag; // this call's, in every word of maps and nus
  int batch, groups;
  int order, b; // this team's

  KOKKOS_INLINE_FUNCTION std::size_t values_at(int at, const FusedThread& me, int size) const {
    return ((std::size_t(at) * batch + b) * groups + me.g) * size;
  }

  // The nu entering the window, into every lane's carry: the window's map is the composition of
  // its threads' maps, the last thread's first (it meets nu first).
  template <class Member, class MapOf>
  KOKKOS_INLINE_FUNCTION void enter(const Member& team, const FusedThread& me, const MapOf& map_of, int active, int d,
                                    Acc* carry) const {
    const bool folds = me.live && me.p == 0;
    Acc fold[MapSize];
    if (folds) {
      for (int i = 0; i < MapSize; ++i) fold[i] = map_of(active - 1)[i];
      for (int q = active - 2; q >= 0; --q) map_prepend<Acc, D>(d, map_of(q), fold);
    }
    // The last window's entering nu is nu_T = 0, as the exchange starts the first entry.
    exchange_through_look_back<Acc, D, LookBackReadAhead>(
        team, folds, order, d, tag, fold, [&](int at) { return maps + values_at(at, me, MapSize * W); },
        [&](int at) { return nus + values_at(at, me, D * W); },
        [&](const Acc* entering) {
          for (int i = 0; i < d; ++i) carry[i] = entering[i];
        });
  }
  // Nothing to hand on: the window's leaving nu is published above.
  KOKKOS_INLINE_FUNCTION void leave(const Acc*, int, Acc*) const {}
};

// The kernel: a team per (window, batch element, tile), in ticket order from the last window, each
// running its window with FusedAdjoint's machinery and OnePassAdjointChain, then writing its
// window's parameter row. LaunchBounds: a Kokkos::LaunchBounds to compile it with, or void
// (fused_launch_bounds); LookBackReadAhead: the later windows a look-back reads at once
// (exchange_through_look_back's ReadAhead).
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View, class GView, class DUView,
          class DH0View, class LaunchBounds, int LookBackReadAhead>
struct OnePassAdjoint {
  using partial_view = Kokkos::View<Acc**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  using core_type = FusedAdjoint<Acc, ExecSpace, Cell, UView, HView, H0View, GView, DUView, partial_view, DH0View>;
  using member_type = typename core_type::member_type;
  using chain_type = OnePassAdjointChain<Acc, core_type::D, LookBackReadAhead>;
  using launch_bounds = LaunchBounds;
  static constexpr int MapSize = core_type::MapSize;

  core_type core;   // core.partial: [windows * B, cell.param_count()], row window * B + b
  FusedPlan plan;   // core.plan (launch_fused reads it here)
  chain_type chain; // the workspace; order and b are set per team
  Kokkos::View<int*, typename ExecSpace::memory_space> next_ticket; // zeroed for every call

  using scratch_view = typename core_type::scratch_view;

  KOKKOS_INLINE_FUNCTION std::size_t scratch_count() const { return core.scratch_count(); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int ticket = take_ticket(team, next_ticket);
    const int per_window = core.shape.batch * core.tiles, team_index = ticket % per_window;
    const FusedThread me = fused_thread(team, plan, core.tiles, core.shape.groups, team_index);
    chain_type mine = chain;
    mine.order = ticket / per_window;
    mine.b = me.b;
    const int window = int(ceil_div(core.shape.steps, plan.window)) - 1 - mine.order;
    Acc* const scratch = scratch_view(team.team_scratch(0), scratch_count()).data();
    const typename core_type::Scratch shared = core.scratch_at(scratch, me);
    Acc sums[core_type::Params] = {};
    core.run_window(team, me, shared, window * plan.window, mine, sums);
    // The lanes' threads add their sums in thread order, MapSize terms at a time through their map
    // slots (run_window's last barrier ended every read of them).
    const std::size_t row = std::size_t(window) * core.shape.batch + me.b;
    auto slot_of = [&](int p) { return shared.maps + (std::size_t(p) * plan.lanes + me.lane) * MapSize; };
    const int params = core.cell.params_per_group();
    for (int k0 = 0; k0 < params; k0 += MapSize) {
      if (me.live)
        for (int k = k0; k < Kokkos::min(params, k0 + MapSize); ++k) slot_of(me.p)[k - k0] = sums[k];
      team.team_barrier();
      if (me.live && me.p == 0)
        for (int k = k0; k < Kokkos::min(params, k0 + MapSize); ++k) {
          Acc sum = Acc(0);
          for (int p = 0; p < plan.team_chunks; ++p) sum += slot_of(p)[k - k0];
          core.partial(row, core.cell.param_index(me.g, k)) = sum;
        }
      team.team_barrier();
    }
  }
};

// The later windows the library's one-pass adjoint reads at once in a look-back
// (exchange_through_look_back's ReadAhead). On the H200 (fca8119, 2026-12-07, ParaGRU in float, P = 8)
// reading 1 ran (1, 65536, 256) in 0.386 ms, (1, 2^20, 64) in 4.44 and (4, 2^18, 128) in 2.34;
// reading 4 in 0.435, 3.50 and 3.08, 8 in 0.584, 3.71 and 4.46.
inline constexpr int one_pass_adjoint_read_ahead = 1;

// Runs the one-pass adjoint: dL/du into du (and dL/dh0 into dh0), and returns the parameter rows,
// [windows * B, cell.param_count()], for sum_partials. LaunchBounds: LibraryLaunchBounds (the
// library's kernels: none, so ptxas takes the registers it wants), void (none) or a
// Kokkos::LaunchBounds; LookBackReadAhead: the later windows a look-back reads at once
// (one_pass_adjoint_read_ahead); perf_tests/bench_newton_kernels.cpp builds the others. With the
// teams of one_pass_team_groups, ParaGRU's adjoint in float at ptxas's registers (2 teams of 256
// threads per SM) took 0.333 ms at (1, 65536, 256), 1.49 at (1, 2^20, 64) and 2.15 at
// (4, 2^18, 128) on the H100 (24471d3, 2026-12-07), against 0.365, 1.56 and 2.52 with 3 teams
// at 80 registers (the library's bounds with 32 groups per team, when they were the faster) and
// 0.407, 1.67 and 2.96 with 4 at 64.
template <class Acc, class LaunchBounds = LibraryLaunchBounds, int LookBackReadAhead = one_pass_adjoint_read_ahead,
          class ExecSpace, class Cell,
          class UView, class HView, class H0View, class GView, class DUView, class DH0View>
Kokkos::View<Acc**, Kokkos::LayoutRight, typename ExecSpace::memory_space>
one_pass_adjoint(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const H0View& h0,
                 const GView& g, const DUView& du, const DH0View& dh0, const NewtonConfig& config,
                 const ScanShape& shape) {
  using bounds = std::conditional_t<std::is_same_v<LaunchBounds, LibraryLaunchBounds>, void, LaunchBounds>;
  using functor_type =
      OnePassAdjoint<Acc, ExecSpace, Cell, UView, HView, H0View, GView, DUView, DH0View, bounds, LookBackReadAhead>;
  using partial_view = typename functor_type::partial_view;
  using memory_space = typename ExecSpace::memory_space;
  constexpr int D = functor_type::core_type::D, MapSize = functor_type::MapSize, W = words_per_value<Acc>;
  FusedPlan plan = plan_fused<Cell, Acc>(space, shape, config, true);
  const int tiles = int(ceil_div(shape.groups, plan.lanes));
  const Iterate<HView, H0View> trajectory{h, h0, shape.group_size};
  auto functor_for = [&](const FusedPlan& chosen, const partial_view& partial, TaggedWord* words, std::uint32_t tag,
                         const Kokkos::View<int*, memory_space>& next_ticket) {
    const std::size_t entries = std::size_t(ceil_div(shape.steps, chosen.window)) * shape.batch * shape.groups;
    typename functor_type::chain_type chain{words, words + entries * MapSize * W, tag, shape.batch, shape.groups, 0, 0};
    return functor_type{{cell, u, trajectory, g, du, partial, dh0, chosen, shape, tiles}, chosen, chain, next_ticket};
  };
  plan = fit_fused_plan<Acc>(space, plan, shape.batch * tiles, config, functor_for(plan, {}, nullptr, 0, {}));
  const int windows = int(ceil_div(shape.steps, plan.window));
  const auto partial = zeroed_workspace_view<partial_view>(space, "paraseq::newton_param_partials",
                                                           std::size_t(windows) * shape.batch, cell.param_count());
  if (shape.batch == 0 || shape.steps == 0 || shape.groups == 0) return partial;
  // Cached workspaces (core/workspace.hpp): the tagged maps and leaving nus of every group for every
  // window, and the ticket, zeroed for every call.
  const std::size_t entries = std::size_t(windows) * shape.batch;
  const auto [words, tag] = tagged_workspace_view(space, "paraseq::newton_one_pass_adjoint_words",
                                                  entries * shape.groups * (MapSize + D) * W);
  const auto next_ticket = zeroed_workspace_view<Kokkos::View<int*, memory_space>>(
      space, "paraseq::newton_one_pass_adjoint_ticket", 1);
  launch_fused<Acc>("paraseq::newton_one_pass_adjoint", space, int(entries) * tiles,
                    functor_for(plan, partial, words.data(), tag, next_ticket));
  return partial;
}

} // namespace paraseq::detail
