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
//   * time chunks: [0, S) is cut into G chunks that run in different teams. Only when B x groups is
//     too small to fill the execution space (G > 1) does a first kernel compose each chunk into one
//     map, a second find the state entering each chunk in order, and the main kernel re-run them.
//   * windows: a team walks its chunk in windows of P x Lsub steps. Its P threads each compose one
//     sub-chunk of Lsub steps into a map (kept in team scratch), then each re-runs its sub-chunk from
//     the window's entering state advanced through the maps of the sub-chunks before it.
//   * lanes: the vector lanes of a thread handle adjacent groups, so on a GPU a warp reads
//     consecutive channels of one time step (coalesced), and on a CPU a thread walks cache lines.
// With P = 1 and G = 1 this is the plain sequential-in-time loop, chosen when B x groups alone fills
// the space: it reads the operands once and does no redundant work.
//
// A Recurrence provides, for batch b, step s and group g (pointers hold the group's d values):
//   KOKKOS_FUNCTION void initial(int b, int g, Acc* x) const;                  // x_{-1}
//   KOKKOS_FUNCTION void affine(int b, int s, int g, const Acc* x, Acc* y) const; // y = L_s x + c_s
//   KOKKOS_FUNCTION void linear(int b, int s, int g, const Acc* x, Acc* y) const; // y = L_s x
//   KOKKOS_FUNCTION void store(int b, int s, int g, const Acc* y) const;       // receives x_s
// Materialised Views are one implementation (linear_scan.hpp); solvers build (L_s, c_s) on the fly.

#include <paraseq/core/structure.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace paraseq {

// Decomposition overrides; 0 means "choose from the execution space and the shape".
struct ScanConfig {
  int team_chunks = 0;  // P: sub-chunks (threads) per team window; 1 = sequential inside a team
  int chunk_length = 0; // Lsub: steps per sub-chunk
  int time_chunks = 0;  // G: independent time chunks across teams; 1 = no chunk summaries
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
  int lanes = 1;         // groups per team, one per vector lane
  int vector_length = 1; // hardware vector length asked of the team policy
  int scratch_level = 0;
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

KOKKOS_INLINE_FUNCTION constexpr long ceil_div(long a, long b) { return (a + b - 1) / b; }

} // namespace detail

// Lanes one thread handles: on a GPU one group per hardware thread (the vector lanes of a warp take
// adjacent groups); on a CPU a thread sweeps a row of adjacent groups per time step, so it reads
// contiguous memory and the compiler can vectorise across groups.
template <class Structure, class ExecSpace>
inline constexpr int lanes_per_thread =
    Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible && Structure::fixed_group_size > 0 ? 32 : 1;

// Chooses the decomposition from a cost model. Composing a step into a map costs about d + 1 times
// a plain step (d columns and the offset go through L_s), so splitting time only pays where the
// extra work is spread over otherwise idle threads. Host spaces run one thread per team; device
// spaces a warp of lanes and up to 16 sub-chunks per team, limited by team scratch.
template <class Structure, class Acc, class ExecSpace>
ScanPlan plan_scan(const ExecSpace& space, const ScanShape& shape, const ScanConfig& config = {}) {
  static_assert(is_structure_v<Structure>, "paraseq::plan_scan: Structure must be Diagonal, BlockDiagonal<K> or Dense");
  constexpr int D = Structure::max_group_size;
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  constexpr bool grouped = Structure::fixed_group_size > 0;
  const double concurrency = std::max(1, space.concurrency());
  const double compose_cost = shape.group_size + 1;

  ScanPlan plan;
  // On a device, a state of few groups gets a narrower team so its idle lanes become sub-chunks.
  plan.lanes = !grouped ? 1 : on_host ? 32 : std::min(32, detail::round_up_pow2(std::max(1, shape.groups)));
  plan.vector_length = plan.lanes / lanes_per_thread<Structure, ExecSpace>;
  const long teams = long(shape.batch) * detail::ceil_div(shape.groups, plan.lanes);
  const double threads_per_team = plan.vector_length; // before sub-chunks

  if (config.team_chunks > 0) plan.team_chunks = config.team_chunks;
  else if (on_host) plan.team_chunks = 1;
  else {
    // Sub-chunks make each step cost compose + apply (compose_cost + 1 plain steps) in exchange for
    // P times the threads. A device's loads stop gaining from more threads at about a quarter of
    // its resident threads (H200: the one-step-per-thread plan over 2^16 channels ran 1.9x faster
    // than 8 sub-chunks, while 2^14 channels gained from them; docs/performance.md), so
    // sub-chunks pay only while the threads without them are fewer than that saturation divided
    // by the extra work.
    const double saturation = concurrency / 4;
    const double threads = std::max(1.0, teams * threads_per_team);
    const std::size_t map_bytes = sizeof(Acc) * detail::map_size<D> * plan.lanes;
    const long by_scratch = long(std::max<std::size_t>(1, (32 * 1024) / map_bytes));
    const long by_fill = threads * (compose_cost + 1) < saturation ? detail::round_up_pow2(long(saturation / threads)) : 1;
    const long team_cap = plan.lanes >= 32 ? 16 : 32; // the carry prefix costs O(P) map applications
    plan.team_chunks = int(std::max(1L, std::min({team_cap, by_scratch, by_fill})));
    while (plan.team_chunks & (plan.team_chunks - 1)) --plan.team_chunks; // a power of two
  }
  plan.chunk_length = config.chunk_length > 0 ? config.chunk_length : (on_host ? 256 : 32);

  // Predicted time of G time chunks, in plain steps per thread: summaries of G-1 chunks, then all G.
  const double steps = std::max(1, shape.steps);
  const double team_threads = threads_per_team * plan.team_chunks;
  auto predicted = [&](long G) {
    const double busy_summary = std::min(concurrency, teams * (G - 1) * team_threads);
    const double busy_apply = std::min(concurrency, teams * G * team_threads);
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
  plan.chunk_steps = int(detail::ceil_div(std::max(1, shape.steps), plan.time_chunks));
  plan.time_chunks = int(detail::ceil_div(std::max(1, shape.steps), plan.chunk_steps)); // no empty chunk
  return plan;
}

namespace detail {

template <class Structure, class Acc, class ExecSpace, class Recurrence>
class OrderedScan {
  static constexpr int D = Structure::max_group_size;
  static constexpr int MapSize = map_size<D>;

public:
  struct SummarizeTag {};
  struct CarryTag {};
  struct ApplyTag {};
  using buffer_view = Kokkos::View<Acc*, typename ExecSpace::memory_space>;
  using scratch_view = Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  template <class Tag>
  using team_policy = Kokkos::TeamPolicy<ExecSpace, Tag>;
  template <class Tag>
  using member_type = typename team_policy<Tag>::member_type;

  OrderedScan(const ScanShape& shape, const ScanPlan& plan, const Recurrence& rec)
      : shape_(shape), plan_(plan), rec_(rec), d_(shape.group_size),
        tiles_(int(ceil_div(shape.groups, plan.lanes))) {}

  void run(const ExecSpace& space) {
    if (shape_.batch == 0 || shape_.steps == 0 || shape_.groups == 0) return;
    const int G = plan_.time_chunks;
    if (G > 1) {
      const std::size_t per_chunk = std::size_t(shape_.batch) * shape_.groups;
      chunk_maps_ = buffer_view(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::chunk_maps"),
                                per_chunk * (G - 1) * MapSize);
      carries_ = buffer_view(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::chunk_carries"),
                             per_chunk * G * D);
      launch<SummarizeTag>(space, "paraseq::scan_summarize", std::size_t(shape_.batch) * tiles_ * (G - 1),
                           summarize_scratch_bytes());
      Kokkos::parallel_for("paraseq::scan_carries",
                           Kokkos::RangePolicy<ExecSpace, CarryTag>(space, 0, std::size_t(shape_.batch) * shape_.groups),
                           *this);
    }
    launch<ApplyTag>(space, "paraseq::scan_apply", std::size_t(shape_.batch) * tiles_ * G, apply_scratch_bytes());
  }

  // Phase 1 (G > 1): thread p composes an equal slice of the chunk, then the maps are folded in
  // order into the chunk's map.
  KOKKOS_FUNCTION void operator()(SummarizeTag, const member_type<SummarizeTag>& team) const {
    const int chunks = plan_.time_chunks - 1;
    const int chunk = team.league_rank() % chunks;
    const int tile = (team.league_rank() / chunks) % tiles_;
    const int batch = team.league_rank() / chunks / tiles_;
    const int begin = chunk * plan_.chunk_steps, end = begin + plan_.chunk_steps;
    const int P = plan_.team_chunks, slice = int(ceil_div(plan_.chunk_steps, P));
    scratch_view scratch(team.team_scratch(plan_.scratch_level), std::size_t(P) * plan_.lanes * MapSize);
    Acc* const maps = scratch.data(); // [P][lanes][MapSize]

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, P), [&](int p) {
      for_lane_rows(team, tile, [&](int first_lane, int count) {
        for (int l = 0; l < count; ++l) map_identity<Acc, D>(dim(), map_at(maps, p, first_lane + l));
        for (int s = begin + p * slice; s < Kokkos::min(end, begin + (p + 1) * slice); ++s)
          for (int l = 0; l < count; ++l)
            map_push_step<Acc, D>(rec_, batch, s, group_of(tile, first_lane + l), dim(), map_at(maps, p, first_lane + l));
      });
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, plan_.lanes), [&](int lane) {
      const int group = group_of(tile, lane);
      if (group >= shape_.groups) return;
      Acc* out = chunk_maps_.data() + chunk_map_offset(batch, chunk, group);
      for (int i = 0; i < MapSize; ++i) out[i] = map_at(maps, 0, lane)[i];
      for (int p = 1; p < P; ++p) map_prepend<Acc, D>(dim(), map_at(maps, p, lane), out);
    });
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

  // Phase 3: walk the chunk in windows; within a window, sub-chunks start from composed carries.
  KOKKOS_FUNCTION void operator()(ApplyTag, const member_type<ApplyTag>& team) const {
    const int G = plan_.time_chunks;
    const int chunk = team.league_rank() % G;
    const int tile = (team.league_rank() / G) % tiles_;
    const int batch = team.league_rank() / G / tiles_;
    const int begin = chunk * plan_.chunk_steps, end = Kokkos::min(shape_.steps, begin + plan_.chunk_steps);
    const int P = plan_.team_chunks, L = plan_.chunk_length, lanes = plan_.lanes;
    scratch_view scratch(team.team_scratch(plan_.scratch_level), apply_scratch_count());
    Acc* const maps = scratch.data();                             // [P][lanes][MapSize]
    Acc* const carries = maps + std::size_t(P) * lanes * MapSize; // [2][lanes][D]

    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, lanes), [&](int lane) {
      const int group = group_of(tile, lane);
      if (group >= shape_.groups) return;
      Acc* carry = carries + std::size_t(lane) * D;
      if (G == 1) rec_.initial(batch, group, carry);
      else
        for (int i = 0; i < dim(); ++i) carry[i] = carries_(carry_offset(batch, chunk, group) + i);
    });
    team.team_barrier();

    int current = 0;
    for (int window = begin; window < end; window += P * L) {
      const int window_end = Kokkos::min(end, window + P * L);
      const int active = int(ceil_div(window_end - window, L));
      // The last active sub-chunk's map is never needed: no carry is derived from it.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, active - 1), [&](int p) {
        for_lane_rows(team, tile, [&](int first_lane, int count) {
          for (int l = 0; l < count; ++l) map_identity<Acc, D>(dim(), map_at(maps, p, first_lane + l));
          for (int s = window + p * L; s < window + (p + 1) * L; ++s)
            for (int l = 0; l < count; ++l)
              map_push_step<Acc, D>(rec_, batch, s, group_of(tile, first_lane + l), dim(), map_at(maps, p, first_lane + l));
        });
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, active), [&](int p) {
        for_lane_rows(team, tile, [&](int first_lane, int count) {
          Acc x[LanesPerThread * D], y[D];
          for (int l = 0; l < count; ++l) {
            const Acc* carry_in = carries + (std::size_t(current) * lanes + first_lane + l) * D;
            for (int i = 0; i < dim(); ++i) x[l * D + i] = carry_in[i];
            for (int q = 0; q < p; ++q) {
              map_apply<Acc, D>(dim(), map_at(maps, q, first_lane + l), x + l * D, y);
              for (int i = 0; i < dim(); ++i) x[l * D + i] = y[i];
            }
          }
          const int sub_end = Kokkos::min(window_end, window + (p + 1) * L);
          for (int s = window + p * L; s < sub_end; ++s)
            for (int l = 0; l < count; ++l) {
              const int group = group_of(tile, first_lane + l);
              rec_.affine(batch, s, group, x + l * D, y);
              rec_.store(batch, s, group, y);
              for (int i = 0; i < dim(); ++i) x[l * D + i] = y[i];
            }
          if (p == active - 1)
            for (int l = 0; l < count; ++l) {
              Acc* carry_out = carries + (std::size_t(1 - current) * lanes + first_lane + l) * D;
              for (int i = 0; i < dim(); ++i) carry_out[i] = x[l * D + i];
            }
        });
      });
      team.team_barrier();
      current = 1 - current;
    }
  }

private:
  static constexpr int LanesPerThread = lanes_per_thread<Structure, ExecSpace>;

  // The group size, a compile-time constant except for Dense.
  KOKKOS_FUNCTION constexpr int dim() const {
    if constexpr (Structure::fixed_group_size > 0) return Structure::fixed_group_size;
    else return d_;
  }

  KOKKOS_FUNCTION int group_of(int tile, int lane) const { return tile * plan_.lanes + lane; }
  KOKKOS_FUNCTION Acc* map_at(Acc* maps, int p, int lane) const {
    return maps + (std::size_t(p) * plan_.lanes + lane) * MapSize;
  }
  // Runs body(first_lane, count) once per row of LanesPerThread adjacent lanes of the tile, one row
  // per vector lane; count excludes lanes past the last group.
  template <class Member, class Body>
  KOKKOS_FUNCTION void for_lane_rows(const Member& team, int tile, const Body& body) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, plan_.lanes / LanesPerThread), [&](int row) {
      const int first_lane = row * LanesPerThread;
      const int remaining = shape_.groups - group_of(tile, first_lane);
      const int count = remaining < LanesPerThread ? remaining : LanesPerThread;
      if (count > 0) body(first_lane, count);
    });
  }

  KOKKOS_FUNCTION std::size_t chunk_map_offset(int batch, int chunk, int group) const {
    return ((std::size_t(batch) * (plan_.time_chunks - 1) + chunk) * shape_.groups + group) * MapSize;
  }
  KOKKOS_FUNCTION std::size_t carry_offset(int batch, int chunk, int group) const {
    return ((std::size_t(batch) * plan_.time_chunks + chunk) * shape_.groups + group) * D;
  }
  KOKKOS_FUNCTION std::size_t apply_scratch_count() const {
    return std::size_t(plan_.team_chunks) * plan_.lanes * MapSize + 2 * std::size_t(plan_.lanes) * D;
  }
  std::size_t apply_scratch_bytes() const { return scratch_view::shmem_size(apply_scratch_count()); }
  std::size_t summarize_scratch_bytes() const {
    return scratch_view::shmem_size(std::size_t(plan_.team_chunks) * plan_.lanes * MapSize);
  }

  template <class Tag>
  void launch(const ExecSpace& space, const char* label, std::size_t league, std::size_t scratch_bytes) const {
    team_policy<Tag> policy(space, int(league), plan_.team_chunks, plan_.vector_length);
    policy.set_scratch_size(plan_.scratch_level, Kokkos::PerTeam(scratch_bytes));
    const int team_max = policy.team_size_max(*this, Kokkos::ParallelForTag{});
    if (plan_.team_chunks > team_max)
      throw std::invalid_argument("paraseq::ordered_scan: ScanConfig::team_chunks = " +
                                  std::to_string(plan_.team_chunks) + " exceeds the team size this space allows (" +
                                  std::to_string(team_max) + ")");
    Kokkos::parallel_for(label, policy, *this);
  }

  ScanShape shape_;
  ScanPlan plan_;
  Recurrence rec_;
  int d_;
  int tiles_;
  buffer_view chunk_maps_;
  buffer_view carries_;
};

} // namespace detail

// Runs the scan of `rec` over `shape` on `space`, in the order described at the top of this file.
template <class Structure, class Acc, class ExecSpace, class Recurrence>
void ordered_scan(const ExecSpace& space, const ScanShape& shape, const Recurrence& rec,
                  const ScanConfig& config = {}) {
  static_assert(Kokkos::is_execution_space_v<ExecSpace>,
                "paraseq::ordered_scan: the first argument must be a Kokkos execution space instance");
  static_assert(is_structure_v<Structure>, "paraseq::ordered_scan: Structure must be Diagonal, BlockDiagonal<K> or Dense");
  static_assert(std::is_floating_point_v<Acc>, "paraseq::ordered_scan: the accumulation type must be float or double");
  const ScanPlan plan = plan_scan<Structure, Acc>(space, shape, config);
  detail::OrderedScan<Structure, Acc, ExecSpace, Recurrence>(shape, plan, rec).run(space);
}

} // namespace paraseq
