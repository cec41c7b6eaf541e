#pragma once
// The one-pass Newton mode (see newton.hpp): the newton mode's mathematics (iteration k linearises
// f at h^{k-1} at every step and solves the delta recurrence exactly over the whole sequence) in one
// kernel whose teams take the sequence's windows at once.
//
// A team owns one window of W steps, one batch element and one tile of groups, with the fused
// mode's plan and per-window machinery (newton_fused.hpp: FusedNewton::run_window, its compose and
// re-run phases and cached linearisations): it reads the window's u once, keeps the iterate on chip
// for all K iterations and writes h once. Only what enters the window differs (OnePassChain):
//   * the delta entering it in iteration k: a decoupled look-back, as the ordered scan's one-pass
//     kernel does (core/ordered_scan.hpp, ChainedTag), per group (exchange_through_look_back of
//     newton_fused.hpp). The window composes its threads' maps into the window's map
//     delta_in -> delta_out and publishes it, finds the nearest earlier window of that iteration
//     that has published its outgoing delta, applies the maps of the windows in between one by one
//     and publishes its own outgoing delta. Every delta is its window's map applied to the previous
//     window's delta, whichever window a look-back stopped at: the result is bitwise reproducible.
//     Maps and deltas carry the call's tag in each word (TaggedWord), so they need no status.
//   * the state its first step is linearised at in iteration k: the last state of window w - 1
//     after k updates. Window w - 1 publishes only its initial guess there, in tagged words too
//     (before its first iteration: a short wait, once per window); window w moves it itself by omega times the delta
//     entering it in each iteration (FusedNewton::run_window, Chain::carries_iterate), the update
//     window w - 1's re-run makes, so no iteration waits for the window before it to finish the
//     previous one. The two copies of that state agree to rounding (the entering delta comes from
//     the composed window maps, the re-run's from the steps), which the newton mode's mathematics
//     does not notice beyond rounding; each is computed the same way in every run.
// Teams take windows in the order they start (a ticket, window-major), so every window a team
// waits for belongs to a team that has started: the waits end on GPUs and on OpenMP.
// Memory traffic: u read once, h written once, plus per window one guess of every group and per
// window and iteration one map and one delta of every group (the tagged words of windows x B x
// groups x (K x (map + D) + D) values) and a ticket.
//
// Unlike the fused mode's windows, which stop on their own (residual_atol), the one-pass windows
// depend on each other: the mode runs config.max_iters iterations and takes no residual_atol.
// The kernel waits mostly on those exchanges, so on devices the teams per SM count more than a
// thread's registers: one_pass_launch_bounds (below).

#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/newton_fused.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace paraseq::detail {

// The one-pass mode's chain for one team (window, batch element, tile): what it publishes and
// looks back at, in the workspace of one_pass_newton.
template <class Acc, int D, int LookBackReadAhead>
struct OnePassChain {
  static constexpr bool needs_window_map = true;
  static constexpr bool carries_iterate = true;
  static constexpr int MapSize = map_size<D>, W = words_per_value<Acc>;

  TaggedWord* maps;    // [K][windows][B][groups][MapSize][W]: window maps delta_in -> delta_out
  TaggedWord* deltas;  // [K][windows][B][groups][D][W]: the delta leaving each window
  TaggedWord* guesses; // [windows][B][groups][D][W]: each window's initial guess at its last step
  std::uint32_t tag;   // this call's, in every word it publishes
  int windows, batch, groups;
  int window, b; // this team's

  KOKKOS_INLINE_FUNCTION std::size_t entry(int iteration, int w, int element) const {
    return (std::size_t(iteration) * windows + w) * batch + element;
  }
  KOKKOS_INLINE_FUNCTION std::size_t values_at(int iteration, int w, const FusedThread& me, int size) const {
    return (entry(iteration, w, b) * groups + me.g) * size;
  }

  template <class T>
  KOKKOS_INLINE_FUNCTION void publish_guess(const FusedThread& me, const T* last, int d) const {
    Acc values[D] = {};
    for (int i = 0; i < d; ++i) values[i] = Acc(last[i]);
    publish_tagged(guesses + values_at(0, window, me, D * W), values, D, tag);
  }

  // The first iteration linearises the window's first step at window w - 1's initial guess at its
  // last step (window 0: at h0, already in the carry), which the lane's first thread waits for: it
  // alone reads the carry before the next barrier.
  template <class Scratch>
  KOKKOS_INLINE_FUNCTION void enter_window(const FusedThread& me, const Scratch& shared) const {
    if (window == 0 || !me.live || me.p != 0) return;
    while (!read_tagged<Acc, D>(guesses + values_at(0, window - 1, me, D * W), tag, shared.carry)) {
    }
  }

  // The delta entering the window: publish the window's map, look back, publish the delta leaving.
  // The last thread's map slot (read by no re-run: a thread applies the maps before its own)
  // passes it to the lane's threads.
  template <class Member, class MapOf>
  KOKKOS_INLINE_FUNCTION void enter_delta(const Member& team, const FusedThread& me, const MapOf& map_of, int active,
                                          int iteration, int d, Acc* delta) const {
    const bool folds = me.live && me.p == 0;
    Acc fold[MapSize];
    if (folds) {
      for (int i = 0; i < MapSize; ++i) fold[i] = map_of(0)[i];
      for (int q = 1; q < active; ++q) map_prepend<Acc, D>(d, map_of(q), fold);
    }
    exchange_through_look_back<Acc, D, LookBackReadAhead>(
        team, folds, window, d, tag, fold, [&](int w) { return maps + values_at(iteration, w, me, MapSize * W); },
        [&](int w) { return deltas + values_at(iteration, w, me, D * W); },
        [&](const Acc* entering) {
          for (int i = 0; i < d; ++i) map_of(active - 1)[i] = entering[i];
        });
    if (me.live)
      for (int i = 0; i < d; ++i) delta[i] = map_of(active - 1)[i];
  }

  template <class Scratch, class T>
  KOKKOS_INLINE_FUNCTION void finish_window(const FusedThread&, const Scratch&, const T*, int) const {}
};

// The kernel: a team per (window, batch element, tile), in ticket order, each running its window
// with FusedNewton's machinery and OnePassChain. LaunchBounds: a Kokkos::LaunchBounds to compile it
// with, or void (fused_launch_bounds); LookBackReadAhead: the earlier windows a look-back reads at
// once (exchange_through_look_back's ReadAhead).
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View, int ChunkCapacity,
          class LaunchBounds, int LookBackReadAhead, ChunkInputs InputsAt>
struct OnePassNewton {
  using core_type =
      FusedNewton<Acc, ExecSpace, Cell, UView, HView, H0View, false, ChunkCapacity, InputsAt>; // no early exit
  using member_type = typename core_type::member_type;
  using chain_type = OnePassChain<Acc, core_type::D, LookBackReadAhead>;
  using launch_bounds = LaunchBounds;

  core_type core;
  FusedPlan plan;   // core.plan (launch_fused reads it here)
  chain_type chain; // the workspace; window, b and tile are set per team
  Kokkos::View<int*, typename ExecSpace::memory_space> next_ticket; // zeroed for every call

  using scratch_view = typename core_type::scratch_view;

  KOKKOS_INLINE_FUNCTION std::size_t scratch_count() const { return core.scratch_count(); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int ticket = take_ticket(team, next_ticket);
    const int per_window = core.shape.batch * core.tiles, team_index = ticket % per_window;
    const FusedThread me = fused_thread(team, plan, core.tiles, core.shape.groups, team_index);
    chain_type mine = chain;
    mine.window = ticket / per_window;
    mine.b = me.b;
    Acc* const scratch = scratch_view(team.team_scratch(0), scratch_count()).data();
    core.run_window_at(team, me, core.scratch_at(scratch, me), mine.window * plan.window, mine);
  }
};

// The library's launch bounds for the one-pass forward. On devices, cells with one state per group
// and at most 3 inputs per step, in float (ParaGRU), run as 4 teams of at most 256 threads per SM
// with their registers capped at 64 and their chunks' inputs in team scratch (one_pass_chunk_inputs;
// ptxas spills 184 bytes of a thread's values to local memory, which the L1 cache holds). With
// the teams of one_pass_team_groups and look-backs reading one window at a time, on the H100
// (2026-12-07, gru_one_pass_chunks, one run) that ran ParaGRU's one-pass forward at (1, 65536, 256)
// in 0.329 ms, at (1, 2^20, 64) in 1.59 and at (4, 2^18, 128) in 2.14, against 0.343, 1.65 and 2.15
// at 3 teams (80 registers) and 0.335, 1.63 and 2.10 without bounds (72 registers: 3 teams). With
// the inputs in registers, 3 teams had been the faster (0.343 against 0.350 ms at 4: 54d21b3).
// Other cells, double and hosts: none (not measured).
template <class Acc, class Cell, class ExecSpace>
using one_pass_launch_bounds =
    std::conditional_t<!Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
                           std::is_same_v<Acc, float> && Cell::structure::fixed_group_size == 1 &&
                           Cell::max_inputs_per_group <= 3,
                       Kokkos::LaunchBounds<256, 4>, void>;

// one_pass_newton's LaunchBounds when the library's choice (one_pass_launch_bounds) is wanted.
struct LibraryLaunchBounds {};

// Where the library's one-pass forward keeps its chunks' inputs (ChunkInputs): on devices, for the
// cells of one_pass_launch_bounds, in team scratch (24 values per thread for ParaGRU, 24 KiB per team),
// elsewhere in registers. nvcc 13.0, sm_90 (ParaGRU in float): at 80 registers ptxas spilled 204
// bytes of the kernel with its inputs in registers and 8 with them staged, at 64 registers 228 and
// 184; unbounded it gives the staged kernel 72 registers and no spills. On the H100 (2026-12-07,
// one run) staging changed nothing at 3 teams per SM (0.343 ms at (1, 65536, 256) either way) and
// made the 4-team kernel, the library's since, 6% faster than the same with its inputs in
// registers at 54d21b3 (0.329 against 0.350 ms; other runs).
template <class Acc, class Cell, class ExecSpace>
inline constexpr ChunkInputs one_pass_chunk_inputs =
    std::is_void_v<one_pass_launch_bounds<Acc, Cell, ExecSpace>> ? ChunkInputs::registers : ChunkInputs::team_scratch;

// one_pass_newton's InputsAt: LibraryChunkInputs (one_pass_chunk_inputs), or chunk_inputs_at<where>.
struct LibraryChunkInputs {};
template <ChunkInputs Where>
using chunk_inputs_at = std::integral_constant<ChunkInputs, Where>;

// The earlier windows the library's one-pass forward reads at once in a look-back
// (exchange_through_look_back's ReadAhead): every window read is a word in flight and registers
// that the 64-register kernel spills. On the H100 (24471d3, 2026-12-07, ParaGRU in float, the teams
// of one_pass_team_groups) reading 1 ran (1, 65536, 256) in 0.351 ms, (1, 2^20, 64) in 1.68 and
// (4, 2^18, 128) in 2.28, reading 2 in 0.418, 1.79 and 2.89, reading 4 in 0.639, 2.65 and 4.80
// (with 32 groups per team, on the H200, 2 had been the faster at the first two shapes).
inline constexpr int one_pass_read_ahead = 1;

// Runs the one-pass mode: config.max_iters Newton iterations of the whole sequence into h.
// ChunkCapacity: steps per thread, 0 for the space's fused_chunk_capacity (the library's kernels);
// LaunchBounds: LibraryLaunchBounds (the library's kernels), void (none) or a Kokkos::LaunchBounds;
// LookBackReadAhead: the earlier windows a look-back reads at once (one_pass_read_ahead);
// InputsAt: LibraryChunkInputs (the library's kernels) or chunk_inputs_at<where>.
// perf_tests/bench_newton_kernels.cpp builds others to measure the trade-offs of registers against
// windows and against resident teams.
template <class Acc, int ChunkCapacity = 0, class LaunchBounds = LibraryLaunchBounds,
          int LookBackReadAhead = one_pass_read_ahead, class InputsAt = LibraryChunkInputs,
          class ExecSpace, class Cell, class UView, class HView, class H0View>
void one_pass_newton(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const H0View& h0,
                     const NewtonConfig& config, const ScanShape& shape) {
  if (shape.batch == 0 || shape.steps == 0 || shape.groups == 0) return;
  constexpr int capacity = ChunkCapacity > 0 ? ChunkCapacity : fused_chunk_capacity<Cell, ExecSpace>;
  using bounds = std::conditional_t<std::is_same_v<LaunchBounds, LibraryLaunchBounds>,
                                    one_pass_launch_bounds<Acc, Cell, ExecSpace>, LaunchBounds>;
  constexpr ChunkInputs inputs_at =
      std::conditional_t<std::is_same_v<InputsAt, LibraryChunkInputs>,
                         chunk_inputs_at<one_pass_chunk_inputs<Acc, Cell, ExecSpace>>, InputsAt>::value;
  using functor_type =
      OnePassNewton<Acc, ExecSpace, Cell, UView, HView, H0View, capacity, bounds, LookBackReadAhead, inputs_at>;
  using memory_space = typename ExecSpace::memory_space;
  constexpr int D = functor_type::core_type::D, MapSize = map_size<D>, W = words_per_value<Acc>;
  FusedPlan plan = plan_fused<Cell, Acc>(space, shape, config, true, capacity, inputs_at);
  const int tiles = int(ceil_div(shape.groups, plan.lanes)), K = config.max_iters;
  auto functor_for = [&](const FusedPlan& chosen, TaggedWord* words, std::uint32_t tag,
                         const Kokkos::View<int*, memory_space>& next_ticket) {
    const int windows = int(ceil_div(shape.steps, chosen.window));
    const std::size_t per_iteration = std::size_t(windows) * shape.batch * shape.groups;
    typename functor_type::chain_type chain{words,
                                            words + K * per_iteration * MapSize * W,
                                            words + K * per_iteration * (MapSize + D) * W,
                                            tag,
                                            windows,
                                            shape.batch,
                                            shape.groups,
                                            0,
                                            0};
    return functor_type{{cell, u, h, h0, chosen, shape, K, Acc(config.omega), config.initial_guess, tiles, 0, {}},
                        chosen, chain, next_ticket};
  };
  plan = fit_fused_plan<Acc>(space, plan, shape.batch * tiles, config, functor_for(plan, nullptr, 0, {}));
  const int windows = int(ceil_div(shape.steps, plan.window));
  const std::size_t per_iteration = std::size_t(windows) * shape.batch * shape.groups;
  // Cached workspaces (core/workspace.hpp): the tagged maps and outgoing deltas of every group for
  // every (iteration, window) and the windows' guesses; the ticket, zeroed for every call.
  const auto [words, tag] = tagged_workspace_view(space, "paraseq::newton_one_pass_words",
                                                  per_iteration * (K * (MapSize + D) + D) * W);
  const auto next_ticket =
      zeroed_workspace_view<Kokkos::View<int*, memory_space>>(space, "paraseq::newton_one_pass_ticket", 1);
  launch_fused<Acc>("paraseq::newton_one_pass", space, windows * shape.batch * tiles,
                    functor_for(plan, words.data(), tag, next_ticket));
}

} // namespace paraseq::detail
