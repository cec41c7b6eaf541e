#pragma once
// The fused adjoint of newton_backward.hpp: one kernel computes dL/du, the parameter sums and dL/dh0
// at the converged trajectory, reading u, h and g once and writing du once (no adjoint buffer).
//
// With nu_t = J_t^T mu_t, J_t = df/dh(h_{t-1}, u_t), the adjoint mu_t = g_t + J_{t+1}^T mu_{t+1} reads
//     mu_t = g_t + nu_{t+1},   nu_t = J_t^T (g_t + nu_{t+1}),   nu_T = 0,
// and dL/dh0 = nu_0: an affine recurrence run backwards in time. Teams are laid out as in the
// forward (newton_fused.hpp): a [P][lanes] grid of threads over the windows of one batch element
// and a tile of groups, each thread holding L steps of one group in registers. The windows run from
// the last to the first; per window:
//   compose  each thread composes the maps nu_{t+1} -> nu_t of its steps (latest first) into one
//            map, published in team scratch;
//   re-run   each thread applies the maps of the threads after it to the nu entering the window
//            (the carry from the later window) and walks its steps backwards: the cell's
//            vector-Jacobian product at mu_t gives dL/du_t, the parameter terms and nu_t at once.
// Each thread sums its parameter terms over all its steps; newton_backward adds the per-thread sums
// in a fixed order.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton_config.hpp>
#include <paraseq/solvers/newton_fused.hpp>
#include <paraseq/solvers/newton_kernels.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace paraseq::detail {

// The step nu_{t+1} -> J_t^T (g_t + nu_{t+1}) for the map-composition helpers of the ordered scan.
template <class Acc, int D>
struct AdjointStep {
  const Acc* J;
  const Acc* g;
  int d;
  KOKKOS_INLINE_FUNCTION void linear(int, int, int, const Acc* x, Acc* y) const { small_matvec(d, J, x, y, true); }
  KOKKOS_INLINE_FUNCTION void affine(int, int, int, const Acc* x, Acc* y) const {
    Acc shifted[D];
    for (int i = 0; i < d; ++i) shifted[i] = x[i] + g[i];
    small_matvec(d, J, shifted, y, true);
  }
};

// How an adjoint window learns the nu entering it at its end (the hooks of FusedAdjoint::run_window).
// The fused mode's: a team walks its windows from the last to the first, and each window's first
// thread hands the nu leaving it to the window before it in its lane's carry. The one-pass mode
// replaces it by a look-back across teams (OnePassAdjointChain, newton_one_pass_adjoint.hpp).
struct AdjointWindowsInOrder {
  static constexpr bool needs_window_map = false; // the window's own map (composed over all threads)
  // After the compose barrier: the lane's carry holds the nu entering the window (here: already).
  template <class Member, class MapOf, class Acc>
  KOKKOS_INLINE_FUNCTION void enter(const Member&, const FusedThread&, const MapOf&, int, int, Acc*) const {}
  // `nu` leaves the window's first step (its first thread, after the team's last read of the carry).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void leave(const Acc* nu, int d, Acc* carry) const {
    for (int i = 0; i < d; ++i) carry[i] = nu[i];
  }
};

template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View, class GView, class DUView,
          class PartialView, class DH0View>
struct FusedAdjoint {
  static constexpr int D = cell_group_bound<Cell>;
  static constexpr int Inputs = Cell::max_inputs_per_group;
  static constexpr int Params = Cell::max_params_per_group;
  static constexpr int MapSize = map_size<D>;
  static constexpr int Capacity = fused_chunk_capacity<Cell, ExecSpace>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using scratch_view = Kokkos::View<Acc*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using launch_bounds = void; // fused_launch_bounds

  Cell cell;
  UView u;
  Iterate<HView, H0View> trajectory;
  GView g_in;
  DUView du;
  PartialView partial; // [B * P, cell.param_count()]: thread p's sums in row b * P + p (the one-pass
                       // kernel writes rows of its own: newton_one_pass_adjoint.hpp)
  DH0View dh0;
  FusedPlan plan;
  ScanShape shape;
  int tiles;

  // A map per thread and the carry per lane: [P][lanes][MapSize] + [lanes][D].
  KOKKOS_INLINE_FUNCTION std::size_t scratch_count() const {
    return std::size_t(plan.lanes) * (std::size_t(plan.team_chunks) * MapSize + D);
  }

  // The team's scratch as `me` sees it: the threads' maps and its lane's carry.
  struct Scratch {
    Acc* maps;
    Acc* carry;
  };
  KOKKOS_INLINE_FUNCTION Scratch scratch_of(const member_type& team, const FusedThread& me) const {
    return scratch_at(scratch_view(team.team_scratch(0), scratch_count()).data(), me);
  }
  // The same at `base` (scratch_count() values; a one-pass kernel's team scratch begins with them).
  KOKKOS_INLINE_FUNCTION Scratch scratch_at(Acc* base, const FusedThread& me) const {
    return {base, base + std::size_t(plan.team_chunks) * plan.lanes * MapSize + me.lane * D};
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const FusedThread me = fused_thread(team, plan, tiles, shape.groups);
    const Scratch shared = scratch_of(team, me);
    const int d = fused_group_size<Cell>(shape);
    Acc sums[Params] = {};
    if (me.live && me.p == 0)
      for (int i = 0; i < d; ++i) shared.carry[i] = Acc(0); // nu_T
    for (int w = int(ceil_div(shape.steps, plan.window)) - 1; w >= 0; --w)
      run_window(team, me, shared, w * plan.window, AdjointWindowsInOrder{}, sums);
    if (me.live)
      for (int k = 0; k < cell.params_per_group(); ++k)
        partial(std::size_t(me.b) * plan.team_chunks + me.p, cell.param_index(me.g, k)) = sums[k];
  }

  // Runs the window that begins at `start`: writes its dL/du (and dL/dh0 in the first window) and
  // adds this thread's parameter terms to `sums`. `chain` says what nu enters the window.
  template <class Chain>
  KOKKOS_INLINE_FUNCTION void run_window(const member_type& team, const FusedThread& me, const Scratch& shared,
                                         int start, const Chain& chain, Acc* sums) const {
    const int d = fused_group_size<Cell>(shape);
    const int lane = me.lane, p = me.p, b = me.b, g = me.g;
    auto map_of = [&](int q) { return shared.maps + (std::size_t(q) * plan.lanes + lane) * MapSize; };
    const FusedChunk chunk = fused_chunk(plan, shape.steps, start, p);
    const int active = chunk.active, first = chunk.first, count = chunk.count;
    const bool working = me.live && count > 0;

    // This thread's chunk: inputs, the state before each step and dL/dh of each step.
    Acc in[Capacity][Inputs], before[Capacity][D], grad[Capacity][D];
    if (working) {
      const auto inputs = chunk_rows(u, b, first), states = chunk_rows(trajectory.h, b, first);
      const auto grads = chunk_rows(g_in, b, first);
      PARASEQ_UNROLL
      for (int s = 0; s < Capacity; ++s) {
        if (s >= count) continue; // unrolled: a guard, not a loop exit
        for (int k = 0; k < cell.inputs_per_group(); ++k) in[s][k] = Acc(inputs(s, cell.input_column(g, k)));
        // The state before step t (h0 at t = 0), loaded with this kernel's compile-time d.
        const int t = first + s;
        if (t == 0) load_initial<Acc>(trajectory.h0, b, g * d, d, before[s]);
        else if (s == 0)
          for (int i = 0; i < d; ++i) before[s][i] = Acc(trajectory.h(b, t - 1, g * d + i));
        else
          for (int i = 0; i < d; ++i) before[s][i] = Acc(states(s - 1, g * d + i));
        for (int i = 0; i < d; ++i) grad[s][i] = Acc(grads(s, g * d + i));
      }
    }
    // Compose, latest step first. The first thread's map is used only as part of the window's.
    if (working && (p > 0 || Chain::needs_window_map)) {
      Acc map[MapSize];
      map_identity<Acc, D>(d, map);
      PARASEQ_UNROLL
      for (int s = Capacity - 1; s >= 0; --s) {
        if (s >= count) continue;
        Acc f[D], J[D * D];
        repeated_linearize(cell, g, before[s], in[s], f, J);
        map_push_step<Acc, D>(AdjointStep<Acc, D>{J, grad[s], d}, 0, 0, 0, d, map);
      }
      for (int k = 0; k < MapSize; ++k) map_of(p)[k] = map[k];
    }
    team.team_barrier();
    chain.enter(team, me, map_of, active, d, shared.carry);
    // Re-run: nu enters thread p from the window's carry through the maps of threads after it.
    Acc nu[D];
    if (working) {
      const auto du_rows = chunk_rows(du, b, first);
      Acc next[D];
      for (int i = 0; i < d; ++i) nu[i] = shared.carry[i];
      for (int q = active - 1; q > p; --q) {
        map_apply<Acc, D>(d, map_of(q), nu, next);
        for (int i = 0; i < d; ++i) nu[i] = next[i];
      }
      PARASEQ_UNROLL
      for (int s = Capacity - 1; s >= 0; --s) {
        if (s >= count) continue;
        Acc mu[D], du_step[Inputs], dp[Params];
        for (int i = 0; i < d; ++i) mu[i] = grad[s][i] + nu[i];
        repeated_vjp(cell, g, before[s], in[s], mu, nu, du_step, dp);
        for (int k = 0; k < cell.inputs_per_group(); ++k)
          du_rows(s, cell.input_column(g, k)) = typename DUView::value_type(du_step[k]);
        for (int k = 0; k < cell.params_per_group(); ++k) sums[k] += dp[k];
      }
    }
    // Everyone has read the carry and the maps before the first thread hands its nu on.
    team.team_barrier();
    if (working && p == 0) {
      chain.leave(nu, d, shared.carry);
      if constexpr (!std::is_same_v<DH0View, NoGradient>)
        if (start == 0 && dh0.data())
          for (int i = 0; i < d; ++i) dh0(b, g * d + i) = typename DH0View::value_type(nu[i]);
    }
  }
};

} // namespace paraseq::detail

