#pragma once
// The fused Newton mode (see newton.hpp): one kernel runs all K iterations on chip.
//
// A team owns batch element b and a tile of `lanes` groups and walks the sequence in windows of
// W = P x L steps. Its threads form a [P][lanes] grid: thread (p, lane) owns group lane of the tile
// for the window's steps p*L .. p*L + L - 1 and keeps their inputs, iterate and (for small groups)
// linearisations in its own registers, so consecutive threads of a GPU warp read consecutive
// channels of one step. Per window the team reads u once, forms the initial guess, runs K Newton
// iterations, writes h once, and hands the window's last state to the next window as its exact
// (converged) start. One iteration is the scan's window algorithm:
//   compose  each thread linearises f at the iterate over its steps and composes their affine maps
//            delta -> J delta + (f - h) into one map, published in team scratch;
//   re-run   each thread applies the maps of the threads before it to delta = 0 (the window's
//            start is exact) and re-runs its steps from there, updating its iterate in place;
//   publish  each thread's new last state is what the next thread linearises at.
// Team scratch holds only the maps, those boundary states and the carry.
//
// Early exit (NewtonConfig::residual_atol): the compose phase forms F_t = f(h_{t-1}, u_t) - h_t of
// the current iterate at every step of the window anyway; with atol set each thread also checks
// |F_t| <= atol over its steps and channels, and one team reduction per iteration tells the team
// whether the whole window (its batch element, its tile of groups, the window's steps, from the
// state the previous window ended in) is within atol. If it is, the window stops before its update:
// its iterate is final, with max |F| <= atol. Each window decides from its own data alone, so the
// result does not depend on the other teams (bitwise repeatable). The check is compiled only into
// the kernel that runs with atol (EarlyExit): as a branch never taken it cost the kernel without
// atol 21 registers (ParaGRU in float, sm_90, nvcc 13.0: 96 before e150194, 117 after), and that
// kernel became 30% slower at (16, 4096, 1024) on the H200 with the same commit (0.80 -> 1.04 ms).
// The most iterations any window ran is an atomic max into a device scalar.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton_config.hpp>
#include <paraseq/solvers/newton_kernels.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace paraseq::detail {

// Small groups of a fixed size (diagonal, blocks <= 4: those whose cell functions are inlined,
// newton_kernels.hpp) keep each step's (f, J) from the compose phase for the re-run; larger ones
// evaluate the cell again at the same iterate.
template <class Cell>
inline constexpr bool fused_caches_linearization =
    Cell::structure::fixed_group_size > 0 && inlines_cell_functions<Cell>;

// Steps one thread keeps on chip: 8 on devices (registers for diagonal and small-block cells,
// local memory for larger groups), up to 4096 values on hosts (its stack; at most 256 steps).
template <class Cell, class ExecSpace>
inline constexpr int fused_chunk_capacity = [] {
  constexpr int D = cell_group_bound<Cell>;
  constexpr int per_step = D + Cell::max_inputs_per_group + (fused_caches_linearization<Cell> ? D + D * D : 0);
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible)
    return std::clamp(4096 / per_step, 1, 256);
  else
    return 8;
}();

// The group size as the fused kernels use it: the structure's compile-time size where it fixes one,
// so that loops over a group's values unroll and its arrays stay in registers.
template <class Cell>
KOKKOS_INLINE_FUNCTION int fused_group_size(const ScanShape& shape) {
  return Cell::structure::fixed_group_size > 0 ? Cell::structure::fixed_group_size : shape.group_size;
}

struct FusedPlan {
  int lanes = 1;        // groups per team
  int team_chunks = 1;  // P: threads per lane
  int chunk_length = 1; // L: steps per thread and window
  int window = 1;       // W = P x L
};

// Where a thread of a fused team works (this forward and the adjoint of newton_fused_adjoint.hpp):
// its lane (group of the tile) and chunk p, its batch element b and group g. Threads past the last
// group are not live but still meet every barrier.
struct FusedThread {
  int lane, p, b, g;
  bool live;
};

// `team_index` = b x tiles + tile: the league rank, or the one-pass mode's ticket within its window.
template <class Member>
KOKKOS_INLINE_FUNCTION FusedThread fused_thread(const Member& team, const FusedPlan& plan, int tiles, int groups,
                                                int team_index) {
  const int lane = team.team_rank() % plan.lanes, g = (team_index % tiles) * plan.lanes + lane;
  return {lane, team.team_rank() / plan.lanes, team_index / tiles, g, g < groups};
}

template <class Member>
KOKKOS_INLINE_FUNCTION FusedThread fused_thread(const Member& team, const FusedPlan& plan, int tiles, int groups) {
  return fused_thread(team, plan, tiles, groups, team.league_rank());
}

// Thread p's part of the window that begins at `start`: the threads with steps in the window, and
// the thread's first step and number of steps (0 past the window's end).
struct FusedChunk {
  int active, first, count;
};

KOKKOS_INLINE_FUNCTION FusedChunk fused_chunk(const FusedPlan& plan, int steps, int start, int p) {
  const int length = Kokkos::min(plan.window, steps - start), L = plan.chunk_length;
  return {int(ceil_div(length, L)), start + p * L, Kokkos::max(0, Kokkos::min(L, length - p * L))};
}

// How a fused window learns what enters it (the hooks of FusedNewton::run_window). The fused mode's
// chain: a team walks its windows in order and each window starts from the converged end of the
// previous one (in its lane's carry, constant over the window's iterations), so the delta entering
// the window is 0. The one-pass mode (newton_one_pass.hpp) replaces it by a look-back across teams.
struct WindowsInOrder {
  static constexpr bool needs_window_map = false; // the window's own map (composed over all threads)
  // Whether the carry holds the iterate at the step before the window, which each iteration moves
  // by omega times the delta entering the window (the one-pass mode), rather than a converged state.
  static constexpr bool carries_iterate = false;
  // The window's initial guess at its last step, by the thread that holds it.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void publish_guess(const FusedThread&, const Acc*, int) const {}
  // Before the first iteration, after a barrier: the lane's carry holds the state the window's first
  // step is linearised at (here: already there).
  template <class Scratch>
  KOKKOS_INLINE_FUNCTION void enter_window(const FusedThread&, const Scratch&) const {}
  // After the compose barrier: delta entering the window's first step (here: 0; the start is exact).
  template <class Member, class MapOf, class Acc>
  KOKKOS_INLINE_FUNCTION void enter_delta(const Member&, const FusedThread&, const MapOf&, int, int, int d,
                                          Acc* delta) const {
    for (int i = 0; i < d; ++i) delta[i] = Acc(0);
  }
  // The window is done; `last` is its final state (the thread of the window's last step): the next
  // window of this team starts from it.
  template <class Scratch, class Acc>
  KOKKOS_INLINE_FUNCTION void finish_window(const FusedThread&, const Scratch& shared, const Acc* last, int d) const {
    for (int i = 0; i < d; ++i) shared.carry[i] = last[i];
  }
};

// What the one-pass kernels' windows publish to each other (newton_one_pass.hpp's window maps and
// deltas, newton_one_pass_adjoint.hpp's maps and nus): each 32 bits of a value travel in a 64-bit
// word whose other half is the call's tag, stored and loaded as one (single-copy atomic), so a
// reader that sees its call's tag in a word sees the value beside it: no status, no fence and no
// team barrier stand between a window's values and the windows that wait for them. The tags differ
// between the calls that share a workspace (tagged_workspace_view), so a word an earlier call left
// is never taken for a published one.
using TaggedWord = std::uint64_t;

template <class Acc>
inline constexpr int words_per_value = [] {
  static_assert(sizeof(Acc) == 4 || sizeof(Acc) == 8, "paraseq: tagged words carry 4- or 8-byte values");
  return int(sizeof(Acc) / sizeof(std::uint32_t));
}();

// The unsigned integer of a value's bits (Kokkos::bit_cast's other side).
template <class Acc>
using value_bits = std::conditional_t<sizeof(Acc) == 4, std::uint32_t, std::uint64_t>;

KOKKOS_INLINE_FUNCTION void store_word(TaggedWord* to, TaggedWord word) {
  KOKKOS_IF_ON_DEVICE((*static_cast<volatile TaggedWord*>(to) = word;))
  KOKKOS_IF_ON_HOST((std::atomic_ref<TaggedWord>(*to).store(word, std::memory_order_relaxed);))
}

KOKKOS_INLINE_FUNCTION TaggedWord load_word(const TaggedWord* from) {
  KOKKOS_IF_ON_DEVICE((return *static_cast<const volatile TaggedWord*>(from);))
  KOKKOS_IF_ON_HOST(
      (return std::atomic_ref<TaggedWord>(*const_cast<TaggedWord*>(from)).load(std::memory_order_relaxed);))
}

// Publishes `count` values at `to` (count x words_per_value<Acc> words) with `tag`.
template <class Acc>
KOKKOS_INLINE_FUNCTION void publish_tagged(TaggedWord* to, const Acc* values, int count, std::uint32_t tag) {
  constexpr int W = words_per_value<Acc>;
  for (int i = 0; i < count; ++i) {
    const value_bits<Acc> bits = Kokkos::bit_cast<value_bits<Acc>>(values[i]);
    for (int w = 0; w < W; ++w)
      store_word(to + i * W + w, (TaggedWord(tag) << 32) | std::uint32_t(std::uint64_t(bits) >> (32 * w)));
  }
}

// Reads Count values published at `from` into `values`; whether every word carried `tag` (if not,
// some of `values` are not this call's).
template <class Acc, int Count>
KOKKOS_INLINE_FUNCTION bool read_tagged(const TaggedWord* from, std::uint32_t tag, Acc* values) {
  constexpr int W = words_per_value<Acc>;
  bool tagged = true;
  for (int i = 0; i < Count; ++i) {
    std::uint64_t bits = 0;
    for (int w = 0; w < W; ++w) {
      const TaggedWord word = load_word(from + i * W + w);
      tagged &= std::uint32_t(word >> 32) == tag;
      bits |= std::uint64_t(std::uint32_t(word)) << (32 * w);
    }
    values[i] = Kokkos::bit_cast<Acc>(value_bits<Acc>(bits));
  }
  return tagged;
}

// The earlier entries a look-back reads at once (exchange_through_look_back): up to ReadAhead,
// fewer for larger groups, whose maps would not stay in registers.
template <int D, int ReadAhead>
inline constexpr int look_back_read_ahead = std::clamp(32 / (map_size<D> + D), 1, ReadAhead);

// The exchange of the one-pass kernels' chains of windows (newton_one_pass.hpp's deltas,
// newton_one_pass_adjoint.hpp's nus), for entry `at` of one group: called by the whole team, done
// by the thread that `folds` (its lane's p = 0, which holds the entry's map `fold`). It publishes
// the map (entry 0's is read by no one), looks back to the nearest earlier entry that has published
// the state leaving it (entry 0 always does), applies the maps in between one by one from there,
// publishes its own leaving state fold(entering) and hands `entering` on (hand_on, before the
// team's barrier). Every published state is its entry's map applied to the state before it,
// wherever a look-back stopped: the result is bitwise reproducible. map_at(k) and state_at(k) point
// at entry k's words. The look-back reads the words of ReadAhead entries at once
// (look_back_read_ahead), so that it waits for one memory latency per ReadAhead entries.
template <class Acc, int D, int ReadAhead, class Member, class MapAt, class StateAt, class HandOn>
KOKKOS_INLINE_FUNCTION void exchange_through_look_back(const Member& team, bool folds, int at, int d,
                                                       std::uint32_t tag, const Acc* fold, const MapAt& map_at,
                                                       const StateAt& state_at, const HandOn& hand_on) {
  constexpr int MapSize = map_size<D>, R = look_back_read_ahead<D, ReadAhead>;
  if (folds) {
    Acc entering[D] = {}, leaving[D] = {};
    if (at > 0) {
      publish_tagged(map_at(at), fold, MapSize, tag);
      // Rounds of R entries, newest first, until one has its state. Each entry publishes its map
      // before it looks back, so the wait for either is short.
      Acc maps[R][MapSize], states[R][D];
      bool has_map[R], has_state[R];
      // Slot r's words of entry k: its state's and map's (read_entry), or its map's alone (read_map).
      auto read_entry = [&](int r, int k) {
        has_state[r] = read_tagged<Acc, D>(state_at(k), tag, states[r]);
        has_map[r] = read_tagged<Acc, MapSize>(map_at(k), tag, maps[r]);
      };
      auto read_map = [&](int r, int k) { has_map[r] = read_tagged<Acc, MapSize>(map_at(k), tag, maps[r]); };
      Acc next[D];
      auto apply_map = [&](int r) {
        map_apply<Acc, D>(d, maps[r], entering, next);
        for (int i = 0; i < d; ++i) entering[i] = next[i];
      };
      int known = -1, newest = at - 1;
      for (;; newest -= R) {
        PARASEQ_UNROLL
        for (int r = 0; r < R; ++r)
          if (newest - r >= 0) read_entry(r, newest - r);
        PARASEQ_UNROLL
        for (int r = 0; r < R; ++r)
          if (known < 0 && newest - r >= 0) {
            while (!has_state[r] && !has_map[r]) read_entry(r, newest - r);
            if (has_state[r]) {
              known = newest - r;
              for (int i = 0; i < D; ++i) entering[i] = states[r][i];
            }
          }
        if (known >= 0) break;
      }
      // The maps after the state, in order: this round's from registers, the newer rounds' again.
      PARASEQ_UNROLL
      for (int r = R - 1; r >= 0; --r)
        if (newest - r > known) apply_map(r);
      for (int first = newest + 1; first < at; first += R) {
        PARASEQ_UNROLL
        for (int r = 0; r < R; ++r)
          if (first + r < at) read_map(r, first + r);
        PARASEQ_UNROLL
        for (int r = 0; r < R; ++r)
          if (first + r < at) {
            while (!has_map[r]) read_map(r, first + r);
            apply_map(r);
          }
      }
    }
    map_apply<Acc, D>(d, fold, entering, leaving);
    publish_tagged(state_at(at), leaving, D, tag);
    hand_on(entering);
  }
  team.team_barrier();
}

// Where a fused thread keeps its chunk's inputs from one iteration to the next: in its registers
// (the fused kernels), or in team scratch ([step][input][thread], consecutive threads in
// consecutive banks), which frees Capacity x Inputs registers of a thread whose compose phase
// reads each input once per iteration (the one-pass forward: one_pass_chunk_inputs).
enum class ChunkInputs { registers, team_scratch };

// The values a thread stages in team scratch: its chunk's inputs, or none.
template <class Cell>
KOKKOS_INLINE_FUNCTION constexpr std::size_t staged_input_values(ChunkInputs inputs_at, int capacity) {
  return inputs_at == ChunkInputs::team_scratch ? std::size_t(capacity) * Cell::max_inputs_per_group : 0;
}

// Team scratch of the fused kernel, in values of Acc: a map and a boundary state per thread, the
// carry per lane ([P][lanes][map + d] + [lanes][d]), and the staged inputs of a kernel that keeps
// them there ([Capacity][Inputs][P x lanes]).
template <class Cell>
KOKKOS_INLINE_FUNCTION constexpr std::size_t fused_scratch_values(const FusedPlan& plan, ChunkInputs inputs_at,
                                                                  int capacity) {
  constexpr int D = cell_group_bound<Cell>;
  const std::size_t threads = std::size_t(plan.team_chunks) * plan.lanes;
  return threads * (map_size<D> + D + staged_input_values<Cell>(inputs_at, capacity)) + std::size_t(plan.lanes) * D;
}

// The groups per team (lanes) of the one-pass modes on devices, for teams of 256 threads. The
// windows of a chain (a batch element and a tile of groups) are joined one after another, a memory
// round trip for every window or two that a look-back walks, so the chains should be many and hold
// few windows; fewer groups per team give more chains of longer windows (P = 256 / lanes threads
// per group), but each thread then applies the maps of up to P - 1 threads before it. On the H100
// (2026-12-07, ParaGRU in float, K = 3, forward and adjoint; docs/performance.md) 16 groups were the
// fastest or within 1% at (1, 65536, 256) and (4, 2^18, 128) (forward 0.419 and 2.89 ms against
// 0.443 and 3.01 with 32), and 8 at (1, 2^20, 64), where 16 leave only 4 chains (1.79 against 2.12
// and 3.19 ms with 32; the adjoint 1.55 against 2.50 and 4.40). Hence: 32 (each step's loads in
// whole 128-byte lines) where the chains are so many that each holds at most 4 of the teams the
// device runs at once (counted as 4 teams of 256 threads per 2048 resident threads, the forward's
// when this was measured and again since 5059f5f; the adjoint runs 2), as before this rule (not
// measured against 16 there); 16 where each of its chains holds at most 64; 8 otherwise. For cells
// of one state per group (diagonal recurrences); larger groups keep 32 (not measured: their threads
// compose bigger maps, P - 1 of them per thread and window).
template <class ExecSpace>
int one_pass_team_groups(const ExecSpace& space, const ScanShape& shape) {
  const long resident_teams = std::max(1L, long(space.concurrency()) / 512);
  const auto chains = [&](int lanes) { return long(shape.batch) * ceil_div(shape.groups, lanes); };
  if (chains(32) * 4 >= resident_teams) return 32;
  return chains(16) * 64 >= resident_teams ? 16 : 8;
}

// Hosts: one thread per window, the longest chunk it holds. Devices: a warp of lanes per chunk for
// grouped cells, L = the capacity, and P threads per lane so that the teams hold about a quarter
// of the device's resident threads (at most 16, within 48 KiB of scratch). config.fused_window,
// config.fused_team_threads and config.fused_team_groups override them (fit_fused_plan checks the
// team size against the space). The one-pass modes (`windows_at_once`: a team per window, so always
// teams enough) take at most 256 threads per team (and one_pass_team_groups): two teams of 8 x 32
// threads per SM ran ParaGRU's one-pass forward 3-8% faster than one of 16 x 32 at the same
// registers (H100, 2026-12-06, gru_one_pass_threads).
// `capacity` is the kernel's chunk capacity (a kernel built with fewer steps per thread than the
// space's, as perf_tests/bench_newton.cpp measures, plans with its own), `inputs_at` where it keeps
// the chunk's inputs (team scratch counts against the 48 KiB).
template <class Cell, class Acc, class ExecSpace>
FusedPlan plan_fused(const ExecSpace& space, const ScanShape& shape, const NewtonConfig& config,
                     bool windows_at_once = false, int capacity = fused_chunk_capacity<Cell, ExecSpace>,
                     ChunkInputs inputs_at = ChunkInputs::registers) {
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  constexpr int D = cell_group_bound<Cell>;
  FusedPlan plan;
  plan.lanes = config.fused_team_groups > 0 ? config.fused_team_groups
               : on_host || Cell::structure::fixed_group_size == 0 ? 1
               : windows_at_once && Cell::structure::fixed_group_size == 1 ? one_pass_team_groups(space, shape)
                                                                           : 32;
  const long teams = long(shape.batch) * ceil_div(shape.groups, plan.lanes);
  const long per_thread =
      map_size<D> + D + (windows_at_once ? map_size<D> : 0) + long(staged_input_values<Cell>(inputs_at, capacity));
  const long by_scratch = long((48 * 1024 / sizeof(Acc) - plan.lanes * D) / (plan.lanes * per_thread));
  const long filling = std::max(1L, ceil_div(space.concurrency() / 4, std::max(1L, teams) * plan.lanes));
  if (config.fused_team_threads > 0) plan.team_chunks = config.fused_team_threads;
  else if (config.fused_window > 0 && !on_host) plan.team_chunks = int(ceil_div(config.fused_window, capacity));
  else if (!on_host) {
    const long most = windows_at_once ? std::max(1, 256 / plan.lanes) : 16L;
    plan.team_chunks = int(std::clamp(std::min(filling, by_scratch), 1L, most));
  }
  plan.chunk_length = config.fused_window > 0 ? int(ceil_div(config.fused_window, plan.team_chunks)) : capacity;
  if (plan.chunk_length > capacity)
    throw_invalid(newton_fn, "config.fused_window", std::to_string(config.fused_window) + " steps over " +
                                                        std::to_string(plan.team_chunks) + " threads",
                  "at most " + std::to_string(capacity) + " steps per thread on this space (more threads, or a shorter window)");
  plan.window = plan.team_chunks * plan.chunk_length;
  return plan;
}

// Elements (b, first + s, column) of a rank-3 View, s = 0, 1, ...: a thread's chunk addressed from
// its first step with the View's strides, instead of every load and store computing its 64-bit
// offset from three indices again (that arithmetic was about 200 of the 471 instructions a thread
// of the fused forward runs per window before its first iteration; ParaGRU, nvcc 13.0, sm_90).
// Only for steps inside the View.
template <class View>
struct ChunkRows {
  decltype(View().data()) first_row; // &view(b, first, 0)
  std::size_t step_stride, column_stride;
  KOKKOS_INLINE_FUNCTION auto& operator()(int s, int column) const {
    return first_row[s * step_stride + column * column_stride];
  }
};
template <class View>
KOKKOS_INLINE_FUNCTION ChunkRows<View> chunk_rows(const View& view, int b, int first) {
  return {&view(b, first, 0), std::size_t(view.stride(1)), std::size_t(view.stride(2))};
}

// The step (J, f - h) as the map-composition helpers of the ordered scan expect it.
template <class Acc>
struct LinearizedStep {
  const Acc* J;
  const Acc* f;
  const Acc* h;
  int d;
  KOKKOS_INLINE_FUNCTION void linear(int, int, int, const Acc* x, Acc* y) const { small_matvec(d, J, x, y, false); }
  KOKKOS_INLINE_FUNCTION void affine(int, int, int, const Acc* x, Acc* y) const {
    small_matvec(d, J, x, y, false);
    for (int i = 0; i < d; ++i) y[i] += f[i] - h[i];
  }
};

// ChunkCapacity: the steps a thread keeps on chip (the space's fused_chunk_capacity unless a
// benchmark builds the kernel with another); InputsAt: where it keeps their inputs.
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View, bool EarlyExit,
          int ChunkCapacity = fused_chunk_capacity<Cell, ExecSpace>, ChunkInputs InputsAt = ChunkInputs::registers>
struct FusedNewton {
  static constexpr int D = cell_group_bound<Cell>;
  static constexpr int Inputs = Cell::max_inputs_per_group;
  static constexpr int MapSize = map_size<D>;
  static constexpr int Capacity = ChunkCapacity;
  static constexpr bool Cached = fused_caches_linearization<Cell>;
  static constexpr bool Staged = InputsAt == ChunkInputs::team_scratch;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using scratch_view = Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  // None (fused_launch_bounds): with P = 8 threads per lane and 3 teams per SM (80 registers) the
  // fused forward took 0.694 ms at (16, 4096, 1024) against the plan's P = 5 at 96 registers,
  // 0.702 ms, and with 4 teams (64 registers) 0.759 ms (H100, 68b5ee0, 2026-12-06).
  using launch_bounds = void;

  Cell cell;
  UView u;
  HView h;
  H0View h0;
  FusedPlan plan;
  ScanShape shape;
  int iterations;
  Acc omega;
  InitialGuess guess;
  int tiles;
  double atol; // with EarlyExit (residual_atol is set) a window stops once its max |F| <= atol
  // With EarlyExit: the most iterations any window ran (atomic max; 0 on entry). Empty otherwise.
  Kokkos::View<int, typename ExecSpace::memory_space> iterations_run;

  KOKKOS_INLINE_FUNCTION std::size_t scratch_count() const {
    return fused_scratch_values<Cell>(plan, InputsAt, Capacity);
  }

  // Team scratch: the threads' maps [P][lanes][MapSize], their boundary states [P][lanes][D], the
  // lanes' carries [lanes][D] and, staged, the inputs [Capacity][Inputs][P x lanes].
  struct Scratch {
    Acc* maps;
    Acc* boundary;
    Acc* carry;  // this thread's lane
    Acc* inputs; // staged: this thread's first input; its input k of step s at (s x Inputs + k) x threads
    std::size_t threads; // the team's
  };

  // The team's scratch as `me` sees it, its lane's carry holding h0.
  KOKKOS_INLINE_FUNCTION Scratch scratch_of(const member_type& team, const FusedThread& me) const {
    return scratch_at(scratch_view(team.team_scratch(0), scratch_count()).data(), me);
  }
  // The same at `base` (scratch_count() values; a one-pass kernel's team scratch begins with them).
  KOKKOS_INLINE_FUNCTION Scratch scratch_at(Acc* base, const FusedThread& me) const {
    const std::size_t threads = std::size_t(plan.team_chunks) * plan.lanes;
    const std::size_t carries = threads * (MapSize + D);
    const Scratch shared{base, base + threads * MapSize, base + carries + me.lane * D,
                         base + carries + std::size_t(plan.lanes) * D + std::size_t(me.p) * plan.lanes + me.lane,
                         threads};
    const int d = fused_group_size<Cell>(shape);
    if (me.live && me.p == 0) load_initial<Acc>(h0, me.b, me.g * d, d, shared.carry);
    return shared;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const FusedThread me = fused_thread(team, plan, tiles, shape.groups);
    const Scratch shared = scratch_of(team, me);
    int most = 0; // the most iterations a window of this team ran (the same on every thread)
    for (int start = 0; start < shape.steps; start += plan.window)
      most = Kokkos::max(most, run_window_at(team, me, shared, start, WindowsInOrder{}));
    if constexpr (EarlyExit)
      if (team.team_rank() == 0) Kokkos::atomic_max(&iterations_run(), most);
  }

  // A window in which every thread holds a full chunk (the same decision for the whole team)
  // runs without the per-step guards, so the compiler can interleave the steps' independent work.
  template <class Chain>
  KOKKOS_INLINE_FUNCTION int run_window_at(const member_type& team, const FusedThread& me, const Scratch& shared,
                                           int start, const Chain& chain) const {
    return plan.chunk_length == Capacity && start + plan.window <= shape.steps
               ? run_window<true>(team, me, shared, start, chain)
               : run_window<false>(team, me, shared, start, chain);
  }

  // Runs one window; returns the iterations it ran (fewer than `iterations` after an early exit).
  // `chain` says what enters the window at each iteration (WindowsInOrder, or the one-pass look-back).
  template <bool Full, class Chain>
  KOKKOS_INLINE_FUNCTION int run_window(const member_type& team, const FusedThread& me, const Scratch& shared,
                                        int start, const Chain& chain) const {
    const int d = fused_group_size<Cell>(shape);
    const int lane = me.lane, p = me.p, b = me.b, g = me.g;
    auto map_of = [&](int q) { return shared.maps + (std::size_t(q) * plan.lanes + lane) * MapSize; };
    auto boundary_of = [&](int q) { return shared.boundary + (std::size_t(q) * plan.lanes + lane) * D; };
    const FusedChunk chunk = fused_chunk(plan, shape.steps, start, p);
    const int active = Full ? plan.team_chunks : chunk.active, first = chunk.first, count = Full ? Capacity : chunk.count;
    const bool working = me.live && count > 0;

    // This thread's chunk: inputs (staged: in team scratch), iterate and cached (f, J) of up to
    // Capacity steps.
    Acc in_registers[Staged ? 1 : Capacity][Inputs], x[Capacity][D];
    auto input = [&](int s, int k) -> Acc& {
      if constexpr (Staged) return shared.inputs[(std::size_t(s) * Inputs + k) * shared.threads];
      else return in_registers[s][k];
    };
    // Step s's inputs as the cell functions take them: the row in registers, or the staged ones
    // copied to `copy`.
    auto inputs_of = [&](int s, Acc* copy) -> const Acc* {
      if constexpr (Staged) {
        for (int k = 0; k < cell.inputs_per_group(); ++k) copy[k] = input(s, k);
        return copy;
      } else
        return in_registers[s];
    };
    Acc cached_f[Cached ? Capacity : 1][D], cached_J[Cached ? Capacity : 1][D * D];
    Acc entering[D]; // the iterate at the step before the chunk
    // The iterate at the chunk's last step, kept up to date by the loops over the chunk: reading
    // x[count - 1] would be a run-time index and put x in local memory.
    Acc last[D];
    auto publish_last = [&](Acc* target) {
      for (int i = 0; i < d; ++i) target[i] = last[i];
    };

    if (working) {
      // All loads first, so that they are in flight together.
      const auto inputs = chunk_rows(u, b, first);
      const auto given = chunk_rows(h, b, first);
      PARASEQ_UNROLL
      for (int s = 0; s < Capacity; ++s) {
        if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
        for (int k = 0; k < cell.inputs_per_group(); ++k) input(s, k) = Acc(inputs(s, cell.input_column(g, k)));
        if (guess == InitialGuess::given)
          for (int i = 0; i < d; ++i) x[s][i] = Acc(given(s, g * d + i));
      }
      if (guess == InitialGuess::cell_at_zero) {
        PARASEQ_UNROLL
        for (int s = 0; s < Capacity; ++s) {
          if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
          const Acc zero[D] = {};
          Acc copy[Inputs];
          repeated_step(cell, g, zero, inputs_of(s, copy), x[s]);
          for (int i = 0; i < d; ++i) last[i] = x[s][i];
        }
      } else {
        PARASEQ_UNROLL
        for (int s = 0; s < Capacity; ++s) {
          if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
          for (int i = 0; i < d; ++i) {
            if (guess == InitialGuess::zeros) x[s][i] = Acc(0);
            last[i] = x[s][i];
          }
        }
      }
      publish_last(boundary_of(p));
      if (p == active - 1) chain.publish_guess(me, last, d);
    }
    team.team_barrier();
    chain.enter_window(me, shared);

    int ran = iterations;
    for (int iteration = 0; iteration < iterations; ++iteration) {
      if (working)
        for (int i = 0; i < d; ++i) entering[i] = p == 0 ? shared.carry[i] : boundary_of(p - 1)[i];
      // Whether |F| <= atol at this thread's steps and channels (NaN is not); checked with EarlyExit.
      int within = 1;
      // Compose. The last thread's map is never used: it linearises only to fill its cache, or to
      // check its residual.
      if (working && (Cached || p < active - 1 || EarlyExit || Chain::needs_window_map)) {
        Acc map[MapSize];
        map_identity<Acc, D>(d, map);
        PARASEQ_UNROLL
        for (int s = 0; s < Capacity; ++s) {
          if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
          Acc f[D], J[D * D], copy[Inputs];
          repeated_linearize(cell, g, s == 0 ? entering : x[s - 1], inputs_of(s, copy), f, J);
          map_push_step<Acc, D>(LinearizedStep<Acc>{J, f, x[s], d}, 0, 0, 0, d, map);
          if constexpr (EarlyExit)
            for (int i = 0; i < d; ++i) within &= int(double(Kokkos::fabs(f[i] - x[s][i])) <= atol);
          if constexpr (Cached) {
            for (int i = 0; i < d; ++i) cached_f[s][i] = f[i];
            for (int i = 0; i < d * d; ++i) cached_J[s][i] = J[i];
          }
        }
        if (p < active - 1 || Chain::needs_window_map)
          for (int k = 0; k < MapSize; ++k) map_of(p)[k] = map[k];
      }
      team.team_barrier();
      // Early exit: the iterate is final when the whole window is within atol. The scratch this
      // iteration read is not written again before the next window's first barrier.
      if constexpr (EarlyExit) {
        team.team_reduce(Kokkos::Min<int, ExecSpace>(within));
        if (within) {
          ran = iteration;
          break;
        }
      }
      // Re-run: delta enters the window (chain) and thread p through the maps of threads 0 .. p-1.
      Acc delta[D], next[D], previous[D];
      chain.enter_delta(team, me, map_of, active, iteration, d, delta);
      Acc entered[D]; // the delta entering the window
      for (int i = 0; i < d; ++i) entered[i] = delta[i];
      if (working) {
        for (int q = 0; q < p; ++q) {
          map_apply<Acc, D>(d, map_of(q), delta, next);
          for (int i = 0; i < d; ++i) delta[i] = next[i];
        }
        for (int i = 0; i < d; ++i) previous[i] = entering[i];
        PARASEQ_UNROLL
        for (int s = 0; s < Capacity; ++s) {
          if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
          Acc f[D], J[D * D];
          if constexpr (Cached) {
            for (int i = 0; i < d; ++i) f[i] = cached_f[s][i];
            for (int i = 0; i < d * d; ++i) J[i] = cached_J[s][i];
          } else {
            Acc copy[Inputs];
            repeated_linearize(cell, g, previous, inputs_of(s, copy), f, J); // the compose phase's arguments
          }
          small_matvec(d, J, delta, next, false);
          for (int i = 0; i < d; ++i) {
            delta[i] = next[i] + f[i] - x[s][i];
            previous[i] = x[s][i];
            x[s][i] += omega * delta[i];
            last[i] = x[s][i];
          }
        }
        // The state before the window after this update, as the previous window's re-run moved it
        // (set here, after the re-run, rather than where the delta enters: 19 registers fewer).
        if constexpr (Chain::carries_iterate)
          if (p == 0)
            for (int i = 0; i < d; ++i) shared.carry[i] = entering[i] + omega * entered[i];
      }
      // Publish the new last states for the next iteration; after the last one, only the carry
      // (thread 0 read it before this iteration's barrier, and reads it again after the next
      // window's first barrier).
      if (iteration + 1 < iterations) {
        if (working) publish_last(boundary_of(p));
        team.team_barrier();
      }
    }

    if (working) {
      const auto out = chunk_rows(h, b, first);
      PARASEQ_UNROLL
      for (int s = 0; s < Capacity; ++s) {
        if (!Full && s >= count) continue; // unrolled: a guard, not a loop exit
        for (int i = 0; i < d; ++i) out(s, g * d + i) = typename HView::value_type(x[s][i]);
      }
      if (p == active - 1) chain.finish_window(me, shared, last, d);
    }
    return ran;
  }
};

// The team scratch a fused kernel (this forward, or the adjoint of newton_fused_adjoint.hpp) asks for.
template <class Acc, class ExecSpace, class Functor>
std::size_t fused_scratch_bytes(const Functor& functor) {
  return Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space>::shmem_size(functor.scratch_count());
}

// The launch bounds a fused kernel is compiled with: its functor's `launch_bounds`, void (none) or a
// Kokkos::LaunchBounds (threads per team, teams per SM), which caps its registers (the one-pass
// forward's: one_pass_launch_bounds).
template <class Functor>
using fused_launch_bounds = typename Functor::launch_bounds;

// Fits a plan to the team size limit that a fused kernel's registers and scratch allow (`probe` is
// the kernel built for the plan): a planned thread count above it shrinks; one the config asked
// for is an error.
template <class Acc, class ExecSpace, class Functor>
FusedPlan fit_fused_plan(const ExecSpace& space, FusedPlan plan, int league, const NewtonConfig& config,
                         const Functor& probe) {
  const int team_max = team_policy<ExecSpace, fused_launch_bounds<Functor>>(
                           space, league, 1, fused_scratch_bytes<Acc, ExecSpace>(probe))
                           .team_size_max(probe, Kokkos::ParallelForTag{});
  if (plan.team_chunks * plan.lanes <= team_max) return plan;
  const char* asked = config.fused_team_threads > 0 ? "config.fused_team_threads"
                      : config.fused_window > 0     ? "config.fused_window"
                      : plan.lanes > team_max       ? "config.fused_team_groups"
                                                    : nullptr;
  if (asked)
    throw_invalid(newton_fn, asked,
                  std::to_string(plan.team_chunks) + " threads per lane x " + std::to_string(plan.lanes) +
                      " lanes (window of " + std::to_string(plan.window) + " steps)",
                  "at most " + std::to_string(team_max) + " threads per team on this space with this scratch");
  plan.team_chunks = std::max(1, team_max / plan.lanes);
  plan.window = plan.team_chunks * plan.chunk_length;
  return plan;
}

// Runs a fused kernel with one team per (batch element, tile) and the team its plan asks for.
template <class Acc, class ExecSpace, class Functor>
void launch_fused(const char* label, const ExecSpace& space, int league, const Functor& functor) {
  Kokkos::parallel_for(label,
                       team_policy<ExecSpace, fused_launch_bounds<Functor>>(
                           space, league, functor.plan.team_chunks * functor.plan.lanes,
                           fused_scratch_bytes<Acc, ExecSpace>(functor)),
                       functor);
}

// Runs the fused mode. With config.residual_atol, returns a device scalar that holds the most
// iterations any window ran once the kernel is done (read it with read_count_on_host); without, an
// empty View: every window runs config.max_iters.
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
Kokkos::View<int, typename ExecSpace::memory_space> fused_newton(const ExecSpace& space, const Cell& cell,
                                                                 const UView& u, const HView& h, const H0View& h0,
                                                                 const NewtonConfig& config, const ScanShape& shape) {
  Kokkos::View<int, typename ExecSpace::memory_space> iterations_run;
  if (config.residual_atol)
    iterations_run = detail::zeroed_workspace_view<decltype(iterations_run)>(space, "paraseq::newton_fused_iterations");
  if (shape.batch == 0 || shape.steps == 0 || shape.groups == 0) return iterations_run;
  FusedPlan plan = plan_fused<Cell, Acc>(space, shape, config);
  const int tiles = int(ceil_div(shape.groups, plan.lanes)), league = shape.batch * tiles;
  auto run = [&]<bool EarlyExit>() {
    auto functor_for = [&](const FusedPlan& chosen) {
      return FusedNewton<Acc, ExecSpace, Cell, UView, HView, H0View, EarlyExit>{
          cell, u, h, h0, chosen, shape, config.max_iters, Acc(config.omega), config.initial_guess, tiles,
          config.residual_atol.value_or(0), iterations_run};
    };
    plan = fit_fused_plan<Acc>(space, plan, league, config, functor_for(plan));
    launch_fused<Acc>("paraseq::newton_fused", space, league, functor_for(plan));
  };
  if (config.residual_atol) run.template operator()<true>();
  else run.template operator()<false>();
  return iterations_run;
}

} // namespace paraseq::detail

