#pragma once
// The backward pass of newton_solve: gradients of a loss L through the converged trajectory.
//
//   newton_backward(space, cell, u, h, g, du, dparams [, h0 [, dh0 [, config]]])
//
//   u, h, h0: the forward's inputs and result;  g = dL/dh: [B, T, N]
//   du:      [B, T, cell.input_size()]   dL/du (written)
//   dparams: [cell.param_count()]        dL/d(recurrent parameters), in the cell's slot order (written)
//   dh0:     [B, N] dL/dh0, or NoGradient{} to skip it
//   config:  the forward's NewtonConfig: its mode picks how the adjoint runs (below)
// newton_backward<Modes>(...) compiles the adjoint kernels of the CompiledNewtonModes Modes alone (a
// cell of your own; the forward's note in newton.hpp).
//
// Method (no differentiation through the Newton iterations): with A_t = df/dh(h_{t-1}, u_t) at the
// converged h, the adjoint mu_t = g_t + A_{t+1}^T mu_{t+1}, mu_{T-1} = g_{T-1}, is a linear recurrence
// run backwards in time, and dL/du_t = (df/du)^T mu_t, dL/dtheta = sum over t of (df/dtheta)^T mu_t,
// dL/dh0 = A_0^T mu_0. No Jacobian is saved; every one is recomputed from (h, u). The mode of the
// config (newton.hpp's rule for automatic) picks the kernels:
//   fused, sequential  one kernel (newton_fused_adjoint.hpp) walks the windows from the last to the
//                      first and evaluates the cell's vector-Jacobian products as the adjoint
//                      passes, so mu is never stored (sequential: one thread per group and window;
//                      a cell with a team step: one team per group, SequentialTeamAdjoint)
//   one_pass           the same windows taken by different teams at once, the nu entering each
//                      found by a look-back through the later windows' published maps
//                      (newton_one_pass_adjoint.hpp): u, h and g read once, du written once
//   newton             one reverse ordered scan (config.scan) stores mu, then one kernel evaluates
//                      the vector-Jacobian products at every (b, t, group)
// Parameter sums are per thread (fused), per window (one_pass) or per run of t (newton) and are
// added in a fixed order (sum_partials), with no atomics: the gradients are bitwise reproducible.
//
// Memory. Saved between forward and backward: u and h (and h0), nothing else. Peak extra memory of
// the backward: fused, B * P * param_count values of Acc (the per-thread parameter sums, P <= 16
// threads per group; a cell with a team step in the sequential mode, B * param_count); one_pass,
// ceil(T / W) * B * param_count values of Acc (a row per window of W steps, the fused plan's) and
// ceil(T / W) * B * groups * (d^2 + 2d) for the windows' maps and nus; newton, mu (B*T*N values of
// h's type), B * runs * param_count values of Acc (at most 2^22 unless B * param_count is more: one
// run per batch element) and the ordered scan's chunk buffers, at most B * groups * G * (d^2 + 2d)
// values of Acc for its G time chunks (0 when G = 1). The rows of parameter sums are added in
// blocks of at least 64 rows, whose sums take ceil(rows / r) * param_count doubles (r >= 64 rows
// per block; at most about max(param_count, 65536) of them).

#include <paraseq/core/errors.hpp>
#include <paraseq/core/fill.hpp>
#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_fused_adjoint.hpp>
#include <paraseq/solvers/newton_kernels.hpp>
#include <paraseq/solvers/newton_one_pass_adjoint.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <type_traits>

namespace paraseq {

namespace detail {

// mu_t = g_t + A_{t+1}^T mu_{t+1}; scan step s is time t = T-1-s. Stores mu, and dL/dh0 at t = 0.
template <class Acc, class Cell, class UView, class HView, class H0View, class GView, class MuView, class DH0View>
struct AdjointLinearization {
  static constexpr int D = cell_group_bound<Cell>;
  Cell cell;
  UView u;
  Iterate<HView, H0View> trajectory;
  GView g_in;
  MuView mu;
  DH0View dh0;
  int steps, d;

  // J = df/dh at (h_{t-1}, u_t) for t in [0, T).
  KOKKOS_INLINE_FUNCTION void jacobian(int b, int t, int g, Acc* J) const {
    Acc h_prev[D], in[Cell::max_inputs_per_group], f[D];
    trajectory.template load<Acc>(b, t - 1, g, h_prev);
    gather_inputs<Acc>(cell, u, b, t, g, in);
    cell.linearize(g, h_prev, in, f, J);
  }
  KOKKOS_INLINE_FUNCTION void initial(int, int, Acc* x) const {
    for (int i = 0; i < d; ++i) x[i] = Acc(0);
  }
  KOKKOS_INLINE_FUNCTION void linear(int b, int s, int g, const Acc* x, Acc* y) const {
    const int next = steps - s; // t + 1
    if (next >= steps) {
      for (int i = 0; i < d; ++i) y[i] = Acc(0);
      return;
    }
    Acc J[D * D];
    jacobian(b, next, g, J);
    small_matvec(d, J, x, y, true);
  }
  KOKKOS_INLINE_FUNCTION void affine(int b, int s, int g, const Acc* x, Acc* y) const {
    linear(b, s, g, x, y);
    for (int i = 0; i < d; ++i) y[i] += Acc(g_in(b, steps - 1 - s, g * d + i));
  }
  // The whole map from one Jacobian: L = J_{t+1}^T (column-major, stride MapD), c = g_t.
  template <int MapD>
  KOKKOS_INLINE_FUNCTION void step_map(int b, int s, int g, Acc* map) const {
    const int next = steps - s; // t + 1
    if (next >= steps) {
      for (int j = 0; j < d; ++j)
        for (int i = 0; i < d; ++i) map[j * MapD + i] = Acc(0);
    } else {
      Acc J[D * D];
      jacobian(b, next, g, J);
      for (int j = 0; j < d; ++j)
        for (int i = 0; i < d; ++i) map[j * MapD + i] = J[j * d + i];
    }
    for (int i = 0; i < d; ++i) map[MapD * MapD + i] = Acc(g_in(b, steps - 1 - s, g * d + i));
  }
  KOKKOS_INLINE_FUNCTION void store(int b, int s, int g, const Acc* y) const {
    const int t = steps - 1 - s;
    for (int i = 0; i < d; ++i) mu(b, t, g * d + i) = typename MuView::value_type(y[i]);
    if constexpr (!std::is_same_v<DH0View, NoGradient>) {
      if (t == 0 && dh0.data()) {
        Acc J[D * D], dh[D];
        jacobian(b, 0, g, J);
        small_matvec(d, J, y, dh, true);
        for (int i = 0; i < d; ++i) dh0(b, g * d + i) = typename DH0View::value_type(dh[i]);
      }
    }
  }
};

// The adjoint of the sequential mode for a cell with a team step (newton_kernels.hpp,
// SequentialTeamRecurrence): one team per (batch element, group) walks t from T-1 to 0 with
// mu_t = g_t + J_{t+1}^T mu_{t+1} in team scratch, writes dL/du_t, adds the group's parameter
// gradients into a team-scratch sum (level 1, global memory, where level 0 cannot hold it) and
// writes that sum into the batch element's row of `partial` at the end: no atomics, a fixed order.
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View, class GView, class DUView,
          class PartialView, class DH0View>
struct SequentialTeamAdjoint {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Cell cell;
  UView u;
  HView h;
  H0View h0;
  GView g_in;
  DUView du;
  PartialView partial;
  DH0View dh0;
  int steps, groups, d;
  bool sums_in_level1;

  KOKKOS_INLINE_FUNCTION static std::size_t state_bytes(const Cell& cell, int d) {
    return sizeof(Acc) * std::size_t(cell.team_params_size() + 3 * d + cell.inputs_per_group() + cell.team_work_size());
  }
  KOKKOS_INLINE_FUNCTION static std::size_t sum_bytes(const Cell& cell) {
    return sizeof(Acc) * std::size_t(cell.params_per_group());
  }
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int b = team.league_rank() / groups, g = team.league_rank() % groups, inputs = cell.inputs_per_group();
    Acc* staged = static_cast<Acc*>(team.team_scratch(0).get_shmem(state_bytes(cell, d)));
    Acc* sums = static_cast<Acc*>(team.team_scratch(sums_in_level1 ? 1 : 0).get_shmem(sum_bytes(cell)));
    Acc *previous = staged + cell.team_params_size(), *mu = previous + d, *carry = mu + d, *du_t = carry + d,
        *work = du_t + inputs;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cell.params_per_group()), [&](int k) { sums[k] = Acc(0); });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int i) { carry[i] = Acc(0); });
    cell.stage_team_params(team, g, staged); // ends with a barrier
    for (int t = steps - 1; t >= 0; --t) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int i) {
        const int channel = g * d + i;
        mu[i] = Acc(g_in(b, t, channel)) + carry[i];
        previous[i] = t > 0 ? Acc(h(b, t - 1, channel)) : initial_value<Acc>(h0, b, channel);
      });
      team.team_barrier();
      cell.team_vjp(team, staged, previous, [&](int k) { return Acc(u(b, t, cell.input_column(g, k))); }, mu, carry,
                    du_t, sums, work);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, inputs), [&](int k) {
        du(b, t, cell.input_column(g, k)) = typename DUView::value_type(du_t[k]);
      });
    }
    if constexpr (!std::is_same_v<DH0View, NoGradient>)
      if (dh0.data())
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int i) {
          dh0(b, g * d + i) = typename DH0View::value_type(carry[i]);
        });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cell.params_per_group()),
                         [&](int k) { partial(b, cell.param_index(g, k)) = sums[k]; });
  }
};

// dL/du at every (b, t, group) and the parameter sums of each run of t; run r of batch b covers
// steps [r * run_length, (r + 1) * run_length).
template <class Acc, class Cell, class UView, class HView, class H0View, class MuView, class DUView, class PartialView>
struct LocalGradients {
  static constexpr int D = cell_group_bound<Cell>;
  Cell cell;
  UView u;
  Iterate<HView, H0View> trajectory;
  MuView mu;
  DUView du;
  PartialView partial; // [B * runs, param_count]
  int steps, groups, d, runs, run_length;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int g = int(index % groups), run = int(index / groups % runs), b = int(index / groups / runs);
    Acc sums[Cell::max_params_per_group] = {};
    for (int t = run * run_length; t < Kokkos::min(steps, (run + 1) * run_length); ++t) {
      Acc h_prev[D], in[Cell::max_inputs_per_group], m[D], dh[D], du_local[Cell::max_inputs_per_group],
          dp[Cell::max_params_per_group];
      trajectory.template load<Acc>(b, t - 1, g, h_prev);
      gather_inputs<Acc>(cell, u, b, t, g, in);
      for (int i = 0; i < d; ++i) m[i] = Acc(mu(b, t, g * d + i));
      cell.vjp(g, h_prev, in, m, dh, du_local, dp);
      for (int k = 0; k < cell.inputs_per_group(); ++k)
        du(b, t, cell.input_column(g, k)) = typename DUView::value_type(du_local[k]);
      for (int k = 0; k < cell.params_per_group(); ++k) sums[k] += dp[k];
    }
    for (int k = 0; k < cell.params_per_group(); ++k) partial(std::size_t(b) * runs + run, cell.param_index(g, k)) = sums[k];
  }
};

// How LocalGradients splits each batch element's steps into runs: enough (batch, group, run)
// threads to fill the space, runs of at least 64 steps, and at most gradient_partials_bound partial
// sums in all (B * runs rows of param_count) unless one run per batch element needs more. A run is
// one thread's walk over its steps, so few channels of a long sequence need many runs to fill a
// device: (1, 262144, 1) takes 4096 runs of 64 steps on an H100's 270336 resident threads.
inline constexpr long gradient_partials_bound = 1L << 22;
struct GradientRuns {
  int runs;
  int run_length;
};
template <class ExecSpace>
GradientRuns gradient_runs(const ExecSpace& space, const ScanShape& shape, long param_count) {
  const long batch = std::max<long>(1, shape.batch), threads = batch * std::max(1, shape.groups), T = shape.steps;
  const long by_length = std::max<long>(1, T / 64);
  const long by_memory = std::max<long>(1, gradient_partials_bound / (batch * std::max<long>(1, param_count)));
  const int runs = int(std::clamp<long>(ceil_div(long(space.concurrency()), threads), 1, std::min(by_length, by_memory)));
  return {runs, int(ceil_div(std::max<long>(1, T), runs))};
}

// The backward once its arguments are checked; compiled once per built-in cell, type and space for
// the Views of views.hpp, instantiated where it is called otherwise with the kernels of Modes only.
// A dh0 View without data is NoGradient.
template <class Acc, CompiledNewtonModes Modes = CompiledNewtonModes::all, class ExecSpace, class Cell, class UView, class HView, class GView, class DUView, class DParamView,
          class H0View, class DH0View>
void run_newton_backward(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const GView& g,
                         const DUView& du, const DParamView& dparams, const H0View& h0, const DH0View& dh0,
                         const NewtonConfig& config) {
  using acc_t = Acc;
  using memory_space = typename ExecSpace::memory_space;
  using structure = typename Cell::structure;
  const ScanShape shape = newton_shape(cell, u);
  const long B = shape.batch, T = shape.steps, N = cell.state_size();
  const int d = shape.group_size;
  const Iterate<HView, H0View> trajectory{h, h0, d};
  using partial_view = Kokkos::View<acc_t**, Kokkos::LayoutRight, memory_space>;
  if constexpr (!std::is_same_v<DH0View, NoGradient>)
    if (T == 0 && dh0.data()) detail::fill(space, dh0, 0); // h depends on no h0

  partial_view partial;
  const NewtonMode mode = choose_compiled_newton_mode<Modes, Cell, acc_t>(newton_backward_fn, space, config, shape);
  constexpr bool fused_adjoint = compiles(Modes, CompiledNewtonModes::fused) || compiles(Modes, CompiledNewtonModes::sequential);
  if (mode == NewtonMode::one_pass) {
    if constexpr (compiles(Modes, CompiledNewtonModes::one_pass))
      partial = one_pass_adjoint<acc_t>(space, cell, u, h, h0, g, du, dh0, config, shape);
  } else if (mode == NewtonMode::sequential && has_team_step<Cell>) {
    if constexpr (compiles(Modes, CompiledNewtonModes::sequential) && has_team_step<Cell>) {
      using team_t = SequentialTeamAdjoint<acc_t, ExecSpace, Cell, UView, HView, H0View, GView, DUView, partial_view, DH0View>;
      partial = detail::zeroed_workspace_view<partial_view>(space, "paraseq::newton_param_partials", B, cell.param_count());
      const std::size_t state = team_t::state_bytes(cell, d), sums = team_t::sum_bytes(cell);
      const bool sums_in_level1 = state + sums > team_policy(space, 1, 1).scratch_size_max(0);
      auto policy = team_policy(space, B * shape.groups, team_step_threads<ExecSpace>(d), sums_in_level1 ? state : state + sums);
      if (sums_in_level1) policy.set_scratch_size(1, Kokkos::PerTeam(sums));
      if (B * shape.groups > 0)
        Kokkos::parallel_for("paraseq::newton_sequential_adjoint_teams", policy,
                             team_t{cell, u, h, h0, g, du, partial, dh0, int(T), shape.groups, d, sums_in_level1});
    }
  } else if (mode != NewtonMode::newton) {
    if constexpr (fused_adjoint) {
      FusedPlan plan = plan_fused<Cell, acc_t>(space, shape, config);
      if (mode == NewtonMode::sequential) plan.team_chunks = 1, plan.window = plan.chunk_length;
      const int tiles = int(ceil_div(shape.groups, plan.lanes)), league = shape.batch * tiles;
      auto functor_for = [&](const FusedPlan& chosen, const partial_view& sums) {
        return FusedAdjoint<acc_t, ExecSpace, Cell, UView, HView, H0View, GView, DUView, partial_view, DH0View>{
            cell, u, trajectory, g, du, sums, dh0, chosen, shape, tiles};
      };
      plan = fit_fused_plan<acc_t>(space, plan, league, config, functor_for(plan, {}));
      partial = detail::zeroed_workspace_view<partial_view>(space, "paraseq::newton_param_partials", B * plan.team_chunks,
                                                            cell.param_count());
      if (B * T * shape.groups > 0)
        launch_fused<acc_t>("paraseq::newton_fused_adjoint", space, league, functor_for(plan, partial));
    }
  } else if constexpr (compiles_newton_scans(Modes)) {
    using mu_view = Kokkos::View<typename HView::non_const_value_type***, Kokkos::LayoutRight, memory_space>;
    const auto mu = detail::workspace_view<mu_view>(space, "paraseq::newton_adjoint", B, T, N);
    using adjoint_t = AdjointLinearization<acc_t, Cell, UView, HView, H0View, GView, mu_view, DH0View>;
    ordered_scan<structure, acc_t>(space, shape, adjoint_t{cell, u, trajectory, g, mu, dh0, int(T), d},
                                   newton_scan_config<ExecSpace>(config.scan));

    const GradientRuns split = gradient_runs(space, shape, cell.param_count());
    const int runs = split.runs, run_length = split.run_length;
    partial = detail::zeroed_workspace_view<partial_view>(space, "paraseq::newton_param_partials", B * runs,
                                                          cell.param_count());
    using local_t = LocalGradients<acc_t, Cell, UView, HView, H0View, mu_view, DUView, partial_view>;
    Kokkos::parallel_for("paraseq::newton_local_gradients",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * runs * shape.groups),
                         local_t{cell, u, trajectory, mu, du, partial, int(T), shape.groups, d, runs, run_length});
  }
  sum_partials(space, partial, dparams);
}

// The adjoint recurrence of the compiled instances (cmake/paraseqInstances.cmake).
template <class T, class Cell, class ExecSpace>
using compiled_adjoint_t =
    AdjointLinearization<T, Cell, InView<T, 3, ExecSpace>, InView<T, 3, ExecSpace>, InView<T, 2, ExecSpace>,
                         InView<T, 3, ExecSpace>, Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>,
                         OutView<T, 2, ExecSpace>>;

template <class Acc, class ExecSpace, class Cell, class UView, class HView, class GView, class DUView, class DParamView,
          class H0View, class DH0View>
constexpr bool newton_backward_is_compiled() {
  using T = typename UView::non_const_value_type;
  return std::is_same_v<Acc, T> && is_compiled_cell_v<Cell, T, typename ExecSpace::memory_space> &&
         converts_to_compiled_view<UView, T, ExecSpace, false>() && converts_to_compiled_view<HView, T, ExecSpace, false>() &&
         (std::is_same_v<H0View, ZeroInitialState> || converts_to_compiled_view<H0View, T, ExecSpace, false>()) &&
         converts_to_compiled_view<GView, T, ExecSpace, false>() && converts_to_compiled_view<DUView, T, ExecSpace, true>() &&
         converts_to_compiled_view<DParamView, T, ExecSpace, true>() &&
         (std::is_same_v<DH0View, NoGradient> || converts_to_compiled_view<DH0View, T, ExecSpace, true>());
}

// The compiled instances are overloads of this (paraseq/eti/newton_backward_instances.hpp).
template <class... Arguments>
void compiled_newton_backward(const Arguments&...) = delete;

} // namespace detail

} // namespace paraseq

#if PARASEQ_ETI
#include <paraseq/eti/newton_backward_instances.hpp>
#endif

namespace paraseq {

// newton_backward<Modes>(...) compiles the adjoint kernels of Modes alone where the solver is
// instantiated; newton_backward(...) compiles every family.
template <CompiledNewtonModes Modes, class Acc = void, class ExecSpace, class Cell, class UView, class HView, class GView, class DUView,
          class DParamView, class H0View = ZeroInitialState, class DH0View = NoGradient>
void newton_backward(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const GView& g,
                     const DUView& du, const DParamView& dparams, const H0View& h0 = {}, const DH0View& dh0 = {},
                     const NewtonConfig& config = {}) {
  constexpr const char* fn = detail::newton_backward_fn;
  const Kokkos::Profiling::ScopedRegion region(fn);
  using acc_t = detail::accumulation_t<Acc, UView>;
  detail::check_cell_gradient<Cell, acc_t>();
  detail::check_newton_views<ExecSpace>(fn, cell, u, h, h0);
  static_assert(Kokkos::is_view_v<GView> && GView::rank == 3, "paraseq::newton_backward: g must be a [B, T, N] View");
  static_assert(Kokkos::is_view_v<DUView> && DUView::rank == 3, "paraseq::newton_backward: du must be a [B, T, U] View");
  static_assert(Kokkos::is_view_v<DParamView> && DParamView::rank == 1,
                "paraseq::newton_backward: dparams must be a rank-1 View of cell.param_count() values");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename GView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename DUView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename DParamView::memory_space>::accessible,
                "paraseq::newton_backward: g, du and dparams must be accessible from the execution space");
  const long B = long(u.extent(0)), T = long(u.extent(1)), N = cell.state_size();
  detail::require_extents(fn, "g", g, {B, T, N}, "the shape of h");
  detail::require_extents(fn, "du", du, {B, T, cell.input_size()}, "the shape of u");
  detail::require_extents(fn, "dparams", dparams, {cell.param_count()}, "[cell.param_count()]");
  if constexpr (!std::is_same_v<DH0View, NoGradient>) {
    static_assert(Kokkos::is_view_v<DH0View> && DH0View::rank == 2, "paraseq::newton_backward: dh0 must be a [B, N] View");
    detail::require_extents(fn, "dh0", dh0, {B, N}, "[B, cell.state_size()]");
  }

  detail::check_newton_config(config);
  constexpr bool compiled =
      detail::newton_backward_is_compiled<acc_t, ExecSpace, Cell, UView, HView, GView, DUView, DParamView, H0View, DH0View>();
  detail::check_header_path_allowed<compiled || !detail::is_builtin_cell_v<Cell>, Cell, UView, HView, GView, DUView>();
  if constexpr (compiled) {
    using T = typename UView::non_const_value_type;
    InView<T, 2, ExecSpace> h0_view;
    if constexpr (!std::is_same_v<H0View, ZeroInitialState>) h0_view = h0;
    OutView<T, 2, ExecSpace> dh0_view;
    if constexpr (!std::is_same_v<DH0View, NoGradient>) dh0_view = dh0;
    const InView<T, 3, ExecSpace> u_view = u, h_view = h, g_view = g;
    const OutView<T, 3, ExecSpace> du_view = du;
    const OutView<T, 1, ExecSpace> dparams_view = dparams;
    // The compiled instances hold every family: a restricted call runs the mode it would compile.
    NewtonConfig run_config = config;
    if constexpr (Modes != CompiledNewtonModes::all)
      run_config.mode = detail::choose_compiled_newton_mode<Modes, Cell, T>(fn, space, config, detail::newton_shape(cell, u));
    if constexpr (requires {
                    detail::compiled_newton_backward(space, cell, u_view, h_view, g_view, du_view, dparams_view, h0_view,
                                                     dh0_view, run_config);
                  })
      detail::compiled_newton_backward(space, cell, u_view, h_view, g_view, du_view, dparams_view, h0_view, dh0_view,
                                       run_config);
    else
      detail::run_newton_backward<T>(space, cell, u_view, h_view, g_view, du_view, dparams_view, h0_view, dh0_view,
                                     run_config);
  } else {
    detail::run_newton_backward<acc_t, Modes>(space, cell, u, h, g, du, dparams, h0, dh0, config);
  }
}

template <class Acc = void, class ExecSpace, class Cell, class UView, class HView, class GView, class DUView,
          class DParamView, class H0View = ZeroInitialState, class DH0View = NoGradient>
void newton_backward(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const GView& g,
                     const DUView& du, const DParamView& dparams, const H0View& h0 = {}, const DH0View& dh0 = {},
                     const NewtonConfig& config = {}) {
  newton_backward<CompiledNewtonModes::all, Acc>(space, cell, u, h, g, du, dparams, h0, dh0, config);
}

} // namespace paraseq
