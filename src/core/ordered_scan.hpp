#pragma once
// The ordered scan engine. It solves, for every batch element b and group g,
//
//     x_s = L_s x_{s-1} + c_s,   s = 0 .. S-1,   x_{-1} given,
//
// where the affine maps (L_s, c_s) come from a Recurrence object (see below) and are composed in
// order. Affine maps compose associatively but not commutatively, so Kokkos::parallel_scan, whose
// join order is unspecified, cannot be used; this engine fixes the order itself.
//
// Work decomposition, from the outside in:
//   * time chunks: [0, S) is cut into G chunks that run in different teams, only when B x groups is
//     too small to fill the execution space (G > 1). Two ways to find the state entering each chunk:
//       two passes (hosts): a first kernel composes each chunk into one map, a second applies the
//         maps in chunk order, and the main kernel re-runs the chunks: the operands are read twice.
//       one pass (devices): a chunk is one window, held on chip. Its team composes it, publishes
//         the chunk's map, finds the state entering it from the chunks before (a two-level
//         look-back through published maps and states, ChainedTag) and re-runs it: the operands
//         are read once.
//   * windows: a team walks its chunk in windows of P x L steps. Its P sub-chunk threads each compose
//     L steps into a map (kept in team scratch), an ordered scan of those maps (log2 P rounds) gives
//     each the composition of the sub-chunks before it, and each re-runs its steps from the window's
//     entering state through that composition.
//   * rows: a thread handles a row of adjacent groups: one on a GPU, where the threads of a warp take
//     adjacent groups and so read consecutive channels of one step (coalesced); 32 on a CPU, where a
//     thread walks cache lines.
//   * step batches (devices, groups of a fixed size): a thread loads the maps of R steps before it
//     uses any of them, so R steps' loads are in flight together (a GPU thread that loads one step
//     at a time waits on memory latency, far below the bandwidth). When a sub-chunk fits in one
//     batch (the device plans' L = R), its maps stay in registers from the compose to the re-run,
//     or in team scratch where the one-pass kernel stages its window, so each operand is read once.
//     Hosts and Dense groups apply each step directly (see batch_steps).
// With P = 1 and G = 1 this is the plain sequential-in-time loop, chosen when B x groups alone fills
// the space: it reads the operands once and does no redundant work.
//
// A Recurrence provides, for batch b, step s and group g (pointers hold the group's d values):
//   KOKKOS_FUNCTION void initial(int b, int g, Acc* x) const;                  // x_{-1}
//   KOKKOS_FUNCTION void affine(int b, int s, int g, const Acc* x, Acc* y) const; // y = L_s x + c_s
//   KOKKOS_FUNCTION void linear(int b, int s, int g, const Acc* x, Acc* y) const; // y = L_s x
//   KOKKOS_FUNCTION void store(int b, int s, int g, const Acc* y) const;       // receives x_s
// and optionally, where one evaluation gives the whole map (a linearisation gives L_s and c_s at
// once), the map itself as the engine stores it (see map_size), so that loading a step evaluates
// it once rather than d + 1 times:
//   template <int D> KOKKOS_FUNCTION void step_map(int b, int s, int g, Acc* map) const;
// Materialised Views are one implementation (linear_scan.hpp); solvers build (L_s, c_s) on the fly.

#include <paraseq/core/structure.hpp>
#include <paraseq/core/team_policy.hpp>
#include <paraseq/core/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

// Per-thread arrays stay in registers only if every loop over them is unrolled.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define PARASEQ_UNROLL _Pragma("unroll")
#else
#define PARASEQ_UNROLL
#endif

namespace paraseq {

// How time chunks find their entering states (see the top of this file).
enum class TimeSplit {
  automatic,  // two passes here; the Newton solver's scans ask for one pass on devices (newton_kernels.hpp)
  two_pass,   // chunk maps, then the states entering the chunks, then the re-run
  single_pass // where the plan splits time (G > 1): chunks of one window (P x L steps), chained by a look-back
};

// Decomposition overrides; 0 means "choose from the execution space and the shape".
struct ScanConfig {
  int team_chunks = 0;  // P: sub-chunks (threads) per team window; 1 = sequential inside a team
  int chunk_length = 0; // Lsub: steps per sub-chunk
  int time_chunks = 0;  // G: independent time chunks across teams; 1 = no chunk summaries
  TimeSplit time_split = TimeSplit::automatic;
};

// Forces the plain sequential-in-time loop (one pass, no composition).
inline constexpr ScanConfig sequential_scan_config{1, 0, 1};

struct ScanShape {
  int batch = 0;      // B
  int steps = 0;      // S
  int groups = 0;     // independent groups per batch element
  int group_size = 0; // d, channels per group
};

// The decomposition a scan will run with; plan_scan() derives it and tests and benchmarks read it.
struct ScanPlan {
  int team_chunks = 1;   // P
  int chunk_length = 1;  // Lsub
  int time_chunks = 1;   // G
  int chunk_steps = 0;   // steps per time chunk (the last may be shorter)
  bool single_pass = false; // chunks of one window, chained by a look-back
  int lanes = 1;         // groups per team
  int team_size = 1;     // threads per team: P x lanes / lanes_per_thread
};

namespace detail {

// An affine map y = M x + v over d <= D values, stored as [M column-major, stride D | v].
template <int D>
inline constexpr int map_size = D * D + D;

template <class Acc, int D>
KOKKOS_INLINE_FUNCTION void map_identity(int d, Acc* map) {
  for (int j = 0; j < d; ++j)
    for (int i = 0; i < d; ++i) map[j * D + i] = Acc(i == j);
  for (int i = 0; i < d; ++i) map[D * D + i] = Acc(0);
}

template <class Acc, int D>
KOKKOS_INLINE_FUNCTION void map_apply(int d, const Acc* map, const Acc* x, Acc* y) {
  for (int i = 0; i < d; ++i) y[i] = map[D * D + i];
  for (int j = 0; j < d; ++j)
    for (int i = 0; i < d; ++i) y[i] += map[j * D + i] * x[j];
}

// map <- (L_s, c_s) o map: every column of M goes through L_s, v through the whole step.
template <class Acc, int D, class Recurrence>
KOKKOS_INLINE_FUNCTION void map_push_step(const Recurrence& rec, int batch, int step, int group, int d,
                                          Acc* map) {
  Acc column[D];
  for (int j = 0; j < d; ++j) {
    rec.linear(batch, step, group, map + j * D, column);
    for (int i = 0; i < d; ++i) map[j * D + i] = column[i];
  }
  rec.affine(batch, step, group, map + D * D, column);
  for (int i = 0; i < d; ++i) map[D * D + i] = column[i];
}

// The map (L_s, c_s) of step s: the recurrence's own step_map, or column j is L_s e_j and the
// offset is the step applied to 0.
template <class Acc, int D, class Recurrence>
KOKKOS_INLINE_FUNCTION void load_step_map(const Recurrence& rec, int batch, int step, int group, int d, Acc* map) {
  if constexpr (requires { rec.template step_map<D>(batch, step, group, map); }) {
    rec.template step_map<D>(batch, step, group, map);
  } else {
    Acc unit[D];
    for (int j = 0; j < d; ++j) {
      for (int i = 0; i < d; ++i) unit[i] = Acc(i == j);
      rec.linear(batch, step, group, unit, map + j * D);
    }
    for (int i = 0; i < d; ++i) unit[i] = Acc(0);
    rec.affine(batch, step, group, unit, map + D * D);
  }
}

// outer <- later o outer, i.e. (M_l M_o, M_l v_o + v_l).
template <class Acc, int D>
KOKKOS_INLINE_FUNCTION void map_prepend(int d, const Acc* later, Acc* outer) {
  Acc column[D];
  for (int j = 0; j <= d; ++j) { // j == d is the offset vector, which gets the translation too
    Acc* target = j < d ? outer + j * D : outer + D * D;
    for (int i = 0; i < d; ++i) {
      Acc sum = j < d ? Acc(0) : later[D * D + i];
      for (int k = 0; k < d; ++k) sum += later[k * D + i] * target[k];
      column[i] = sum;
    }
    for (int i = 0; i < d; ++i) target[i] = column[i];
  }
}

inline int round_up_pow2(long n) {
  int p = 1;
  while (p < n && p < (1 << 30)) p *= 2;
  return p;
}

} // namespace detail

template <class ExecSpace>
inline constexpr bool runs_on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;

// Groups one thread handles: on a GPU one (the threads of a warp take adjacent groups); on a CPU a
// thread sweeps a row of adjacent groups per time step, so it reads contiguous memory and the
// compiler can vectorise across groups.
template <class Structure, class ExecSpace>
inline constexpr int lanes_per_thread = runs_on_host<ExecSpace> && Structure::fixed_group_size > 0 ? 32 : 1;

// Steps per batch (see the top of this file); 0 applies each step directly. Devices: 16 for
// diagonal scans, about 48 values of maps for blocks (8 steps of 2 x 2, 4 of 3 x 3, 2 of 4 x 4).
// Hosts apply directly: a thread's row of 32 groups per step is a contiguous stream that the
// prefetcher already keeps ahead, and staging it through a batch ran 2-8x slower on the 2-core
// machine. Dense applies directly everywhere.
template <class Structure, class ExecSpace>
inline constexpr int batch_steps = Structure::fixed_group_size == 0 || runs_on_host<ExecSpace>
                                       ? 0
                                       : std::clamp(48 / detail::map_size<Structure::max_group_size>, 1, 16);

namespace detail {

// Devices with few groups per team (lanes < 8, L <= Batch): the threads of a warp are mostly
// sub-chunks, whose steps lie L apart in memory, so one load or store instruction of a thread's own
// steps would touch up to 32 memory sectors. The one-pass kernel then moves a window through team
// scratch step by step (consecutive threads take consecutive groups, then steps: contiguous memory).
template <class Structure, class ExecSpace>
KOKKOS_INLINE_FUNCTION constexpr bool stages_windows(const ScanPlan& plan) {
  constexpr int batch = batch_steps<Structure, ExecSpace>;
  return batch > 0 && plan.lanes < 8 && plan.chunk_length <= batch;
}

// Where windows are staged, the window's step maps and, after them, its states, each with one value
// of padding every 16 entries (bank conflicts; staged_offset). The states' area first holds the
// published maps that the look-back applies (a map per sub-chunk and lane at a time), so it is at
// least that large.
template <class Structure>
KOKKOS_INLINE_FUNCTION constexpr std::size_t staged_maps_count(const ScanPlan& plan) {
  const std::size_t maps = std::size_t(plan.team_chunks) * plan.lanes * plan.chunk_length;
  return maps * map_size<Structure::max_group_size> + maps / 16 + 1;
}
template <class Structure>
KOKKOS_INLINE_FUNCTION constexpr std::size_t staged_states_count(const ScanPlan& plan) {
  constexpr int D = Structure::max_group_size;
  const std::size_t states = std::size_t(plan.team_chunks) * plan.lanes * plan.chunk_length;
  const std::size_t published = std::size_t(plan.team_chunks) * plan.lanes;
  return Kokkos::max(states * D + states / 16, published * map_size<D> + published / 16) + 1;
}

// Team scratch of a window, in values: the sub-chunk maps ([P][lanes] maps), the carries
// ([2][lanes][D]) and, where windows are staged, the window's maps and states.
template <class Structure, class ExecSpace>
KOKKOS_INLINE_FUNCTION constexpr std::size_t window_scratch_count(const ScanPlan& plan) {
  constexpr int D = Structure::max_group_size;
  const std::size_t sub_chunk_maps = std::size_t(plan.team_chunks) * plan.lanes;
  return sub_chunk_maps * map_size<D> + 2 * std::size_t(plan.lanes) * D +
         (stages_windows<Structure, ExecSpace>(plan) ? staged_maps_count<Structure>(plan) + staged_states_count<Structure>(plan)
                                                     : 0);
}

} // namespace detail

// Chooses the decomposition from a cost model. Composing a step into a map costs about d + 1 times
// a plain step (d columns and the offset go through L_s), so splitting time only pays where the
// extra work is spread over otherwise idle threads. Host spaces run one thread per team; device
// spaces a warp of lanes and up to 16 sub-chunks per team, limited by team scratch.
template <class Structure, class Acc, class ExecSpace>
ScanPlan plan_scan(const ExecSpace& space, const ScanShape& shape, const ScanConfig& config = {}) {
  static_assert(is_structure_v<Structure>, "paraseq::plan_scan: Structure must be Diagonal, BlockDiagonal<K>, Dense or DenseUpTo<N>");
  constexpr int D = Structure::max_group_size;
  constexpr bool on_host = runs_on_host<ExecSpace>;
  constexpr bool grouped = Structure::fixed_group_size > 0;
  const double concurrency = std::max(1, space.concurrency());
  const double compose_cost = shape.group_size + 1;

  ScanPlan plan;
  // On a device, a state of few groups gets a narrower team so its idle lanes become sub-chunks.
  plan.lanes = !grouped ? 1 : on_host ? 32 : std::min(32, detail::round_up_pow2(std::max(1, shape.groups)));
  const int row_threads = plan.lanes / lanes_per_thread<Structure, ExecSpace>;
  const long teams = long(shape.batch) * detail::ceil_div(shape.groups, plan.lanes);
  const double threads_per_team = row_threads; // before sub-chunks

  constexpr int batch = batch_steps<Structure, ExecSpace>;
  plan.chunk_length = config.chunk_length > 0 ? config.chunk_length : on_host ? 256 : batch > 0 ? batch : 32;
  if (config.team_chunks > 0) plan.team_chunks = config.team_chunks;
  else if (on_host) plan.team_chunks = 1;
  else {
    // Sub-chunks make each step cost compose + apply (compose_cost + 1 plain steps) in exchange for
    // P times the threads. A device's loads stop gaining from more threads at about a quarter of
    // its resident threads (H200: the one-step-per-thread plan over 2^16 channels ran 1.9x faster
    // than 8 sub-chunks, while 2^14 channels gained from them; docs/performance.md), so
    // sub-chunks pay only while the threads without them are fewer than that saturation divided
    // by the extra work. Teams whose windows are staged grow to 256 threads (the tiles of the
    // prototype measured on the H200, docs/performance.md); the scan of the sub-chunk maps takes
    // log2 P rounds.
    const double saturation = concurrency / 4;
    const double threads = std::max(1.0, teams * threads_per_team);
    const std::size_t map_bytes = sizeof(Acc) * detail::map_size<D> * plan.lanes;
    const long by_scratch = long(std::max<std::size_t>(1, (32 * 1024) / map_bytes));
    const long by_fill = threads * (compose_cost + 1) < saturation ? detail::round_up_pow2(long(saturation / threads)) : 1;
    const long team_cap = plan.lanes >= 32 ? 16 : detail::stages_windows<Structure, ExecSpace>(plan) ? 256 / plan.lanes : 32;
    plan.team_chunks = int(std::max(1L, std::min({team_cap, by_scratch, by_fill})));
    while (plan.team_chunks & (plan.team_chunks - 1)) --plan.team_chunks; // a power of two
  }
  plan.team_size = plan.team_chunks * row_threads;

  // Predicted time of G time chunks, in plain steps per thread: summaries of G-1 chunks, then all G.
  const double steps = std::max(1, shape.steps);
  const double team_threads = threads_per_team * plan.team_chunks;
  // Threads beyond `useful` no longer shorten a pass: a host's cores, or on a device the quarter of its
  // resident threads at which loads saturate memory (H200: the one-pass plan over 2^16 channels
  // moved 98% of the copy bandwidth with 2^16 threads, and four time chunks took 2.3x as long).
  const double useful = on_host ? concurrency : concurrency / 4;
  auto predicted = [&](long G) {
    const double busy_summary = std::min(useful, teams * (G - 1) * team_threads);
    const double busy_apply = std::min(useful, teams * G * team_threads);
    const double total_threads = teams * team_threads;
    const double summary = G > 1 ? total_threads * steps * (G - 1) / G * compose_cost / busy_summary : 0;
    return summary + total_threads * steps / busy_apply;
  };
  if (config.time_chunks > 0) plan.time_chunks = config.time_chunks;
  else {
    // A chunk shorter than a few windows costs more in launches and summaries than it gains.
    const long min_chunk = on_host ? 4096 : 4L * plan.team_chunks * plan.chunk_length;
    const long max_chunks = std::max(1L, long(steps) / min_chunk);
    long best = 1;
    for (long G = 2; G <= max_chunks && G <= 4096; G *= 2)
      if (predicted(G) < 0.8 * predicted(best)) best = G;
    plan.time_chunks = int(best);
  }
  plan.time_chunks = int(std::clamp<long>(plan.time_chunks, 1, std::max(1, shape.steps)));
  // One pass only where time is split; its chunks are windows, so G follows from P x L. Asked for,
  // or on devices by default where windows are staged through team scratch (fewer than 8 groups per
  // team): there a window's operands are read once, coalesced, and its states are stored coalesced.
  // With more groups per team, two passes unless asked: on the H200 the one pass pays where a
  // step's map is computed (Newton's linearisations: the second pass computes them again) and not
  // where it is read (the look-back costs more than the second read); docs/performance.md.
  const bool one_pass = config.time_split == TimeSplit::single_pass ||
                        (config.time_split == TimeSplit::automatic && !on_host && detail::stages_windows<Structure, ExecSpace>(plan));
  plan.single_pass = one_pass && plan.time_chunks > 1;
  plan.chunk_steps = plan.single_pass ? plan.team_chunks * plan.chunk_length
                                      : int(detail::ceil_div(std::max(1, shape.steps), plan.time_chunks));
  plan.time_chunks = int(detail::ceil_div(std::max(1, shape.steps), plan.chunk_steps)); // no empty chunk
  return plan;
}

namespace detail {

// How the one-pass scan's teams hand values to each other: each thread that writes values fences,
// the team meets at a barrier and one thread stores the status that announces them; a reader polls
// the status with volatile loads (so that a GPU polls L2 rather than a stale L1 line), meets its
// team at a barrier, and every thread fences before it reads. (The one-pass Newton kernels' values
// carry their own tags instead: newton_fused.hpp's TaggedWord.)

// The order in which one-pass teams start (OrderedScan's ChainedTag, the one-pass Newton kernels):
// the team's first thread draws the next ticket from counter(0) (zeroed before the launch) and
// hands it to the team, so every entry a team waits for belongs to a team that started before it.
template <class Member, class CounterView>
KOKKOS_INLINE_FUNCTION int take_ticket(const Member& team, const CounterView& counter) {
  int ticket = 0;
  if (team.team_rank() == 0) ticket = Kokkos::atomic_fetch_add(&counter(0), 1);
  team.team_broadcast(ticket, 0);
  return ticket;
}

// Polls `status` until it is not 0; returns what it became.
KOKKOS_INLINE_FUNCTION int wait_for_status(const int* status) {
  const volatile int* polled = status;
  int seen;
  while ((seen = *polled) == 0) {
  }
  return seen;
}

// The decoupled look-back of the one-pass scan (OrderedScan's ChainedTag): entries 0, 1, ...
// (chunks or segments) publish a status, 0 nothing yet, 1 their
// map, 2 the state leaving them. Returns the nearest entry at or before `newest` with status 2, or
// -1 if there is none. The team polls `width` entries at a time, a thread each, until each has
// published at least its map; called by the whole team. status_at(k) is entry k's status.
template <class Member, class StatusAt>
KOKKOS_FUNCTION int look_back_to_state(const Member& team, int newest, const StatusAt& status_at) {
  const int width = Kokkos::min(team.team_size(), 32);
  int known = -1;
  for (; known < 0 && newest >= 0; newest -= width) {
    int found = -1;
    const int polled = newest - team.team_rank();
    if (team.team_rank() < width && polled >= 0 && wait_for_status(status_at(polled)) == 2) found = polled;
    team.team_reduce(Kokkos::Max<int>(found));
    known = found;
  }
  Kokkos::memory_fence(); // what the statuses announce is read after them
  return known;
}

// Values another team published (volatile: read from memory, not from a stale cache line).
template <class Acc>
KOKKOS_FUNCTION void read_published_values(const Acc* from, int count, Acc* to) {
  const volatile Acc* source = from;
  for (int i = 0; i < count; ++i) to[i] = source[i];
}

// The kernels of an OrderedScan, by work tag.
struct SummarizeTag {}; // two passes: compose each chunk into its map
struct CarryTag {};     // two passes: apply the chunk maps in order
struct ApplyTag {};     // re-run the chunks from their entering states
struct ChainedTag {};   // one pass: compose, look back and re-run
struct StagedChainedTag {}; // the same for staged windows alone (OrderedScan::has_staged_kernel)

// One team kernel of an OrderedScan: its launch and the team size its registers and scratch allow.
// Defined out of line (not inline) so that a compiled instance can hold each kernel in a
// translation unit of its own and declare it `extern template` (cmake/paraseqInstances.cmake):
// querying a kernel's team size compiles the kernel, so without this every unit that plans a scan
// would compile all of them.
template <class Scan, class Tag>
struct ScanKernel {
  using space_type = typename Scan::execution_space;
  static void launch(const space_type& space, const Scan& scan, const char* label, std::size_t league, int team_size,
                     std::size_t scratch_bytes);
  static int team_size_max(const space_type& space, const Scan& scan, std::size_t scratch_bytes);
};

template <class Structure, class Acc, class ExecSpace, class Recurrence>
class OrderedScan {
  static constexpr int D = Structure::max_group_size;
  static constexpr int MapSize = map_size<D>;
  static constexpr int Rows = lanes_per_thread<Structure, ExecSpace>;
  static constexpr int Batch = batch_steps<Structure, ExecSpace>;
  // One pass: consecutive chunks form segments of this many (the two-level look-back, ChainedTag).
  static constexpr int SegmentChunks = 8;
  // Published maps read at once by one thread, so that their loads overlap: up to 8, fewer for
  // larger maps (a Dense map has up to 1056 values, and a thread's arrays beyond its registers go
  // to local memory, which CUDA reserves for every thread the GPU can hold).
  static constexpr int ReadAhead = std::clamp(32 / MapSize, 1, 8);
  // A batch of step maps for a thread's row: [step][row][map].
  using StepMaps = Acc[Batch > 0 ? Batch : 1][Rows][MapSize];
  // Recurrences whose step maps are read from memory (no step_map: linear_scan's Views) run staged
  // windows in a one-pass kernel of their own, StagedChainedTag, free of the per-thread step
  // batches: a diagonal float scan's needs 64 registers there against 106 in the kernel with both
  // paths (nvcc 13.0, sm_90), so an SM holds twice the teams. Recurrences that compute their maps (the Newton scans) keep a single
  // one-pass kernel, which holds their compile time down.
  static constexpr bool has_staged_kernel =
      Batch > 0 && !requires(const Recurrence& rec, Acc* map) { rec.template step_map<D>(0, 0, 0, map); };

public:
  using execution_space = ExecSpace;
  using buffer_view = Kokkos::View<Acc*, typename ExecSpace::memory_space>;
  using status_view = Kokkos::View<int*, typename ExecSpace::memory_space>;
  using scratch_view = Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  template <class Tag>
  using member_type = typename Kokkos::TeamPolicy<ExecSpace, Tag>::member_type;

  OrderedScan(const ScanShape& shape, const ScanPlan& plan, const Recurrence& rec)
      : shape_(shape), plan_(plan), rec_(rec), d_(shape.group_size),
        tiles_(int(ceil_div(shape.groups, plan.lanes))) {}

  // `team_chunks_requested`: P came from ScanConfig, so a P that does not fit is an error rather
  // than something to shrink.
  void run(const ExecSpace& space, bool team_chunks_requested) {
    if (shape_.batch == 0 || shape_.steps == 0 || shape_.groups == 0) return;
    fit_team_size(space, team_chunks_requested);
    const int G = plan_.time_chunks;
    const std::size_t per_chunk = std::size_t(shape_.batch) * shape_.groups;
    auto buffer = [&](const std::string& label, std::size_t count) {
      return detail::workspace_view<buffer_view>(space, label, count);
    };
    if (plan_.single_pass) {
      const int segments = int(ceil_div(G, SegmentChunks));
      chunk_maps_ = buffer("paraseq::chunk_maps", per_chunk * G * MapSize);
      segment_maps_ = buffer("paraseq::segment_maps", per_chunk * segments * MapSize);
      carries_ = buffer("paraseq::segment_states", per_chunk * segments * D);
      status_ = detail::zeroed_workspace_view<status_view>(space, "paraseq::chunk_status",
                                                           1 + std::size_t(G + segments) * shape_.batch * tiles_);
      const std::size_t league = std::size_t(shape_.batch) * tiles_ * G;
      if constexpr (has_staged_kernel)
        if (staged()) {
          launch<StagedChainedTag>(space, "paraseq::scan_single_pass_staged", league, apply_scratch_bytes());
          return;
        }
      launch<ChainedTag>(space, "paraseq::scan_single_pass", league, apply_scratch_bytes());
      return;
    }
    if (G > 1) {
      chunk_maps_ = buffer("paraseq::chunk_maps", per_chunk * (G - 1) * MapSize);
      carries_ = buffer("paraseq::chunk_carries", per_chunk * G * D);
      launch<SummarizeTag>(space, "paraseq::scan_summarize", std::size_t(shape_.batch) * tiles_ * (G - 1),
                           summarize_scratch_bytes());
      Kokkos::parallel_for("paraseq::scan_carries",
                           Kokkos::RangePolicy<ExecSpace, CarryTag>(space, 0, std::size_t(shape_.batch) * shape_.groups),
                           *this);
    }
    launch<ApplyTag>(space, "paraseq::scan_apply", std::size_t(shape_.batch) * tiles_ * G, apply_scratch_bytes());
  }

  // Phase 1 (G > 1): thread p composes an equal slice of the chunk, then the maps are composed in
  // order into the chunk's map.
  KOKKOS_FUNCTION void operator()(SummarizeTag, const member_type<SummarizeTag>& team) const {
    const int chunks = plan_.time_chunks - 1;
    const int chunk = team.league_rank() % chunks;
    const int tile = (team.league_rank() / chunks) % tiles_;
    const int batch = team.league_rank() / chunks / tiles_;
    const int P = plan_.team_chunks, slice = int(ceil_div(plan_.chunk_steps, P));
    const Thread me = thread_of(team, tile);
    scratch_view scratch(team.team_scratch(0), summarize_scratch_count());
    Acc* const maps = scratch.data(); // [P][lanes][MapSize]

    // Chunks before the last are full: chunk_steps steps each.
    const int first = chunk * plan_.chunk_steps + me.p * slice;
    StepMaps cached;
    compose_steps(me, batch, tile, first, Kokkos::max(0, Kokkos::min(slice, plan_.chunk_steps - me.p * slice)), false,
                  cached, maps);
    team.team_barrier();
    scan_sub_chunks(team, me, maps);
    if (me.p == 0)
      for (int r = 0; r < me.rows; ++r) {
        const int lane = me.first_lane + r;
        window_map(maps, lane, P, chunk_maps_.data() + chunk_map_offset(batch, chunk, group_of(tile, lane)));
      }
  }

  // Phase 2 (G > 1): the state entering each chunk, in chunk order, per (batch, group).
  KOKKOS_FUNCTION void operator()(CarryTag, std::size_t index) const {
    const int batch = int(index / shape_.groups), group = int(index % shape_.groups);
    Acc x[D], y[D];
    rec_.initial(batch, group, x);
    for (int chunk = 0;; ++chunk) {
      Acc* carry = carries_.data() + carry_offset(batch, chunk, group);
      for (int i = 0; i < dim(); ++i) carry[i] = x[i];
      if (chunk + 1 == plan_.time_chunks) break;
      map_apply<Acc, D>(dim(), chunk_maps_.data() + chunk_map_offset(batch, chunk, group), x, y);
      for (int i = 0; i < dim(); ++i) x[i] = y[i];
    }
  }

  // Phase 3: walk the chunk in windows; within a window, each sub-chunk enters through the scanned
  // maps of the ones before it.
  KOKKOS_FUNCTION void operator()(ApplyTag, const member_type<ApplyTag>& team) const {
    const int G = plan_.time_chunks;
    const int chunk = team.league_rank() % G;
    const int tile = (team.league_rank() / G) % tiles_;
    const int batch = team.league_rank() / G / tiles_;
    const int begin = chunk * plan_.chunk_steps, end = Kokkos::min(shape_.steps, begin + plan_.chunk_steps);
    const int P = plan_.team_chunks, L = plan_.chunk_length, lanes = plan_.lanes;
    const Thread me = thread_of(team, tile);
    scratch_view scratch(team.team_scratch(0), window_scratch_count<Structure, ExecSpace>(plan_));
    Acc* const maps = scratch.data();                             // [P][lanes][MapSize]
    Acc* const carries = maps + std::size_t(P) * lanes * MapSize; // [2][lanes][D]
    auto carry_at = [&](int which, int lane) { return carries + (std::size_t(which) * lanes + lane) * D; };

    if (me.p == 0)
      for (int r = 0; r < me.rows; ++r) {
        const int lane = me.first_lane + r;
        if (G == 1) rec_.initial(batch, group_of(tile, lane), carry_at(0, lane));
        else
          for (int i = 0; i < dim(); ++i) carry_at(0, lane)[i] = carries_(carry_offset(batch, chunk, group_of(tile, lane)) + i);
      }
    team.team_barrier();

    StepMaps cached;
    int current = 0;
    for (int window = begin; window < end; window += P * L) {
      const int window_end = Kokkos::min(end, window + P * L);
      const int active = int(ceil_div(window_end - window, L));
      const int first = window + me.p * L, count = Kokkos::max(0, Kokkos::min(L, window_end - first));
      const bool resident = Batch > 0 && count <= Batch;
      if constexpr (Batch > 0)
        if (resident && count > 0) load_batch(me, batch, tile, first, count, cached);
      // The last active sub-chunk's map is never needed (no carry is derived from it): identity.
      compose_steps(me, batch, tile, first, me.p < active - 1 ? count : 0, resident, cached, maps);
      team.team_barrier();
      scan_sub_chunks(team, me, maps);
      if (count > 0) {
        Acc x[Rows][D];
        enter_sub_chunk(me, maps, carry_at(current, 0), x);
        run_steps(me, batch, tile, first, count, resident, cached, x);
        if (me.p == active - 1) {
          PARASEQ_UNROLL
          for (int r = 0; r < Rows; ++r)
            if (r < me.rows)
              for (int i = 0; i < dim(); ++i) carry_at(1 - current, me.first_lane + r)[i] = x[r][i];
        }
      }
      team.team_barrier();
      current = 1 - current;
    }
  }

  // One pass: a team runs one chunk of one window. Teams take chunks in the order they start (a
  // ticket), chunk-major, so every chunk a team waits for belongs to a team that has started: the
  // waits end. SegmentChunks consecutive chunks form a segment, closed by its last chunk. Chunk c
  // of segment s:
  //   1. its sub-chunks compose their steps; their maps composed in order are the chunk's map M_c,
  //      which it publishes for the later chunks of the segment;
  //   2. once the chunks before it in the segment have published theirs, the closing chunk folds
  //      them and its own, in order, into the segment's map G_s and publishes it (status 1);
  //   3. the state E_s entering the segment: from the nearest earlier segment that has published
  //      the state leaving it (status 2), through the maps of the segments in between, one by one.
  //      The closing chunk publishes E_{s+1} = G_s(E_s) (status 2);
  //   4. the state entering c: E_s through the maps of the chunks before c in the segment, one by one;
  //   5. the sub-chunks re-run their steps from it, as in ApplyTag.
  // Every value has one recipe (a fixed fold; maps applied one by one), whichever published segment
  // a team found: the result is bitwise reproducible. The two levels keep the serial part short: at
  // most SegmentChunks - 1 chunk maps plus the segment maps back to a published state (a flat
  // look-back over 2^14 chunks of one channel went back about 270 chunks on the H200;
  // docs/performance.md).
  KOKKOS_FUNCTION void operator()(ChainedTag, const member_type<ChainedTag>& team) const { chained<false>(team); }
  KOKKOS_FUNCTION void operator()(StagedChainedTag, const member_type<StagedChainedTag>& team) const {
    chained<true>(team);
  }

private:
  template <bool StagedOnly, class Member>
  KOKKOS_FUNCTION void chained(const Member& team) const {
    const int teams_per_chunk = shape_.batch * tiles_;
    const int ticket = take_ticket(team, status_);
    const int chunk = ticket / teams_per_chunk, tile = ticket % teams_per_chunk % tiles_;
    const int batch = ticket % teams_per_chunk / tiles_;
    const int begin = chunk * plan_.chunk_steps, end = Kokkos::min(shape_.steps, begin + plan_.chunk_steps);
    const int L = plan_.chunk_length, lanes = plan_.lanes;
    const Thread me = thread_of(team, tile);
    scratch_view scratch(team.team_scratch(0), window_scratch_count<Structure, ExecSpace>(plan_));
    Acc* const maps = scratch.data();                                              // [P][lanes][MapSize]
    Acc* const entering = maps + std::size_t(plan_.team_chunks) * lanes * MapSize; // [lanes][D]
    Acc* const staging = entering + 2 * std::size_t(lanes) * D;                    // the window, if staged
    StagedWindow<StagedOnly> window;
    if (StagedOnly || staged()) window = {staging, staging + staged_maps_count<Structure>(plan_), begin};

    const int active = int(ceil_div(end - begin, L));
    const int first = begin + me.p * L, count = Kokkos::max(0, Kokkos::min(L, end - first));
    // A staged window's maps stay in team scratch until the re-run, so that no thread holds its
    // steps in registers through the look-back (the registers decide how many teams an SM holds).
    const bool resident = !window.staged() && Batch > 0 && count <= Batch;
    StepMaps cached;
    load_window(team, me, batch, tile, end, first, count, resident, window, cached);
    compose_steps(me, batch, tile, first, count, resident, cached, maps, window);
    team.team_barrier();
    scan_sub_chunks(team, me, maps);

    const int segment = chunk / SegmentChunks, segment_first = segment * SegmentChunks;
    const bool followed = chunk + 1 < plan_.time_chunks;
    const bool closes = followed && chunk + 1 == segment_first + SegmentChunks; // a later segment needs G_s, E_{s+1}
    const std::size_t stride = published_stride();
    // 1. M_c (sub-chunk 0 holds it; the last chunk's is never needed), published for the later
    //    chunks of the segment.
    Acc chunk_map[Rows][MapSize];
    if (me.p == 0 && followed)
      for (int r = 0; r < me.rows; ++r) window_map(maps, me.first_lane + r, active, chunk_map[r]);
    if (followed && !closes) {
      if (me.p == 0) {
        for (int r = 0; r < me.rows; ++r) {
          const int lane = me.first_lane + r;
          Acc* published = chunk_maps_.data() + published_index(batch, chunk, group_of(tile, lane)) * MapSize;
          for (int i = 0; i < MapSize; ++i) published[i] = chunk_map[r][i];
        }
        Kokkos::memory_fence(); // the maps are visible before the status that announces them
      }
      team.team_barrier();
      if (team.team_rank() == 0) Kokkos::atomic_store(&status_(status_index(batch, tile, chunk)), 1);
    }
    // 2. The maps of the chunks before c in the segment; the closing chunk folds G_s.
    for (int k = segment_first + team.team_rank(); k < chunk; k += team.team_size())
      wait_for_status(&status_(status_index(batch, tile, k)));
    team.team_barrier();
    Kokkos::memory_fence(); // what the statuses announce is read after them
    if (closes) {
      if (me.p == 0) {
        for (int r = 0; r < me.rows; ++r) {
          const int lane = me.first_lane + r, group = group_of(tile, lane);
          // The maps of the segment's earlier chunks, then this chunk's, composed in order.
          Acc fold[MapSize];
          map_identity<Acc, D>(dim(), fold);
          const Acc* first_map = chunk_maps_.data() + published_index(batch, segment_first, group) * MapSize;
          for_maps_in_order(
              SegmentChunks - 1, [&](int k, Acc* to) { read_published(first_map + k * stride * MapSize, MapSize, to); },
              [&](const Acc* map) { map_prepend<Acc, D>(dim(), map, fold); });
          map_prepend<Acc, D>(dim(), chunk_map[r], fold);
          Acc* published = segment_maps_.data() + published_index(batch, segment, group) * MapSize;
          for (int i = 0; i < MapSize; ++i) published[i] = fold[i];
        }
        Kokkos::memory_fence();
      }
      team.team_barrier();
      // Segment 0 announces only its state (status 2), which needs no look-back: so every search
      // ends there at the latest.
      if (team.team_rank() == 0 && segment > 0) Kokkos::atomic_store(&status_(segment_status_index(batch, tile, segment)), 1);
    }
    // 3.-4. E_s, E_{s+1} if c closes s, and the state entering c.
    const int known = segment > 0 ? published_segment_before(team, batch, tile, segment) : -1;
    Acc state[Rows][D];
    if (me.p == 0)
      for (int r = 0; r < me.rows; ++r) {
        const int group = group_of(tile, me.first_lane + r);
        if (known < 0) rec_.initial(batch, group, state[r]);
        else read_published(carries_.data() + published_index(batch, known, group) * D, D, state[r]);
      }
    apply_published_maps(team, me, segment_maps_.data(), batch, tile, known + 1, segment - known - 1, window, state);
    if (me.p == 0 && closes) // this team wrote G_s: no volatile read needed
      for (int r = 0; r < me.rows; ++r) {
        const int group = group_of(tile, me.first_lane + r);
        map_apply<Acc, D>(dim(), segment_maps_.data() + published_index(batch, segment, group) * MapSize, state[r],
                          carries_.data() + published_index(batch, segment, group) * D);
      }
    apply_published_maps(team, me, chunk_maps_.data(), batch, tile, segment_first, chunk - segment_first, window, state);
    if (me.p == 0) {
      // Bounded by Rows too: g++ 12 and 13 lose me.rows <= Rows here and warn (-Wstringop-overread)
      // of a copy past `state`.
      for (int r = 0; r < Rows && r < me.rows; ++r)
        for (int i = 0; i < dim(); ++i) entering[(me.first_lane + r) * D + i] = state[r][i];
      Kokkos::memory_fence();
    }
    team.team_barrier();
    if (team.team_rank() == 0 && closes) Kokkos::atomic_store(&status_(segment_status_index(batch, tile, segment)), 2);

    // 5.
    if (count > 0) {
      Acc x[Rows][D];
      enter_sub_chunk(me, maps, entering, x);
      run_steps(me, batch, tile, first, count, resident, cached, x, window);
    }
    if (window.staged()) {
      team.team_barrier();
      store_window(team, me, batch, tile, end, window);
    }
  }

  // Where a thread works: sub-chunk p, and `rows` live groups of the tile from first_lane on (0
  // past the last group; such threads still meet every barrier).
  struct Thread {
    int p, first_lane, rows;
  };

  // A window staged through team scratch (stages_windows): its step maps, then its states, entry
  // e = (step - first_step) * lanes + lane (staged_offset, staged_state_offset). Empty where
  // windows are not staged. StagedOnly (the StagedChainedTag kernel): staged at compile time, so
  // the kernel holds none of the per-thread step batches' code.
  template <bool StagedOnly>
  struct StagedWindow {
    Acc* maps = nullptr;
    Acc* states = nullptr;
    int first_step = 0;
    KOKKOS_FUNCTION bool staged() const { return StagedOnly || maps != nullptr; }
  };

  template <class Member>
  KOKKOS_FUNCTION Thread thread_of(const Member& team, int tile) const {
    const int row_threads = plan_.lanes / Rows;
    const int first_lane = team.team_rank() % row_threads * Rows;
    const int remaining = shape_.groups - group_of(tile, first_lane);
    return {team.team_rank() / row_threads, first_lane, Kokkos::max(0, Kokkos::min(int(Rows), remaining))};
  }

  // Sub-chunks find the maps before them in one of two ways. Up to 32, each thread applies the maps
  // of the sub-chunks before its own to the entering state (p applications, no barrier). Beyond
  // (teams of few lanes, up to 256 sub-chunks), an ordered scan of the maps comes first.
  KOKKOS_FUNCTION bool scans_sub_chunks() const { return plan_.team_chunks > 32; }

  // Where scans_sub_chunks(): the inclusive scan of the window's sub-chunk maps, in place, so that
  // map p of a lane becomes the composition of sub-chunks 0 .. p. Hillis-Steele: log2 P rounds, in
  // each of which a thread reads map p - offset and composes it with its own in a fixed order, so
  // the result is bitwise reproducible. Call after a barrier that follows the compose; it ends with
  // one.
  template <class Member>
  KOKKOS_FUNCTION void scan_sub_chunks(const Member& team, const Thread& me, Acc* maps) const {
    if (!scans_sub_chunks()) return;
    for (int offset = 1; offset < plan_.team_chunks; offset *= 2) {
      const bool combines = me.p >= offset;
      Acc earlier[Rows][MapSize];
      PARASEQ_UNROLL
      for (int r = 0; r < Rows; ++r) {
        if (!combines || r >= me.rows) continue; // unrolled: earlier stays in registers
        const Acc* source = map_at(maps, me.p - offset, me.first_lane + r);
        for (int i = 0; i < MapSize; ++i) earlier[r][i] = source[i];
      }
      team.team_barrier();
      PARASEQ_UNROLL
      for (int r = 0; r < Rows; ++r) {
        if (!combines || r >= me.rows) continue;
        Acc* own = map_at(maps, me.p, me.first_lane + r);
        map_prepend<Acc, D>(dim(), own, earlier[r]);
        for (int i = 0; i < MapSize; ++i) own[i] = earlier[r][i];
      }
      team.team_barrier();
    }
  }

  // out <- the maps of sub-chunks 0 .. count - 1 of `lane`, composed in order.
  KOKKOS_FUNCTION void window_map(Acc* maps, int lane, int count, Acc* out) const {
    if (scans_sub_chunks()) {
      for (int i = 0; i < MapSize; ++i) out[i] = map_at(maps, count - 1, lane)[i];
      return;
    }
    for (int i = 0; i < MapSize; ++i) out[i] = map_at(maps, 0, lane)[i];
    for (int q = 1; q < count; ++q) map_prepend<Acc, D>(dim(), map_at(maps, q, lane), out);
  }

  // x <- the state entering the thread's sub-chunk: the window's entering state (`carries`,
  // [lanes][D]) through the maps of the sub-chunks before it.
  KOKKOS_FUNCTION void enter_sub_chunk(const Thread& me, Acc* maps, const Acc* carries, Acc (&x)[Rows][D]) const {
    Acc y[D];
    PARASEQ_UNROLL
    for (int r = 0; r < Rows; ++r) {
      if (r >= me.rows) continue; // unrolled: x stays in registers
      const int lane = me.first_lane + r;
      for (int i = 0; i < dim(); ++i) x[r][i] = carries[lane * D + i];
      if (scans_sub_chunks()) {
        if (me.p > 0) map_apply<Acc, D>(dim(), map_at(maps, me.p - 1, lane), carries + lane * D, x[r]);
        continue;
      }
      for (int q = 0; q < me.p; ++q) {
        map_apply<Acc, D>(dim(), map_at(maps, q, lane), x[r], y);
        for (int i = 0; i < dim(); ++i) x[r][i] = y[i];
      }
    }
  }

  // Calls use(map) for the `count` maps that load(k, into) fetches, in order, fetching ReadAhead at
  // a time so that their loads overlap.
  template <class Load, class Use>
  KOKKOS_FUNCTION void for_maps_in_order(int count, const Load& load, const Use& use) const {
    for (int k = 0; k < count; k += ReadAhead) {
      Acc ahead[ReadAhead][MapSize];
      PARASEQ_UNROLL
      for (int j = 0; j < ReadAhead; ++j) load(Kokkos::min(k + j, count - 1), ahead[j]);
      PARASEQ_UNROLL
      for (int j = 0; j < ReadAhead; ++j)
        if (k + j < count) use(ahead[j]);
    }
  }

  // x <- the `count` maps that load(k, into) fetches, applied in order.
  template <class Load>
  KOKKOS_FUNCTION void apply_maps_in_order(int count, const Load& load, Acc* x) const {
    Acc y[D];
    for_maps_in_order(count, load, [&](const Acc* map) {
      map_apply<Acc, D>(dim(), map, x, y);
      for (int i = 0; i < dim(); ++i) x[i] = y[i];
    });
  }

  // x (sub-chunk 0's rows) <- the maps that entries first .. first + count - 1 (chunks or segments)
  // published in `published`, applied in order; called by the whole team. Staged windows (few lanes,
  // so long chains of chunks and long look-backs) first load the maps into team scratch together (the
  // window's states' area, not yet used), a map per thread per round: one memory latency per round
  // rather than one per few maps. Otherwise sub-chunk 0 reads them itself.
  template <bool S, class Member>
  KOKKOS_FUNCTION void apply_published_maps(const Member& team, const Thread& me, const Acc* published, int batch,
                                            int tile, int first, int count, const StagedWindow<S>& window,
                                            Acc (&x)[Rows][D]) const {
    if constexpr (Batch > 0)
      if (window.staged()) {
        const int lanes = plan_.lanes, P = plan_.team_chunks, lane = team.team_rank() % lanes;
        const int group = group_of(tile, lane);
        Acc* const loaded = window.states;
        for (int done = 0; done < count; done += P) {
          const int n = Kokkos::min(P, count - done);
          if (group < shape_.groups && me.p < n)
            read_published(published + published_index(batch, first + done + me.p, group) * MapSize, MapSize,
                           loaded + staged_offset(me.p * lanes + lane));
          team.team_barrier();
          if (me.p == 0 && me.rows > 0)
            apply_maps_in_order(n, [&](int k, Acc* to) {
              for (int i = 0; i < MapSize; ++i) to[i] = loaded[staged_offset(k * lanes + lane) + i];
            }, x[0]);
          team.team_barrier();
        }
        return;
      }
    if (me.p == 0)
      for (int r = 0; r < me.rows; ++r) {
        const Acc* from = published + published_index(batch, first, group_of(tile, me.first_lane + r)) * MapSize;
        apply_maps_in_order(count, [&](int k, Acc* to) {
          read_published(from + std::size_t(k) * published_stride() * MapSize, MapSize, to);
        }, x[r]);
      }
  }

  // The nearest segment before `segment` that has published the state leaving it (look_back_to_state);
  // segment 0 publishes its state and nothing before, so the search ends there at the latest.
  template <class Member>
  KOKKOS_FUNCTION int published_segment_before(const Member& team, int batch, int tile, int segment) const {
    return look_back_to_state(team, segment - 1,
                              [&](int polled) { return &status_(segment_status_index(batch, tile, polled)); });
  }

  // Loads the maps of steps [first, first + count), 1 <= count <= Batch, for the thread's row. Slots
  // past `count` and lanes past the last group repeat the last step and group (never used): the
  // loads stay unconditional, so the compiler issues them together.
  KOKKOS_FUNCTION void load_batch(const Thread& me, int batch, int tile, int first, int count, StepMaps& cached) const {
    if (me.rows == 0) return;
    PARASEQ_UNROLL
    for (int k = 0; k < Batch; ++k) {
      const int step = first + Kokkos::min(k, count - 1);
      PARASEQ_UNROLL
      for (int r = 0; r < Rows; ++r)
        load_step_map<Acc, D>(rec_, batch, step, group_of(tile, me.first_lane + Kokkos::min(r, me.rows - 1)), dim(),
                              cached[k][r]);
    }
  }

  // Windows staged through team scratch (stages_windows). Map e of the staged window (e = step *
  // lanes + lane) and the state that replaces it, with one value of padding every 16 maps, so that
  // threads reading their own steps (16 apart for L = 16) fall in different banks.
  KOKKOS_FUNCTION bool staged() const { return stages_windows<Structure, ExecSpace>(plan_); }
  KOKKOS_FUNCTION static std::size_t staged_offset(int e) { return std::size_t(e) * MapSize + e / 16; }
  KOKKOS_FUNCTION static std::size_t staged_state_offset(int e) { return std::size_t(e) * D + e / 16; }

  // A staged window: loads its maps [window.first_step, window_end) into team scratch (ends with a
  // barrier). Otherwise fills `cached` with the thread's steps [first, first + count) when they stay
  // resident, or does nothing.
  template <bool S, class Member>
  KOKKOS_FUNCTION void load_window(const Member& team, const Thread& me, int batch, int tile, int window_end,
                                   int first, int count, bool resident, const StagedWindow<S>& window,
                                   StepMaps& cached) const {
    if constexpr (Batch > 0) {
      static_assert(Rows == 1, "paraseq::ordered_scan: step batches are for spaces with one group per thread");
      if (!window.staged()) {
        if (resident && count > 0) load_batch(me, batch, tile, first, count, cached);
        return;
      }
      // Thread (p, lane) loads steps p, p + P, ... of the window for its lane: at most L <= Batch
      // maps, half of them at a time (a team of 256 threads keeps 2048 loads in flight, and the
      // registers of the other half would cost teams per SM). Clamped indices keep the loads
      // unconditional, so they are issued together.
      const int lanes = plan_.lanes, P = plan_.team_chunks, lane = team.team_rank() % lanes;
      const int group = Kokkos::min(group_of(tile, lane), shape_.groups - 1);
      constexpr int InFlight = Kokkos::max(1, Batch / 2);
      for (int done = 0; done < Batch; done += InFlight) {
        Acc loaded[InFlight][MapSize];
        PARASEQ_UNROLL
        for (int j = 0; j < InFlight; ++j)
          load_step_map<Acc, D>(rec_, batch, Kokkos::min(window.first_step + me.p + (done + j) * P, window_end - 1), group,
                                dim(), loaded[j]);
        PARASEQ_UNROLL
        for (int j = 0; j < InFlight; ++j) {
          const int step = me.p + (done + j) * P; // in the window
          if (window.first_step + step < window_end)
            for (int i = 0; i < MapSize; ++i) window.maps[staged_offset(step * lanes + lane) + i] = loaded[j][i];
        }
      }
      team.team_barrier();
    }
  }

  // Stores the states of the staged window [window.first_step, window_end) from team scratch, as
  // load_window loaded its maps: thread (p, lane) takes steps p, p + P, ... of its lane. Call after a
  // barrier that follows the run.
  template <bool S, class Member>
  KOKKOS_FUNCTION void store_window(const Member& team, const Thread& me, int batch, int tile, int window_end,
                                    const StagedWindow<S>& window) const {
    const int lanes = plan_.lanes, lane = team.team_rank() % lanes, group = group_of(tile, lane);
    if (group >= shape_.groups) return;
    for (int step = me.p; window.first_step + step < window_end; step += plan_.team_chunks)
      rec_.store(batch, window.first_step + step, group, window.states + staged_state_offset(step * lanes + lane));
  }

  // Calls body(step map, row, step) for steps [first, first + count) of the thread's row, in order,
  // a batch at a time; each batch is loaded into `cached` unless `resident` (then it is there already).
  template <class Body>
  KOKKOS_FORCEINLINE_FUNCTION void for_cached_steps(const Thread& me, int batch, int tile, int first, int count,
                                                    bool resident, StepMaps& cached, const Body& body) const {
    for (int done = 0; done < count; done += Batch) {
      const int n = Kokkos::min(int(Batch), count - done);
      if (!resident) load_batch(me, batch, tile, first + done, n, cached);
      PARASEQ_UNROLL
      for (int k = 0; k < Batch; ++k) {
        if (k >= n) continue; // unrolled: a guard, not a loop exit
        PARASEQ_UNROLL
        for (int r = 0; r < Rows; ++r)
          if (r < me.rows) body(cached[k][r], r, first + done + k);
      }
    }
  }

  // Composes steps [first, first + count) of the thread's row into its maps in team scratch (the
  // identity for count = 0); with `resident`, `cached` already holds them, and a staged window holds
  // them in team scratch.
  template <bool S = false>
  KOKKOS_FUNCTION void compose_steps(const Thread& me, int batch, int tile, int first, int count, bool resident,
                                     StepMaps& cached, Acc* maps, const StagedWindow<S>& window = {}) const {
    for (int r = 0; r < me.rows; ++r) map_identity<Acc, D>(dim(), map_at(maps, me.p, me.first_lane + r));
    if constexpr (Batch > 0) {
      if (window.staged()) {
        if (me.rows > 0)
          for (int s = first; s < first + count; ++s)
            map_prepend<Acc, D>(dim(), window.maps + staged_offset((s - window.first_step) * plan_.lanes + me.first_lane),
                                map_at(maps, me.p, me.first_lane));
        return;
      }
      for_cached_steps(me, batch, tile, first, count, resident, cached, [&](const Acc* step_map, int r, int) {
        map_prepend<Acc, D>(dim(), step_map, map_at(maps, me.p, me.first_lane + r));
      });
    } else {
      for (int s = first; s < first + count; ++s)
        for (int r = 0; r < me.rows; ++r)
          map_push_step<Acc, D>(rec_, batch, s, group_of(tile, me.first_lane + r), dim(),
                                map_at(maps, me.p, me.first_lane + r));
    }
  }

  // Runs steps [first, first + count) of the thread's row from x, storing every state; x ends as the
  // last. With `resident`, `cached` already holds the steps' maps. A staged window's maps are read
  // from team scratch and its states go there (store_window stores them).
  template <bool S = false>
  KOKKOS_FUNCTION void run_steps(const Thread& me, int batch, int tile, int first, int count, bool resident,
                                 StepMaps& cached, Acc (&x)[Rows][D], const StagedWindow<S>& window = {}) const {
    Acc y[D];
    if constexpr (Batch > 0) {
      if (window.staged()) {
        if (me.rows > 0)
          for (int s = first; s < first + count; ++s) {
            const int e = (s - window.first_step) * plan_.lanes + me.first_lane;
            map_apply<Acc, D>(dim(), window.maps + staged_offset(e), x[0], y);
            for (int i = 0; i < dim(); ++i) window.states[staged_state_offset(e) + i] = x[0][i] = y[i];
          }
        return;
      }
      for_cached_steps(me, batch, tile, first, count, resident, cached, [&](const Acc* step_map, int r, int step) {
        const int lane = me.first_lane + r;
        map_apply<Acc, D>(dim(), step_map, x[r], y);
        rec_.store(batch, step, group_of(tile, lane), y);
        for (int i = 0; i < dim(); ++i) x[r][i] = y[i];
      });
    } else {
      const int rows = me.rows, first_group = group_of(tile, me.first_lane); // locals: nothing stored aliases them
      for (int s = first; s < first + count; ++s)
        for (int r = 0; r < rows; ++r) { // a run-time bound, so that hosts vectorise across the row
          const int group = first_group + r;
          rec_.affine(batch, s, group, x[r], y);
          rec_.store(batch, s, group, y);
          for (int i = 0; i < dim(); ++i) x[r][i] = y[i];
        }
    }
  }

  // The group size, a compile-time constant except for Dense.
  KOKKOS_FUNCTION constexpr int dim() const {
    if constexpr (Structure::fixed_group_size > 0) return Structure::fixed_group_size;
    else return d_;
  }

  KOKKOS_FUNCTION int group_of(int tile, int lane) const { return tile * plan_.lanes + lane; }
  KOKKOS_FUNCTION Acc* map_at(Acc* maps, int p, int lane) const {
    return maps + (std::size_t(p) * plan_.lanes + lane) * MapSize;
  }

  KOKKOS_FUNCTION std::size_t chunk_map_offset(int batch, int chunk, int group) const {
    return ((std::size_t(batch) * (plan_.time_chunks - 1) + chunk) * shape_.groups + group) * MapSize;
  }
  KOKKOS_FUNCTION std::size_t carry_offset(int batch, int chunk, int group) const {
    return ((std::size_t(batch) * plan_.time_chunks + chunk) * shape_.groups + group) * D;
  }
  // One pass: the published map of (batch, chunk, group), and the map and leaving state of (batch,
  // segment, group), at this index times their size; consecutive chunks (segments) of a (batch,
  // group) lie `published_stride()` apart. Statuses, after the ticket counter in status_(0): one per
  // (batch, tile, chunk), then one per (batch, tile, segment).
  KOKKOS_FUNCTION std::size_t published_index(int batch, int chunk, int group) const {
    return (std::size_t(chunk) * shape_.batch + batch) * shape_.groups + group;
  }
  KOKKOS_FUNCTION std::size_t published_stride() const { return std::size_t(shape_.batch) * shape_.groups; }
  KOKKOS_FUNCTION std::size_t status_index(int batch, int tile, int chunk) const {
    return 1 + (std::size_t(chunk) * shape_.batch + batch) * tiles_ + tile;
  }
  KOKKOS_FUNCTION std::size_t segment_status_index(int batch, int tile, int segment) const {
    return status_index(batch, tile, plan_.time_chunks + segment);
  }
  // Values another team published: volatile, so that a GPU reads them from L2 and not from a stale
  // L1 line.
  KOKKOS_FUNCTION static void read_published(const Acc* from, int count, Acc* to) {
    read_published_values(from, count, to);
  }

  std::size_t apply_scratch_bytes() const {
    return scratch_view::shmem_size(window_scratch_count<Structure, ExecSpace>(plan_));
  }
  KOKKOS_FUNCTION std::size_t summarize_scratch_count() const {
    return std::size_t(plan_.team_chunks) * plan_.lanes * MapSize;
  }
  std::size_t summarize_scratch_bytes() const { return scratch_view::shmem_size(summarize_scratch_count()); }

  // The team size the kernels' registers and scratch allow on `space` decides P in the end: a
  // planned P above it halves until it fits (plan_scan cannot see a Recurrence's registers, nor
  // every space's scratch).
  void fit_team_size(const ExecSpace& space, bool requested) {
    const std::size_t scratch_max = team_policy<ExecSpace, ApplyTag>(space, 1, 1).scratch_size_max(0);
    for (std::size_t needed = apply_scratch_bytes(); needed > scratch_max; needed = apply_scratch_bytes()) {
      if (requested || plan_.team_chunks == 1)
        throw std::invalid_argument("paraseq::ordered_scan: ScanConfig::team_chunks = " +
                                    std::to_string(plan_.team_chunks) + " needs " + std::to_string(needed) +
                                    " bytes of team scratch; this space allows " + std::to_string(scratch_max));
      halve_team_chunks();
    }
    auto team_max = [&] {
      if constexpr (has_staged_kernel)
        if (plan_.single_pass && staged())
          return ScanKernel<OrderedScan, StagedChainedTag>::team_size_max(space, *this, apply_scratch_bytes());
      if (plan_.single_pass) return ScanKernel<OrderedScan, ChainedTag>::team_size_max(space, *this, apply_scratch_bytes());
      int limit = ScanKernel<OrderedScan, ApplyTag>::team_size_max(space, *this, apply_scratch_bytes());
      if (plan_.time_chunks > 1)
        limit = Kokkos::min(limit, ScanKernel<OrderedScan, SummarizeTag>::team_size_max(space, *this, summarize_scratch_bytes()));
      return limit;
    };
    for (int limit = team_max(); plan_.team_size > limit; limit = team_max()) {
      if (requested || plan_.team_chunks == 1)
        throw std::invalid_argument("paraseq::ordered_scan: ScanConfig::team_chunks = " +
                                    std::to_string(plan_.team_chunks) + " needs " + std::to_string(plan_.team_size) +
                                    " threads per team; this space allows " + std::to_string(limit));
      halve_team_chunks();
    }
  }

  void halve_team_chunks() {
    plan_.team_size /= 2;
    plan_.team_chunks /= 2;
    if (plan_.single_pass) { // a chunk is a window: halving P doubles the chunks
      plan_.chunk_steps = plan_.team_chunks * plan_.chunk_length;
      plan_.time_chunks = int(ceil_div(shape_.steps, plan_.chunk_steps));
    }
  }

  template <class Tag>
  void launch(const ExecSpace& space, const char* label, std::size_t league, std::size_t scratch_bytes) const {
    ScanKernel<OrderedScan, Tag>::launch(space, *this, label, league, plan_.team_size, scratch_bytes);
  }

  ScanShape shape_;
  ScanPlan plan_;
  Recurrence rec_;
  int d_;
  int tiles_;
  buffer_view chunk_maps_;   // two passes: chunk maps; one pass: the maps the chunks publish
  buffer_view segment_maps_; // one pass: the segments' maps
  buffer_view carries_;      // two passes: the states entering the chunks; one pass: leaving the segments
  status_view status_;
};

template <class Scan, class Tag>
void ScanKernel<Scan, Tag>::launch(const space_type& space, const Scan& scan, const char* label, std::size_t league,
                                   int team_size, std::size_t scratch_bytes) {
  Kokkos::parallel_for(label, team_policy<space_type, Tag>(space, int(league), team_size, scratch_bytes), scan);
}

template <class Scan, class Tag>
int ScanKernel<Scan, Tag>::team_size_max(const space_type& space, const Scan& scan, std::size_t scratch_bytes) {
  return team_policy<space_type, Tag>(space, 1, 1, scratch_bytes).team_size_max(scan, Kokkos::ParallelForTag{});
}

} // namespace detail

// Runs the scan of `rec` over `shape` on `space`, in the order described at the top of this file.
template <class Structure, class Acc, class ExecSpace, class Recurrence>
void ordered_scan(const ExecSpace& space, const ScanShape& shape, const Recurrence& rec,
                  const ScanConfig& config = {}) {
  static_assert(Kokkos::is_execution_space_v<ExecSpace>,
                "paraseq::ordered_scan: the first argument must be a Kokkos execution space instance");
  static_assert(is_structure_v<Structure>, "paraseq::ordered_scan: Structure must be Diagonal, BlockDiagonal<K>, Dense or DenseUpTo<N>");
  static_assert(std::is_floating_point_v<Acc>, "paraseq::ordered_scan: the accumulation type must be float or double");
  const ScanPlan plan = plan_scan<Structure, Acc>(space, shape, config);
  detail::OrderedScan<Structure, Acc, ExecSpace, Recurrence>(shape, plan, rec).run(space, config.team_chunks > 0);
}

} // namespace paraseq
