#pragma once
// The fused Newton mode (see newton.hpp): one kernel runs all K iterations on chip.
//
// A team owns batch element b and a tile of `lanes` groups (one per vector lane, so a GPU warp reads
// consecutive channels of one step). It walks the sequence in windows of W = P x L steps and, per
// window: reads u once into scratch, writes the initial guess into scratch, runs K Newton
// iterations in scratch, writes h once, and carries the window's last state into the next window.
// One iteration is the scan's window algorithm over scratch: each of the P threads composes the
// affine maps of its L steps, then re-runs its steps from the carry composed from the maps before
// it. The iterate is updated in place; the value a thread needs from its left neighbour's last
// step (h^k at its own first step minus one) is saved in `boundary` during the compose phase,
// before anyone writes.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton_config.hpp>
#include <paraseq/solvers/newton_kernels.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace paraseq::detail {

struct FusedPlan {
  int lanes = 1;         // groups per team, one per vector lane
  int vector_length = 1; // hardware vector length asked of the team policy
  int team_chunks = 1;   // P: threads per lane
  int chunk_length = 1;  // L: steps per thread and window
  int window = 1;        // W = P x L
  // With several threads per window, the compose phase linearises every step at the iterate and the
  // re-run phase needs the same (f, J): small groups keep them in scratch instead of recomputing.
  bool cache_linearization = false;
};

// Values of (f, J) cached per step and lane for groups of size d, stored f then J.
KOKKOS_INLINE_FUNCTION constexpr int linearization_values(int d) { return d + d * d; }

template <class Acc>
KOKKOS_INLINE_FUNCTION void store_linearization(int d, const Acc* f, const Acc* J, Acc* slot) {
  for (int i = 0; i < d; ++i) slot[i] = f[i];
  for (int i = 0; i < d * d; ++i) slot[d + i] = J[i];
}

template <class Acc>
KOKKOS_INLINE_FUNCTION void load_linearization(int d, const Acc* slot, Acc* f, Acc* J) {
  for (int i = 0; i < d; ++i) f[i] = slot[i];
  for (int i = 0; i < d * d; ++i) J[i] = slot[d + i];
}

// Team scratch of the fused kernel, in values of Acc: per team, the window's iterate, inputs and
// (when cached) linearisations, a map and a boundary state per thread, and the carry
// ([W][lanes][d + inputs (+ d + d^2)] + [P][lanes][map + d] + [lanes][d]).
template <class Cell>
KOKKOS_INLINE_FUNCTION constexpr std::size_t fused_scratch_values(const FusedPlan& plan, int group_size, int inputs) {
  const int per_step = group_size + inputs + (plan.cache_linearization ? linearization_values(group_size) : 0);
  return std::size_t(plan.lanes) * (std::size_t(plan.window) * per_step +
                                    std::size_t(plan.team_chunks) * (map_size<cell_group_bound<Cell>> + group_size) +
                                    group_size);
}

// Host spaces: one thread per team and long windows (the team's scratch sits in cache). Devices: a
// warp of lanes, 8 steps per thread, as many threads as fit 48 KiB of scratch (at most 16; 48 KiB
// keeps several teams per multiprocessor and needs no opt-in to larger shared memory).
// config.fused_team_threads overrides the thread count on either (the kernel checks it against
// the space's team size limit).
template <class Cell, class Acc, class ExecSpace>
FusedPlan plan_fused(const ExecSpace&, const ScanShape& shape, const NewtonConfig& config) {
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  constexpr bool grouped = Cell::structure::fixed_group_size > 0;
  constexpr bool small_groups = grouped && cell_group_bound<Cell> <= 4;
  FusedPlan plan;
  if (on_host) {
    plan.team_chunks = std::max(1, config.fused_team_threads);
    plan.chunk_length = config.fused_window > 0 ? int(ceil_div(config.fused_window, plan.team_chunks)) : 256;
  } else {
    plan.lanes = plan.vector_length = grouped ? 32 : 1;
    plan.chunk_length = 8;
    if (config.fused_team_threads > 0) plan.team_chunks = config.fused_team_threads;
    else {
      // Scratch grows by `per_thread` for each thread beyond the first; sized with the cache, which
      // several threads use.
      FusedPlan one = plan, two = plan;
      one.cache_linearization = two.cache_linearization = small_groups;
      one.window = plan.chunk_length;
      two.team_chunks = 2, two.window = 2 * plan.chunk_length;
      const int inputs = Cell::max_inputs_per_group;
      const long base = long(sizeof(Acc) * fused_scratch_values<Cell>(one, shape.group_size, inputs));
      const long per_thread = long(sizeof(Acc) * fused_scratch_values<Cell>(two, shape.group_size, inputs)) - base;
      const int wanted = config.fused_window > 0 ? int(ceil_div(config.fused_window, plan.chunk_length)) : 8;
      plan.team_chunks = int(std::clamp<long>(std::min<long>(wanted, 1 + (48 * 1024 - base) / per_thread), 1, 16));
    }
  }
  plan.cache_linearization = small_groups && plan.team_chunks > 1;
  plan.window = plan.team_chunks * plan.chunk_length;
  return plan;
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

template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
struct FusedNewton {
  static constexpr int D = cell_group_bound<Cell>;
  static constexpr int MapSize = map_size<D>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using scratch_view = Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

  Cell cell;
  UView u;
  HView h;
  H0View h0;
  FusedPlan plan;
  ScanShape shape;
  int inputs; // cell.inputs_per_group()
  int iterations;
  Acc omega;
  InitialGuess guess;
  int tiles;

  KOKKOS_INLINE_FUNCTION std::size_t scratch_count() const {
    return fused_scratch_values<Cell>(plan, shape.group_size, inputs);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int b = team.league_rank() / tiles, tile = team.league_rank() % tiles;
    const int d = shape.group_size, lanes = plan.lanes, P = plan.team_chunks, L = plan.chunk_length;
    scratch_view scratch(team.team_scratch(0), scratch_count());
    Acc* const states = scratch.data();                                   // [W][lanes][d]: the iterate
    Acc* const window_inputs = states + std::size_t(plan.window) * lanes * d; // [W][lanes][inputs]
    Acc* const maps = window_inputs + std::size_t(plan.window) * lanes * inputs; // [P][lanes][MapSize]
    Acc* const boundary = maps + std::size_t(P) * lanes * MapSize;       // [P][lanes][d]
    Acc* const carry = boundary + std::size_t(P) * lanes * d;            // [lanes][d]
    Acc* const linearizations = carry + std::size_t(lanes) * d;          // [W][lanes][d + d^2] when cached
    auto state = [&](int s, int lane) { return states + (std::size_t(s) * lanes + lane) * d; };
    auto input = [&](int s, int lane) { return window_inputs + (std::size_t(s) * lanes + lane) * inputs; };
    auto linearization = [&](int s, int lane) {
      return linearizations + (std::size_t(s) * lanes + lane) * linearization_values(d);
    };
    auto for_lanes = [&](auto&& body) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes), [&](int lane) {
        if (tile * lanes + lane < shape.groups) body(lane, tile * lanes + lane);
      });
    };

    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, lanes), [&](int lane) {
      if (tile * lanes + lane < shape.groups) load_initial<Acc>(h0, b, (tile * lanes + lane) * d, d, carry + lane * d);
    });
    team.team_barrier();

    for (int start = 0; start < shape.steps; start += plan.window) {
      const int length = Kokkos::min(plan.window, shape.steps - start);
      const int active = int(ceil_div(length, L));
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, length), [&](int s) {
        for_lanes([&](int lane, int g) {
          gather_inputs<Acc>(cell, u, b, start + s, g, input(s, lane));
          Acc* x = state(s, lane);
          if (guess == InitialGuess::cell_at_zero) {
            const Acc zero[D] = {};
            cell.step(g, zero, input(s, lane), x);
          } else
            for (int i = 0; i < d; ++i) x[i] = guess == InitialGuess::zeros ? Acc(0) : Acc(h(b, start + s, g * d + i));
        });
      });
      team.team_barrier();

      for (int iteration = 0; iteration < iterations; ++iteration) {
        // Compose: the last active thread's map is never used, so it composes only to fill the
        // linearisation cache. Its chunk may be shorter than L.
        const bool cached = plan.cache_linearization;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cached ? active : active - 1), [&](int p) {
          for_lanes([&](int lane, int g) {
            Acc* map = maps + (std::size_t(p) * lanes + lane) * MapSize;
            map_identity<Acc, D>(d, map);
            for (int s = p * L; s < Kokkos::min(length, (p + 1) * L); ++s) {
              Acc f[D], J[D * D];
              cell.linearize(g, s == 0 ? carry + lane * d : state(s - 1, lane), input(s, lane), f, J);
              map_push_step<Acc, D>(LinearizedStep<Acc>{J, f, state(s, lane), d}, 0, 0, 0, d, map);
              if (cached) store_linearization(d, f, J, linearization(s, lane));
            }
            if (p < active - 1)
              for (int i = 0; i < d; ++i) boundary[(std::size_t(p) * lanes + lane) * d + i] = state((p + 1) * L - 1, lane)[i];
          });
        });
        team.team_barrier();
        // Re-run: delta enters thread p through the maps of threads 0 .. p-1 (delta = 0 at the window start).
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, active), [&](int p) {
          for_lanes([&](int lane, int g) {
            Acc delta[D] = {}, next[D], previous[D];
            for (int q = 0; q < p; ++q) {
              map_apply<Acc, D>(d, maps + (std::size_t(q) * lanes + lane) * MapSize, delta, next);
              for (int i = 0; i < d; ++i) delta[i] = next[i];
            }
            const Acc* entering = p == 0 ? carry + lane * d : boundary + (std::size_t(p - 1) * lanes + lane) * d;
            for (int i = 0; i < d; ++i) previous[i] = entering[i];
            for (int s = p * L; s < Kokkos::min(length, (p + 1) * L); ++s) {
              // (f, J) at the iterate: the compose phase's when cached (the same arguments).
              Acc f[D], J[D * D];
              if (cached) load_linearization(d, linearization(s, lane), f, J);
              else cell.linearize(g, previous, input(s, lane), f, J);
              Acc* x = state(s, lane);
              small_matvec(d, J, delta, next, false);
              for (int i = 0; i < d; ++i) {
                delta[i] = next[i] + f[i] - x[i];
                previous[i] = x[i];
                x[i] += omega * delta[i];
              }
            }
          });
        });
        team.team_barrier();
      }

      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, length), [&](int s) {
        for_lanes([&](int lane, int g) {
          for (int i = 0; i < d; ++i) h(b, start + s, g * d + i) = typename HView::value_type(state(s, lane)[i]);
        });
      });
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, lanes), [&](int lane) {
        for (int i = 0; i < d; ++i) carry[lane * d + i] = state(length - 1, lane)[i];
      });
      team.team_barrier();
    }
  }
};

template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
void fused_newton(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const H0View& h0,
                  const NewtonConfig& config, const ScanShape& shape) {
  if (shape.batch == 0 || shape.steps == 0 || shape.groups == 0) return;
  const FusedPlan plan = plan_fused<Cell, Acc>(space, shape, config);
  const int tiles = int(ceil_div(shape.groups, plan.lanes));
  using functor_t = FusedNewton<Acc, ExecSpace, Cell, UView, HView, H0View>;
  const functor_t functor{cell,  u, h, h0, plan, shape, cell.inputs_per_group(), config.max_iters, Acc(config.omega),
                          config.initial_guess, tiles};
  const auto scratch = Kokkos::PerTeam(functor_t::scratch_view::shmem_size(functor.scratch_count()));
  // The team size limit with this scratch, asked before a policy of the planned size exists.
  const int team_max = Kokkos::TeamPolicy<ExecSpace>(space, shape.batch * tiles, 1, plan.vector_length)
                           .set_scratch_size(0, scratch)
                           .team_size_max(functor, Kokkos::ParallelForTag{});
  if (plan.team_chunks > team_max)
    throw_invalid("paraseq::newton_solve", config.fused_team_threads > 0 ? "config.fused_team_threads" : "config.fused_window",
                  std::to_string(plan.team_chunks) + " threads per team (window of " + std::to_string(plan.window) +
                      " steps)",
                  "at most " + std::to_string(team_max) + " threads per team on this space with this scratch");
  Kokkos::TeamPolicy<ExecSpace> policy(space, shape.batch * tiles, plan.team_chunks, plan.vector_length);
  policy.set_scratch_size(0, scratch);
  Kokkos::parallel_for("paraseq::newton_fused", policy, functor);
}

} // namespace paraseq::detail
