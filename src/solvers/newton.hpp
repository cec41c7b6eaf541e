#pragma once
// The Newton (DEER / ParaRNN) solver for nonlinear recurrences h_t = f(h_{t-1}, u_t), forward:
//
//   newton_solve(space, cell, u, h [, config [, h0 [, stats]]])
//
//   cell: a NewtonCell (cell.hpp), e.g. ParaGRU or ParaLSTM (cells.hpp)
//   u:  [B, T, cell.input_size()]  pre-projected inputs (input_projection.hpp)
//   h:  [B, T, cell.state_size()]  output (and the initial guess with InitialGuess::given)
//   h0: [B, cell.state_size()]     the state before t = 0 (default ZeroInitialState: zero)
// Views of any layout in memory the space can access; the precision Acc (first template argument,
// default u's value type) is the precision of every on-chip value.
//
// One Newton iteration linearises f around the current iterate h^k and solves, for delta,
//     delta_t = A_t delta_{t-1} + (f(h^k_{t-1}, u_t) - h^k_t),  delta_{-1} = 0,   A_t = df/dh(h^k_{t-1}, u_t)
// then sets h^{k+1} = h^k + omega delta. The ordered scan (core/ordered_scan.hpp) runs it with
// operands built on the fly by NewtonLinearization from (u, h^k): no Jacobian is stored.
// Each pass reads h^k from one buffer and writes h^{k+1} to another (h and a work buffer in turn):
// the engine reads h^k_{s-1} at sub-chunk, window and time-chunk boundaries from other threads,
// so writing in place would race.
//
// The built-in cells over core/views.hpp's View types run the instances compiled into the paraseq
// library; a cell of your own compiles the solver where it is used (docs/architecture.md), every mode's
// kernels unless the call names the ones it needs: newton_solve<CompiledNewtonModes::fused>(...).
//
// Modes (NewtonConfig::mode):
//   sequential  the loop over t, one thread per (batch, group); the reference and, when B x groups
//               fills the space, the fastest (1/K of Newton's work)
//   newton      one ordered scan per iteration over the whole sequence
//   fused       one kernel; each team takes a tile of groups and walks the sequence in windows of W
//               steps: each thread reads its chunk of the window's u once into registers, the team
//               runs all K iterations on chip (the window's linear solves are the scan's compose /
//               carry / re-run, maps exchanged in scratch), and writes h once. The state entering a
//               window is the final state of the previous one: for T <= W this is Newton on the
//               whole sequence; for T > W each window is a shorter Newton problem from that start.
//               With residual_atol a window stops once its own max |F| <= atol (early exit: one
//               team reduction per iteration, newton_fused.hpp); stats.iterations is then the most
//               iterations any window ran.
//   one_pass    the newton mode's mathematics in one kernel (newton_one_pass.hpp): a team per window
//               of W steps (the fused plan's), batch element and tile, all windows at once; each
//               reads its u once, keeps the iterate on chip for all K iterations and writes h once;
//               the delta entering a window in each iteration comes from a decoupled look-back
//               through the windows' published maps. Exact Jacobian, no Picard, no residual_atol.
//   automatic   sequential for a cell that declares newton_may_diverge (cell.hpp; ParaSLSTM), and
//               sequential if B x groups x r >= space.concurrency(), r being Newton's work per step
//               relative to the loop (measured: 2.5 K on hosts; 1 on devices until measured; or
//               config.auto_work_ratio); otherwise, if the config allows the fused kernels (exact
//               Jacobian, no Picard): on a host fused if the sequence fits one window; on a device
//               fused if B x groups x 215 >= space.concurrency(), else one_pass from 16 groups on
//               without residual_atol, else fused if B x groups x 1536 >= space.concurrency();
//               otherwise newton.
//
// Non-finite inputs: a NaN or Inf in u at step t makes h of that batch element non-finite from t
// on (other batch elements are unaffected) and its residual infinite; with residual_fail set the
// solve throws NewtonDivergenceError instead. It is thrown once the solve is done: h holds the result
// that failed the check and stats, when given, are filled, so a caller can catch it and read them.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/fill.hpp>
#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/core/team_policy.hpp>
#include <paraseq/core/views.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton_config.hpp>
#include <paraseq/solvers/newton_fused.hpp>
#include <paraseq/solvers/newton_kernels.hpp>
#include <paraseq/solvers/newton_one_pass.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace paraseq {

namespace detail {

// Newton does r times the loop's work per step but spreads it over all threads, the loop over
// B x groups of them: the loop wins when B x groups x r >= concurrency. r was measured with
// bench_newton (OpenMP, 2 cores, ParaGRU): 2.3 K on hosts. On devices r is not measured yet and
// taken as 1, i.e. the loop only when B x groups alone fills the device.
template <class ExecSpace>
double newton_work_ratio(const NewtonConfig& config) {
  if (config.auto_work_ratio > 0) return config.auto_work_ratio;
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  return on_host ? 2.5 * std::max(1, config.max_iters) : 1.0;
}

// Whether the fused kernel can run the config: exact Jacobian, no Picard sweeps (residual_atol stops
// each window on its own: newton_fused.hpp).
inline bool is_fusable(const NewtonConfig& config) {
  return config.jacobian == NewtonJacobian::exact && config.picard_iters == 0 && !config.picard_adapt;
}

template <class Cell, class Acc, class ExecSpace>
NewtonMode choose_newton_mode(const ExecSpace& space, const NewtonConfig& config, const ScanShape& shape) {
  if (config.mode != NewtonMode::automatic) return config.mode;
  // Its K iterations may leave NaN or values far off without a word (with residual_fail unset).
  if constexpr (newton_may_diverge<Cell>) return NewtonMode::sequential;
  if (double(shape.batch) * shape.groups * newton_work_ratio<ExecSpace>(config) >= double(space.concurrency()))
    return NewtonMode::sequential;
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  // On a device, a cell with a team step (cell.hpp; the head GRU) on groups of 8 or more channels
  // walks t with one team per group: every parallel-in-time mode costs O(d^3) per step and group
  // there (the Jacobian's products, the maps' composition) in arrays of d x d values per thread,
  // which a GPU keeps in local memory; the team step costs O(d^2), spread over d threads. A rule
  // from operation counts: perf_tests' gru_heads_forward times every mode at the head shapes.
  if constexpr (has_team_step<Cell> && !on_host)
    if (shape.group_size >= 8) return NewtonMode::sequential;
  if (!is_fusable(config)) return NewtonMode::newton;
  if (on_host) return shape.steps <= plan_fused<Cell, Acc>(space, shape, config).window ? NewtonMode::fused : NewtonMode::newton;
  // A device runs the fused kernel with at most 16 threads per group, one team per batch element
  // and tile, walking the windows one after another: its time grows with T alone (about 58 ns per
  // step for K = 3 on the H200, ParaGRU, fp32, from 64 to 512 groups) until B x groups fills the
  // device (15.5 ps per element at 16384 groups). The one-pass mode runs the windows at once, so its
  // time grows with B x groups x T (about 46 ps per element from 64 to 16384 groups): it is the
  // faster below about 58 ns / 46 ps = 1260 groups, 1/215 of the H200's resident threads (at 256
  // groups 0.82 ms against 3.81 ms; at 16384, 2.96 ms against 1.04 ms; 2026-12-02). It runs no
  // early exit, so residual_atol keeps the fused and newton modes: those cross near 175 groups of a
  // 65536-step sequence, 1/1536 of the resident threads (fused 3.6 ms against 5.2 ms at 256 groups,
  // 13.7 ms against 0.56 ms at one). Below 16 groups the newton mode's scans stay (the one-pass
  // mode was not measured there). docs/performance.md has the measurements.
  const double groups = double(shape.batch) * shape.groups, resident = double(space.concurrency());
  if (groups * 215 >= resident) return NewtonMode::fused;
  if (groups >= 16 && !config.residual_atol) return NewtonMode::one_pass;
  return groups * 1536 >= resident ? NewtonMode::fused : NewtonMode::newton;
}

// The kernel family that runs a (non-automatic) mode with the config's Jacobian. A diagonal cell's
// quasi Jacobian is its exact one: the same scan.
template <class Structure>
constexpr CompiledNewtonModes kernel_family(NewtonMode mode, NewtonJacobian jacobian) {
  if (mode == NewtonMode::sequential) return CompiledNewtonModes::sequential;
  if (mode == NewtonMode::fused) return CompiledNewtonModes::fused;
  if (mode == NewtonMode::one_pass) return CompiledNewtonModes::one_pass;
  return jacobian == NewtonJacobian::quasi && !std::is_same_v<Structure, Diagonal> ? CompiledNewtonModes::newton_quasi
                                                                                   : CompiledNewtonModes::newton;
}

// Whether Modes compiles the newton mode's scans for either Jacobian (and the adjoint's reverse scan).
constexpr bool compiles_newton_scans(CompiledNewtonModes set) {
  return compiles(set, CompiledNewtonModes::newton) || compiles(set, CompiledNewtonModes::newton_quasi);
}

// The scan shape of a solve: B, T and the cell's groups.
template <class Cell, class UView>
ScanShape newton_shape(const Cell& cell, const UView& u) {
  const int N = cell.state_size(), d = cell_group_size(cell);
  return ScanShape{int(u.extent(0)), int(u.extent(1)), N == 0 ? 0 : N / d, d};
}

inline std::string compiled_modes_text(CompiledNewtonModes set) {
  std::string text;
  auto add = [&](CompiledNewtonModes family, const char* name) {
    if (compiles(set, family)) text += (text.empty() ? "" : " | ") + std::string("CompiledNewtonModes::") + name;
  };
  add(CompiledNewtonModes::sequential, "sequential");
  add(CompiledNewtonModes::newton, "newton");
  add(CompiledNewtonModes::newton_quasi, "newton_quasi");
  add(CompiledNewtonModes::fused, "fused");
  add(CompiledNewtonModes::one_pass, "one_pass");
  return text;
}

// The mode a call with the compiled families Modes runs: choose_newton_mode's, if compiled; for the
// automatic mode otherwise the first compiled of newton, fused (if the config allows it) and
// sequential. A mode the config names that is not compiled is an error.
template <CompiledNewtonModes Modes, class Cell, class Acc, class ExecSpace>
NewtonMode choose_compiled_newton_mode(const char* fn, const ExecSpace& space, const NewtonConfig& config,
                                       const ScanShape& shape) {
  using structure = typename Cell::structure;
  const NewtonMode chosen = choose_newton_mode<Cell, Acc>(space, config, shape);
  auto compiled = [&](NewtonMode mode) { return compiles(Modes, kernel_family<structure>(mode, config.jacobian)); };
  if (compiled(chosen)) return chosen;
  if (config.mode == NewtonMode::automatic) {
    if (compiled(NewtonMode::newton)) return NewtonMode::newton;
    if (compiled(NewtonMode::fused) && is_fusable(config)) return NewtonMode::fused;
    if (compiled(NewtonMode::sequential)) return NewtonMode::sequential;
  }
  constexpr const char* mode_names[] = {"automatic", "newton", "fused", "sequential", "one_pass"};
  throw_invalid(fn, "config.mode",
                std::string("NewtonMode::") + mode_names[int(config.mode)] +
                    (config.jacobian == NewtonJacobian::quasi ? " with NewtonJacobian::quasi" : ""),
                "a mode that this call compiles (" + compiled_modes_text(Modes) + ")");
}

// The checks newton_solve and newton_backward share (h is the output of one, an input of the other).
template <class ExecSpace, class Cell, class UView, class HView, class H0View>
void check_newton_views(const char* fn, const Cell& cell, const UView& u, const HView& h, const H0View& h0) {
  static_assert(Kokkos::is_execution_space_v<ExecSpace>,
                "paraseq::newton_solve / newton_backward: the first argument must be a Kokkos execution space instance");
  static_assert(Kokkos::is_view_v<UView> && UView::rank == 3,
                "paraseq::newton_solve / newton_backward: u must be a [B, T, U] Kokkos::View");
  static_assert(Kokkos::is_view_v<HView> && HView::rank == 3,
                "paraseq::newton_solve / newton_backward: h must be a [B, T, N] Kokkos::View");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename UView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename HView::memory_space>::accessible,
                "paraseq::newton_solve / newton_backward: u and h must be accessible from the execution space");
  cell.check(fn);
  const long B = long(u.extent(0)), T = long(u.extent(1)), N = cell.state_size();
  require_extents(fn, "u", u, {B, T, cell.input_size()}, "[B, T, cell.input_size()]");
  require_extents(fn, "h", h, {B, T, N}, "[B, T, cell.state_size()] with B, T from u");
  using structure = typename Cell::structure;
  if constexpr (declares_group_size<Cell>) {
    const long d = cell_group_size(cell);
    if (d < 1 || d > structure::max_group_size || N % d != 0)
      throw_invalid(fn, "cell", "state size " + std::to_string(N) + " in groups of " + std::to_string(d),
                    "groups of 1 to " + std::to_string(structure::max_group_size) + " channels that divide the state");
  } else if constexpr (is_dense_v<structure>) {
    if (N > structure::max_group_size || N < 1)
      throw_invalid(fn, "cell", "state size " + std::to_string(N),
                    "1 <= N <= " + std::to_string(structure::max_group_size) + " for the cell's dense Jacobian");
  } else if (N % structure::fixed_group_size != 0) {
    throw_invalid(fn, "cell", "state size " + std::to_string(N),
                  "a multiple of the block size " + std::to_string(structure::fixed_group_size));
  }
  if constexpr (!std::is_same_v<H0View, ZeroInitialState>) {
    static_assert(Kokkos::is_view_v<H0View> && H0View::rank == 2, "paraseq::newton_solve: h0 must be a [B, N] View");
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename H0View::memory_space>::accessible,
                  "paraseq::newton_solve: h0 must be accessible from the execution space");
    require_extents(fn, "h0", h0, {B, N}, "[B, cell.state_size()]");
  }
}

// fn: the function an error names (paraseq::mpi::newton_solve shares the checks).
inline void check_newton_config(const NewtonConfig& config, const char* fn = newton_fn) {
  auto bad = [fn](const char* field, const std::string& given, const char* expected) {
    throw_invalid(fn, std::string("config.") + field, given, expected);
  };
  if (config.max_iters < 0) bad("max_iters", "value " + std::to_string(config.max_iters), "a value >= 0");
  if (!(config.omega > 0 && config.omega <= 1)) bad("omega", "value " + std::to_string(config.omega), "0 < omega <= 1");
  if (config.picard_iters < 0) bad("picard_iters", "value " + std::to_string(config.picard_iters), "a value >= 0");
  if (config.fused_window < 0)
    bad("fused_window", "value " + std::to_string(config.fused_window), "a value >= 0 (0: chosen from the space)");
  for (const auto& [field, value] : {std::pair{"fused_team_threads", config.fused_team_threads},
                                     std::pair{"fused_team_groups", config.fused_team_groups}})
    if (value < 0 || value > 1024)
      bad(field, "value " + std::to_string(value),
          "a value >= 0 and <= 1024, the most threads a team has on any backend (0: chosen from the space)");
  if (config.picard_adapt && !config.residual_fail && !config.residual_atol)
    bad("picard_adapt", "true without a residual threshold", "residual_fail or residual_atol to be set");
  if (config.mode == NewtonMode::fused && !is_fusable(config))
    bad("mode", "fused together with the quasi Jacobian or Picard sweeps",
        "the fused mode only with the exact Jacobian and no Picard sweeps (picard_iters = 0, picard_adapt false)");
  if (config.mode == NewtonMode::one_pass && (!is_fusable(config) || config.residual_atol))
    bad("mode", "one_pass together with the quasi Jacobian, Picard sweeps or residual_atol",
        "the one-pass mode only with the exact Jacobian, no Picard sweeps and no residual_atol (it runs max_iters)");
}

// The newton mode: Picard sweeps, then one ordered scan per iteration. Each pass reads h^k from one
// buffer and writes h^{k+1} to the other (h and a work buffer of h's type, in turn); an initial
// guess that is not given is first written into the buffer the first pass reads, so every pass
// reads a View and a solve has one pass type whatever the guess. Returns the iterations run;
// checked_residual is the max |F| of the last host check (with check_on_host). Only the scans of the
// families in Modes are compiled.
template <class Acc, CompiledNewtonModes Modes, class ExecSpace, class Cell, class UView, class IterateView, class H0View, class ResidualOf>
int solve_by_scans(const ExecSpace& space, const Cell& cell, const UView& u, const IterateView& h, const H0View& h0,
                   const NewtonConfig& config, const ScanShape& shape, bool check_on_host, const ResidualOf& residual_of,
                   int& picard_sweeps, double& checked_residual) {
  using structure = typename Cell::structure;
  using iterate_t = Iterate<IterateView, H0View>;
  using buffer_layout = std::conditional_t<std::is_same_v<typename IterateView::array_layout, Kokkos::LayoutStride>,
                                           Kokkos::LayoutRight, typename IterateView::array_layout>;
  const int B = shape.batch, T = shape.steps, N = cell.state_size(), d = shape.group_size;
  const auto buffer = detail::workspace_view<
      Kokkos::View<typename IterateView::non_const_data_type, buffer_layout, typename IterateView::memory_space>>(
      space, "paraseq::newton_iterate", B, T, N);
  const IterateView work = buffer;
  // The quasi Jacobian of a diagonal cell is its exact one: the same scan.
  const bool quasi = !std::is_same_v<structure, Diagonal> && config.jacobian == NewtonJacobian::quasi;
  const ScanShape scan_shape = quasi ? ScanShape{B, T, N, 1} : shape;

  // A restart (picard_adapt) cannot reuse a given guess: h was overwritten; it starts from f(0, u).
  InitialGuess guess = config.initial_guess;
  auto write_guess = [&](const IterateView& into) {
    if (guess == InitialGuess::zeros) detail::fill(space, into, 0);
    else
      Kokkos::parallel_for("paraseq::newton_guess", Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * T * shape.groups),
                           CellAtZeroState<Acc, Cell, UView, IterateView>{cell, u, into, T, shape.groups, d});
  };
  // Whether the iterate is in work (or in h); each pass moves it to the other buffer.
  bool in_work = false;
  auto run_pass = [&](const auto& pass) {
    pass(iterate_t{in_work ? work : h, h0, d}, in_work ? h : work);
    in_work = !in_work;
  };
  auto picard = [&](const iterate_t& old, const IterateView& out) {
    Kokkos::parallel_for("paraseq::newton_picard", Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * T * shape.groups),
                         PicardSweep<Acc, Cell, UView, iterate_t, IterateView>{cell, u, old, out, T, shape.groups, d});
  };
  auto newton = [&](const iterate_t& old, const IterateView& out) {
    auto scan = [&]<bool Quasi>() {
      using rec_t = NewtonLinearization<Acc, Cell, Quasi, UView, iterate_t, IterateView>;
      using scan_structure = std::conditional_t<Quasi, Diagonal, structure>;
      ordered_scan<scan_structure, Acc>(space, scan_shape, rec_t{cell, u, old, out, Acc(config.omega), d},
                                        newton_scan_config<ExecSpace>(config.scan));
    };
    if constexpr (!std::is_same_v<structure, Diagonal> && compiles(Modes, CompiledNewtonModes::newton_quasi))
      if (quasi) return scan.template operator()<true>();
    if constexpr (std::is_same_v<structure, Diagonal> || compiles(Modes, CompiledNewtonModes::newton))
      if (!quasi) return scan.template operator()<false>();
  };
  auto current_residual = [&]() -> double { return residual_of(iterate_t{in_work ? work : h, h0, d}); };

  int iterations = 0;
  picard_sweeps = config.picard_iters;
  for (;;) {
    // A given guess starts in h; another is placed so that the planned last pass lands in h.
    in_work = false;
    if (guess != InitialGuess::given) {
      in_work = (picard_sweeps + config.max_iters) % 2 == 1;
      write_guess(in_work ? work : h);
    }
    for (int sweep = 0; sweep < picard_sweeps; ++sweep) run_pass(picard);
    double r = 0;
    for (iterations = 0; iterations < config.max_iters;) {
      run_pass(newton);
      ++iterations;
      if (config.residual_atol && (r = current_residual()) <= *config.residual_atol) break;
    }
    if (!check_on_host) break;
    if (!config.residual_atol || iterations == 0) r = current_residual();
    const double adapt_threshold = config.residual_fail ? *config.residual_fail : *config.residual_atol;
    if (config.picard_adapt && !(r <= adapt_threshold) && picard_sweeps < config.picard_adapt_max) {
      picard_sweeps = std::min(config.picard_adapt_max, std::max(1, 2 * picard_sweeps));
      if (guess == InitialGuess::given) guess = InitialGuess::cell_at_zero;
      continue;
    }
    checked_residual = r;
    break;
  }
  if (in_work) detail::copy(space, h, work);
  return iterations;
}

// The solve once its arguments are checked and config.mode is one of Modes' (choose_compiled_newton_mode);
// compiled once per built-in cell, type and space for the Views of views.hpp (solvers/newton_instances),
// instantiated where it is called otherwise, with the kernels of Modes only.
template <class Acc, CompiledNewtonModes Modes = CompiledNewtonModes::all, class ExecSpace, class Cell, class UView,
          class HView, class H0View>
void run_newton_solve(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h, const NewtonConfig& config,
                      const H0View& h0, NewtonStats<typename ExecSpace::memory_space>* stats) {
  using memory_space = typename ExecSpace::memory_space;
  const ScanShape shape = newton_shape(cell, u);
  const int B = shape.batch, T = shape.steps, d = shape.group_size;
  const NewtonMode mode = choose_compiled_newton_mode<Modes, Cell, Acc>(newton_fn, space, config, shape);
  const double threshold = config.residual_atol ? *config.residual_atol
                           : config.residual_fail ? *config.residual_fail
                                                  : std::numeric_limits<double>::max();
  const bool check_on_host = config.residual_fail || config.picard_adapt;

  Kokkos::View<double*, memory_space> residual;
  Kokkos::View<int*, memory_space> converged;
  if (stats || config.residual_atol || check_on_host)
    residual = stats ? detail::zeroed_view<Kokkos::View<double*, memory_space>>(space, "paraseq::newton_residual", B)
                     : detail::zeroed_workspace_view<Kokkos::View<double*, memory_space>>(space, "paraseq::newton_residual", B);
  if (stats) converged = detail::zeroed_view<Kokkos::View<int*, memory_space>>(space, "paraseq::newton_converged", B);
  // Every pass and residual reads h through one unmanaged View type.
  using iterate_view = Kokkos::View<typename HView::non_const_data_type, typename HView::array_layout,
                                    typename HView::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const iterate_view out = h;
  auto residual_of = [&](const Iterate<iterate_view, H0View>& iterate) {
    compute_residual<Acc>(space, cell, u, iterate, shape, residual, converged, threshold);
    return residual;
  };
  const Iterate<iterate_view, H0View> result{out, h0, d};

  using sequential_t = SequentialRecurrence<Acc, ExecSpace, Cell, UView, iterate_view, H0View>;
  int iterations = 0, picard_sweeps = 0;
  double checked_residual = 0; // max |F| of the result, read on the host when residual_fail is set
  if (mode == NewtonMode::sequential || mode == NewtonMode::fused || mode == NewtonMode::one_pass) {
    if (mode == NewtonMode::one_pass) {
      iterations = config.max_iters;
      if constexpr (compiles(Modes, CompiledNewtonModes::one_pass))
        one_pass_newton<Acc>(space, cell, u, out, h0, config, shape);
    } else if (mode == NewtonMode::sequential) {
      if constexpr (compiles(Modes, CompiledNewtonModes::sequential) && has_team_step<Cell>) {
        using team_t = SequentialTeamRecurrence<Acc, ExecSpace, Cell, UView, iterate_view, H0View>;
        if (B * shape.groups > 0)
          Kokkos::parallel_for("paraseq::newton_sequential_teams",
                               team_policy(space, B * shape.groups, team_step_threads<ExecSpace>(d), team_t::scratch_bytes(cell, d)),
                               team_t{cell, u, out, h0, T, shape.groups, d});
      } else if constexpr (compiles(Modes, CompiledNewtonModes::sequential)) {
        Kokkos::parallel_for("paraseq::newton_sequential",
                             Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * sequential_t::rows_of(shape.groups)),
                             sequential_t{cell, u, out, h0, T, shape.groups, d});
      }
    } else {
      iterations = config.max_iters;
      if constexpr (compiles(Modes, CompiledNewtonModes::fused)) {
        // With residual_atol the windows stop early; their count is read only when it is reported.
        const auto iterations_run = fused_newton<Acc>(space, cell, u, out, h0, config, shape);
        if (iterations_run.data() && (stats || config.residual_fail)) iterations = read_count_on_host(space, iterations_run);
      }
    }
    if (stats || config.residual_fail) residual_of(result);
    if (config.residual_fail) checked_residual = read_residual_on_host(space, residual);
  } else {
    if constexpr (compiles_newton_scans(Modes)) {
      iterations = solve_by_scans<Acc, Modes>(
          space, cell, u, out, h0, config, shape, check_on_host,
          [&](const Iterate<iterate_view, H0View>& iterate) { return read_residual_on_host(space, residual_of(iterate)); },
          picard_sweeps, checked_residual);
    }
    if (stats) residual_of(result);
  }
  if (stats) {
    stats->iterations = iterations;
    stats->picard_sweeps = picard_sweeps;
    stats->mode = mode;
    stats->residual = residual;
    stats->converged = converged;
  }
  // Thrown last, so that h and stats describe the result that failed the check.
  if (config.residual_fail && !(checked_residual <= *config.residual_fail))
    throw NewtonDivergenceError(checked_residual, iterations, *config.residual_fail);
}

// The Newton iteration's recurrence in the compiled instances (cmake/paraseqInstances.cmake).
template <class T, class Cell, class ExecSpace, bool Quasi>
using compiled_linearization_t = NewtonLinearization<T, Cell, Quasi, InView<T, 3, ExecSpace>,
                                                     Iterate<OutView<T, 3, ExecSpace>, InView<T, 2, ExecSpace>>,
                                                     OutView<T, 3, ExecSpace>>;

// Whether a solve runs a compiled instance: a built-in cell of u's type in the space's memory,
// accumulated in that type, over Views that convert to views.hpp's types.
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
constexpr bool newton_is_compiled() {
  using T = typename UView::non_const_value_type;
  return std::is_same_v<Acc, T> && is_compiled_cell_v<Cell, T, typename ExecSpace::memory_space> &&
         converts_to_compiled_view<UView, T, ExecSpace, false>() && converts_to_compiled_view<HView, T, ExecSpace, true>() &&
         (std::is_same_v<H0View, ZeroInitialState> || converts_to_compiled_view<H0View, T, ExecSpace, false>());
}

// The compiled instances are overloads of this (paraseq/eti/newton_instances.hpp; see linear_scan.hpp).
template <class... Arguments>
void compiled_newton_solve(const Arguments&...) = delete;

} // namespace detail

} // namespace paraseq

#if PARASEQ_ETI
#include <paraseq/eti/newton_instances.hpp>
#endif

namespace paraseq {

// newton_solve<Modes>(...) compiles the kernel families of Modes alone where the solver is
// instantiated (CompiledNewtonModes, newton_config.hpp); newton_solve(...) compiles every family.
template <CompiledNewtonModes Modes, class Acc = void, class ExecSpace, class Cell, class UView, class HView,
          class H0View = ZeroInitialState>
  requires(Kokkos::is_view_v<H0View> || std::is_same_v<H0View, ZeroInitialState>)
void newton_solve(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h,
                  const NewtonConfig& config = {}, const H0View& h0 = {},
                  NewtonStats<typename ExecSpace::memory_space>* stats = nullptr) {
  const Kokkos::Profiling::ScopedRegion region(detail::newton_fn);
  using acc_t = detail::accumulation_t<Acc, UView>;
  detail::check_cell<Cell, acc_t>();
  static_assert(!std::is_const_v<typename HView::value_type>, "paraseq::newton_solve: h must be writable");
  detail::check_newton_views<ExecSpace>(detail::newton_fn, cell, u, h, h0);
  detail::check_newton_config(config);
  constexpr bool compiled = detail::newton_is_compiled<acc_t, ExecSpace, Cell, UView, HView, H0View>();
  detail::check_header_path_allowed<compiled || !detail::is_builtin_cell_v<Cell>, Cell, UView, HView, H0View>();
  if constexpr (compiled) {
    using T = typename UView::non_const_value_type;
    const InView<T, 3, ExecSpace> u_view = u;
    const OutView<T, 3, ExecSpace> h_view = h;
    InView<T, 2, ExecSpace> h0_view;
    if constexpr (!std::is_same_v<H0View, ZeroInitialState>) h0_view = h0;
    // The compiled instances hold every family: a restricted call runs the mode it would compile.
    NewtonConfig run_config = config;
    if constexpr (Modes != CompiledNewtonModes::all)
      run_config.mode = detail::choose_compiled_newton_mode<Modes, Cell, T>(detail::newton_fn, space, config,
                                                                            detail::newton_shape(cell, u));
    if constexpr (requires { detail::compiled_newton_solve(space, cell, u_view, h_view, run_config, h0_view, stats); })
      detail::compiled_newton_solve(space, cell, u_view, h_view, run_config, h0_view, stats);
    else detail::run_newton_solve<T>(space, cell, u_view, h_view, run_config, h0_view, stats);
  } else {
    detail::run_newton_solve<acc_t, Modes>(space, cell, u, h, config, h0, stats);
  }
}

template <class Acc = void, class ExecSpace, class Cell, class UView, class HView, class H0View = ZeroInitialState>
  requires(Kokkos::is_view_v<H0View> || std::is_same_v<H0View, ZeroInitialState>)
void newton_solve(const ExecSpace& space, const Cell& cell, const UView& u, const HView& h,
                  const NewtonConfig& config = {}, const H0View& h0 = {},
                  NewtonStats<typename ExecSpace::memory_space>* stats = nullptr) {
  newton_solve<CompiledNewtonModes::all, Acc>(space, cell, u, h, config, h0, stats);
}

} // namespace paraseq
