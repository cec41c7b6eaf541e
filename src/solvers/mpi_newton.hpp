#pragma once
// The Newton solver over MPI ranks: newton_solve and newton_backward (newton.hpp, newton_backward.hpp)
// with the time axis split across the ranks of a communicator (docs/distributed.md, "C++: MPI").
//
//   mpi::newton_solve(space, comm, cell, u, h [, config [, h0 [, stats]]])
//   mpi::newton_backward(space, comm, cell, u, h, g, du, dparams [, h0 [, dh0 [, config]]])
//
// Every rank of comm calls the function with its contiguous slice of the time axis, as for
// mpi_scan.hpp: rank r holds steps [s_r, s_r + T_r), the ranks in rank order along time; T_r may
// differ between ranks and may be 0. u, h, g, du have the shapes of the one-process functions with
// T = T_r; the Views hold float or double, all of one type, which is also the precision of the solve.
// h0 (and dh0) are read (written) on rank 0 only; the other ranks pass a View of the same type that
// is not touched (an empty one will do), and either every rank passes one or none does.
//
// Forward, one Newton iteration on iterate h^k:
//   1. boundary  the ranks MPI_Allgather their slice's last state of h^k (B x N values); the state
//                before a rank's first step is that of the nearest rank before it with steps (h0, or
//                zero, at the global start)
//   2. linearise A_t = df/dh(h^k_{t-1}, u_t) and c_t = f(h^k_{t-1}, u_t) - h^k_t on the rank's slice,
//                stored in the scan's structure (NewtonJacobian::quasi: J's diagonal, a diagonal scan)
//   3. scan      delta_t = A_t delta_{t-1} + c_t, delta_{-1} = 0, over the ranks (mpi_scan.hpp's
//                scan_agreed: one MPI_Allgather of the slices' maps)
//   4. update    h^{k+1} = h^k + omega delta
// These are the one-process newton mode's iterates: the same linear system, solved by a scan over
// the ranks instead of one ordered scan. With residual_atol, after each iteration the ranks exchange
// the boundary of h^{k+1} (which the next iteration reuses), each computes max |F| per batch element
// over its slice and an MPI_Allreduce (MAX) of B doubles gives the global one: every rank stops after
// the same iteration. residual_fail and stats take the same global residual once at the end, and a
// NewtonDivergenceError is thrown on every rank alike. config.mode must be automatic or newton (there
// is one distributed scheme), picard_adapt false; picard_iters sweeps run first, one boundary
// exchange each; stats report mode newton and the global residual of each batch element.
//
// Backward: the boundary of h (one exchange), A_t at h, then the adjoint mu_t = g_t + A_{t+1}^T
// mu_{t+1} as one reverse scan over the ranks, then dL/du and the slice's parameter sums from the
// cell's vjp (newton_backward.hpp's LocalGradients). The ranks MPI_Allgather their parameter sums and
// add them in rank order: every rank gets the whole dL/dtheta, bitwise the same on every rank.
// dL/dh0 = A_0^T mu_0 at the global start arrives on rank 0 (also when its slice is empty).
//
// Errors: the ranks exchange their arguments first (one MPI_Allgather of 23 long longs per rank), so
// that every rank throws alike and none is left waiting in a collective: a rank whose own arguments
// are refused throws its own std::invalid_argument and the others one that names it; ranks that
// disagree on the function, the cell's structure and sizes, the value type, B, whether h0 / dh0 /
// stats are given, or a NewtonConfig setting that decides the iteration throw std::invalid_argument
// naming the argument and each rank's value. The cell's parameter values and config.scan (the local
// scans' decomposition) are not compared.
//
// Deterministic: all_gathers, an exact MAX, and sums in rank order.

#include <paraseq/config.hpp>

#if !PARASEQ_HAVE_MPI
#error "paraseq/solvers/mpi_newton.hpp: this paraseq was configured without MPI (PARASEQ_ENABLE_MPI=OFF, or AUTO without an MPI that find_package(MPI COMPONENTS CXX) finds); reconfigure it with -DPARASEQ_ENABLE_MPI=ON"
#endif

#include <paraseq/core/errors.hpp>
#include <paraseq/core/fill.hpp>
#include <paraseq/core/mpi_scan.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>
#include <paraseq/solvers/newton_config.hpp>
#include <paraseq/solvers/newton_kernels.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <exception>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace paraseq::mpi {

namespace detail {

using paraseq::detail::throw_invalid;

inline constexpr const char* newton_solve_fn = "paraseq::mpi::newton_solve";
inline constexpr const char* newton_backward_fn = "paraseq::mpi::newton_backward";

// ---- the agreement between ranks ----------------------------------------------------------------

enum class NewtonFunction : int { solve = 0, backward = 1 };

// What every rank sends first: whether its own arguments were refused (column 0, as gather_rows
// reads it), what the ranks must share, and its number of steps (not compared: the boundary
// exchange needs every rank's).
struct NewtonColumn {
  enum : int {
    refused, function, fixed_group, max_group, is_double, batch, state_size, input_size, param_count, has_h0, has_dh0,
    has_stats, max_iters, omega, picard_iters, initial_guess, jacobian, mode, has_atol, atol, has_fail, fail, steps,
    count
  };
};
using NewtonRow = std::array<long long, NewtonColumn::count>;

inline std::string as_number(long long value) { return std::to_string(value); }
inline std::string as_real(long long bits) {
  std::ostringstream text;
  text.precision(17);
  text << std::bit_cast<double>(bits);
  return text.str();
}
inline std::string as_type(long long is_double) { return is_double ? "double" : "float"; }
inline std::string as_function(long long function) {
  return function == int(NewtonFunction::solve) ? newton_solve_fn : newton_backward_fn;
}
inline std::string as_guess(long long guess) {
  constexpr const char* names[] = {"InitialGuess::cell_at_zero", "InitialGuess::zeros", "InitialGuess::given"};
  return names[guess];
}
inline std::string as_jacobian(long long jacobian) { return jacobian ? "NewtonJacobian::quasi" : "NewtonJacobian::exact"; }
inline std::string as_mode(long long mode) {
  constexpr const char* names[] = {"NewtonMode::automatic", "NewtonMode::newton", "NewtonMode::fused", "NewtonMode::sequential",
                                   "NewtonMode::one_pass"};
  return names[mode];
}

// A column every rank must have alike: the argument an error names, and how it shows the values.
struct AgreedValue {
  int column;
  const char* argument;
  const char* quantity;
  std::string (*describe)(long long);
};
// An argument every rank gives or none does.
struct AgreedPresence {
  int column;
  const char* argument;
  const char* given;
};

// Throws on every rank alike: this rank's own error, or the ranks whose arguments were refused, or
// the first argument on which the ranks differ. Returns every rank's number of steps.
inline std::vector<int> agree_newton(const std::string& fn, MPI_Comm comm, const Place& place, const NewtonRow& local,
                                     const std::exception_ptr& local_error) {
  const std::vector<NewtonRow> rows = gather_rows(fn, comm, place, local, local_error);
  const auto differs = [&](int column) {
    for (const NewtonRow& row : rows)
      if (row[column] != rows[0][column]) return true;
    return false;
  };
  const std::string same = "the same on every rank of 'comm' (only the number of steps T may differ)";
  if (differs(NewtonColumn::function))
    throw std::invalid_argument(fn + ": the ranks of 'comm' call different functions: " +
                                per_rank(rows, NewtonColumn::function, as_function) + ", expected the same on every rank");
  if (differs(NewtonColumn::fixed_group) || differs(NewtonColumn::max_group)) {
    std::string given;
    for (std::size_t rank = 0; rank < rows.size(); ++rank)
      given += (rank ? ", " : "") +
               structure_name(int(rows[rank][NewtonColumn::fixed_group]), int(rows[rank][NewtonColumn::max_group])) +
               " on rank " + std::to_string(rank);
    throw_invalid(fn, "cell", "the Jacobian structure " + given, same);
  }
  constexpr AgreedValue values[] = {
      {NewtonColumn::is_double, "u", "value type", as_type},
      {NewtonColumn::batch, "u", "batch size B", as_number},
      {NewtonColumn::state_size, "cell", "state size N", as_number},
      {NewtonColumn::input_size, "cell", "input size", as_number},
      {NewtonColumn::param_count, "cell", "parameter count", as_number},
  };
  constexpr AgreedPresence presences[] = {
      {NewtonColumn::has_h0, "h0", "a View"},
      {NewtonColumn::has_dh0, "dh0", "a View"},
      {NewtonColumn::has_stats, "stats", "a NewtonStats"},
      {NewtonColumn::has_atol, "config.residual_atol", "a value"},
      {NewtonColumn::has_fail, "config.residual_fail", "a value"},
  };
  constexpr AgreedValue settings[] = {
      {NewtonColumn::max_iters, "config.max_iters", "value", as_number},
      {NewtonColumn::omega, "config.omega", "value", as_real},
      {NewtonColumn::picard_iters, "config.picard_iters", "value", as_number},
      {NewtonColumn::initial_guess, "config.initial_guess", "value", as_guess},
      {NewtonColumn::jacobian, "config.jacobian", "value", as_jacobian},
      {NewtonColumn::mode, "config.mode", "value", as_mode},
      {NewtonColumn::atol, "config.residual_atol", "value", as_real},
      {NewtonColumn::fail, "config.residual_fail", "value", as_real},
  };
  const auto check_values = [&](const auto& list) {
    for (const AgreedValue& agreed : list)
      if (differs(agreed.column))
        throw_invalid(fn, agreed.argument, std::string(agreed.quantity) + " " + per_rank(rows, agreed.column, agreed.describe),
                      same);
  };
  check_values(values);
  for (const AgreedPresence& agreed : presences)
    if (differs(agreed.column))
      throw_invalid(fn, agreed.argument,
                    std::string(agreed.given) + " on rank(s) " + ranks_where(rows, agreed.column, 1LL) + " and none on rank(s) " +
                        ranks_where(rows, agreed.column, 0LL),
                    std::string(agreed.argument) + " on every rank of 'comm' or on none");
  check_values(settings);
  std::vector<int> steps(rows.size());
  for (std::size_t rank = 0; rank < rows.size(); ++rank) steps[rank] = int(rows[rank][NewtonColumn::steps]);
  return steps;
}

// This rank's row: its arguments and config, the value type T and the cell's structure.
template <class T, class Cell, class UView>
NewtonRow newton_row(NewtonFunction function, bool refused, const Cell& cell, const UView& u, bool has_h0, bool has_dh0,
                     bool has_stats, const NewtonConfig& config) {
  using structure = typename Cell::structure;
  return NewtonRow{refused ? 1 : 0,
                   int(function),
                   structure::fixed_group_size,
                   structure::max_group_size,
                   std::is_same_v<T, double> ? 1 : 0,
                   (long long)u.extent(0),
                   cell.state_size(),
                   cell.input_size(),
                   cell.param_count(),
                   has_h0,
                   has_dh0,
                   has_stats,
                   config.max_iters,
                   std::bit_cast<long long>(config.omega),
                   config.picard_iters,
                   int(config.initial_guess),
                   int(config.jacobian),
                   int(config.mode),
                   config.residual_atol.has_value(),
                   std::bit_cast<long long>(config.residual_atol.value_or(0.0)),
                   config.residual_fail.has_value(),
                   std::bit_cast<long long>(config.residual_fail.value_or(0.0)),
                   (long long)u.extent(1)};
}

// The checks a rank makes on its own arguments, shared by both functions: the one-process checks
// (h0 on rank 0 only), then what the distributed scheme cannot run.
template <class ExecSpace, class Cell, class UView, class HView, class H0View>
void check_local_newton(const char* fn, const Place& place, const Cell& cell, const UView& u, const HView& h, const H0View& h0,
                        const NewtonConfig& config) {
  if (place.rank == 0) paraseq::detail::check_newton_views<ExecSpace>(fn, cell, u, h, h0);
  else paraseq::detail::check_newton_views<ExecSpace>(fn, cell, u, h, ZeroInitialState{});
  paraseq::detail::check_newton_config(config, fn);
  static_assert(!paraseq::detail::declares_group_size<Cell>,
                "paraseq::mpi::newton_solve / newton_backward: a dense cell in several groups (one that declares "
                "group_size(), e.g. ParaGRUHeads) is not supported over ranks, whose dense scan is one N x N map");
  if (config.mode != NewtonMode::automatic && config.mode != NewtonMode::newton)
    throw_invalid(fn, "config.mode", "the value " + as_mode(int(config.mode)),
                  "NewtonMode::automatic or NewtonMode::newton (over ranks, every iteration is one distributed scan)");
  if (config.picard_adapt)
    throw_invalid(fn, "config.picard_adapt", "the value true", "false (over ranks, Picard sweeps are fixed: picard_iters)");
}

// ---- the kernels --------------------------------------------------------------------------------

// A's View for a scan structure: [B, T, N] diagonal, [B, T, N/K, K, K] block, [B, T, N, N] dense.
template <class Structure, class T, class MemorySpace>
using coefficient_view_t =
    Kokkos::View<std::conditional_t<std::is_same_v<Structure, Diagonal>, T***, std::conditional_t<is_dense_v<Structure>, T****, T*****>>,
                 Kokkos::LayoutRight, MemorySpace>;

template <class Structure, class T, class MemorySpace>
coefficient_view_t<Structure, T, MemorySpace> allocate_coefficients(int batch, int steps, int n) {
  using view = coefficient_view_t<Structure, T, MemorySpace>;
  const auto alloc = Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("paraseq::mpi::newton_jacobians"));
  if constexpr (std::is_same_v<Structure, Diagonal>) return view(alloc, batch, steps, n);
  else if constexpr (is_dense_v<Structure>) return view(alloc, batch, steps, n, n);
  else {
    constexpr int k = Structure::fixed_group_size;
    return view(alloc, batch, steps, n / k, k, k);
  }
}

// At every (b, t, group) of the slice: A_t = df/dh(h_{t-1}, u_t) in the scan's structure (a diagonal
// scan takes J's diagonal: the quasi Jacobian) and, when c has data, c_t = f(h_{t-1}, u_t) - h_t.
template <class Acc, class Cell, class ScanStructure, class UView, class IterateT, class AView, class CView>
struct LinearizeSlice {
  static constexpr int D = paraseq::detail::cell_group_bound<Cell>;
  Cell cell;
  UView u;
  IterateT iterate;
  AView A;
  CView c;
  int steps, groups, d;

  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int g = int(index % groups), t = int(index / groups % steps), b = int(index / groups / steps);
    Acc h_prev[D], in[Cell::max_inputs_per_group], f[D];
    iterate.template load<Acc>(b, t - 1, g, h_prev);
    paraseq::detail::gather_inputs<Acc>(cell, u, b, t, g, in);
    using value = typename AView::value_type;
    if constexpr (std::is_same_v<ScanStructure, Diagonal>) {
      Acc J_diag[D];
      paraseq::detail::linearize_diagonal_of(cell, g, d, h_prev, in, f, J_diag);
      for (int i = 0; i < d; ++i) A(b, t, g * d + i) = value(J_diag[i]);
    } else {
      Acc J[D * D];
      cell.linearize(g, h_prev, in, f, J);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          if constexpr (is_dense_v<ScanStructure>) A(b, t, i, j) = value(J[i * d + j]);
          else A(b, t, g, i, j) = value(J[i * d + j]);
        }
    }
    if (c.data()) {
      Acc h_t[D];
      iterate.template load<Acc>(b, t, g, h_t);
      for (int i = 0; i < d; ++i) c(b, t, g * d + i) = typename CView::value_type(f[i] - h_t[i]);
    }
  }
};

// h += omega delta at every (b, t, channel).
template <class Acc, class HView, class DeltaView>
struct NewtonUpdate {
  HView h;
  DeltaView delta;
  Acc omega;
  int steps, n;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int i = int(index % n), t = int(index / n % steps), b = int(index / n / steps);
    h(b, t, i) = typename HView::value_type(Acc(h(b, t, i)) + omega * Acc(delta(b, t, i)));
  }
};

// What a slice passes on: its last state, or the state entering it when it has no steps.
template <class HView, class EnteringView, class OutView>
struct LeavingState {
  HView h;
  EnteringView entering;
  OutView out;
  int steps, n;
  KOKKOS_INLINE_FUNCTION void operator()(int index) const {
    const int b = index / n, i = index % n;
    out(b, i) = steps > 0 ? typename OutView::value_type(h(b, steps - 1, i)) : entering(b, i);
  }
};

// ---- the exchanges ------------------------------------------------------------------------------

// Sets entering (on ranks after the first) to the state before this rank's first step: the last
// state of h on the nearest rank before it with steps, else what rank 0 passes on (its entering:
// h0 or zero). One MPI_Allgather of B x N values.
template <class ExecSpace, class HView, class EnteringView>
void exchange_boundary(const std::string& fn, const ExecSpace& space, MPI_Comm comm, const Place& place,
                       const std::vector<int>& steps_of, const HView& h, const EnteringView& entering) {
  using T = typename EnteringView::non_const_value_type;
  const int B = int(entering.extent(0)), n = int(entering.extent(1));
  const EnteringView leaving(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::mpi::leaving_state"), B, n);
  Kokkos::parallel_for("paraseq::mpi::leaving_state", Kokkos::RangePolicy<ExecSpace>(space, 0, B * n),
                       LeavingState<HView, EnteringView, EnteringView>{h, entering, leaving, steps_of[place.rank], n});
  space.fence();
  const auto sent = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, leaving);
  std::vector<T> gathered(std::size_t(B) * n * place.size);
  check_mpi(fn, MPI_Allgather(sent.data(), B * n, mpi_type<T>(), gathered.data(), B * n, mpi_type<T>(), comm),
            "MPI_Allgather");
  if (place.rank == 0) return;
  int from = place.rank - 1;
  while (from > 0 && steps_of[from] == 0) --from;
  const auto entering_host = Kokkos::create_mirror_view(entering);
  std::copy_n(gathered.data() + std::size_t(from) * B * n, std::size_t(B) * n, entering_host.data());
  Kokkos::deep_copy(entering, entering_host);
}

// Per batch element, max |F| over the whole sequence: each rank's maxima over its slice (the
// one-process kernels, with the state entering the slice), then MPI_Allreduce MAX (exact in any
// order). The kernels count a NaN as infinity, so no NaN reaches the reduction.
template <class ExecSpace, class Cell, class UView, class IterateT>
std::vector<double> global_residual(const std::string& fn, const ExecSpace& space, MPI_Comm comm, const Cell& cell,
                                    const UView& u, const IterateT& iterate, const ScanShape& shape) {
  using T = typename UView::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  const Kokkos::View<double*, memory_space> residual(Kokkos::view_alloc(space, "paraseq::mpi::newton_residual"), shape.batch);
  paraseq::detail::compute_residual<T>(space, cell, u, iterate, shape, residual, Kokkos::View<int*, memory_space>{},
                                       std::numeric_limits<double>::max());
  space.fence();
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, residual);
  std::vector<double> values(host.data(), host.data() + shape.batch);
  check_mpi(fn, MPI_Allreduce(MPI_IN_PLACE, values.data(), shape.batch, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
  return values;
}

inline double largest(const std::vector<double>& values) {
  double result = 0;
  for (double value : values) result = std::max(result, value);
  return result;
}

// ---- the solves ---------------------------------------------------------------------------------

// The state entering this rank's slice, [B, N]: on rank 0 h0 (zero without it) for good; on the
// others set by exchange_boundary.
template <class T, class ExecSpace, class H0View>
Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>
initial_entering(const ExecSpace& space, const Place& place, const H0View& h0, int batch, int n) {
  Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space> entering(
      Kokkos::view_alloc(space, "paraseq::mpi::newton_entering"), batch, n);
  if constexpr (Kokkos::is_view_v<H0View>)
    if (place.rank == 0) paraseq::detail::copy(space, entering, h0);
  return entering;
}

template <class ScanStructure, class T, class ExecSpace, class Cell, class UView, class HView, class H0View>
void solve_over_ranks(const ExecSpace& space, MPI_Comm comm, const Place& place, const std::vector<int>& steps_of,
                      const Cell& cell, const UView& u, const HView& h, const NewtonConfig& config, const H0View& h0,
                      NewtonStats<typename ExecSpace::memory_space>* stats) {
  using memory_space = typename ExecSpace::memory_space;
  using policy = Kokkos::RangePolicy<ExecSpace>;
  const std::string fn = newton_solve_fn;
  const ScanShape shape = paraseq::detail::newton_shape(cell, u);
  const int B = shape.batch, steps = shape.steps, N = cell.state_size(), d = shape.group_size, groups = shape.groups;
  const auto entering = initial_entering<T>(space, place, h0, B, N);
  using iterate_t = paraseq::detail::Iterate<HView, decltype(entering)>;
  const iterate_t iterate{h, entering, d};

  if (config.initial_guess == InitialGuess::zeros) paraseq::detail::fill(space, h, 0);
  else if (config.initial_guess == InitialGuess::cell_at_zero)
    Kokkos::parallel_for("paraseq::mpi::newton_guess", policy(space, 0, std::size_t(B) * steps * groups),
                         paraseq::detail::CellAtZeroState<T, Cell, UView, HView>{cell, u, h, steps, groups, d});

  const auto A = allocate_coefficients<ScanStructure, T, memory_space>(B, steps, N);
  using values_view = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;
  const values_view c(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::mpi::newton_residuals"), B, steps, N);
  const values_view delta(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::mpi::newton_delta"), B, steps, N);
  // Whether entering holds the boundary of the current iterate, and whether `residual` is its residual.
  bool boundary_current = false, residual_current = false;
  std::vector<double> residual;
  const auto boundary = [&] {
    if (!boundary_current) exchange_boundary(fn, space, comm, place, steps_of, h, entering);
    boundary_current = true;
  };
  const auto iterate_changed = [&] { boundary_current = residual_current = false; };

  // A Picard sweep writes f(h_{t-1}, u_t) into c (it reads h at t - 1 on other threads), then h.
  for (int sweep = 0; sweep < config.picard_iters; ++sweep) {
    boundary();
    Kokkos::parallel_for("paraseq::mpi::newton_picard", policy(space, 0, std::size_t(B) * steps * groups),
                         paraseq::detail::PicardSweep<T, Cell, UView, iterate_t, values_view>{cell, u, iterate, c, steps,
                                                                                                groups, d});
    paraseq::detail::copy(space, h, c);
    iterate_changed();
  }
  int iterations = 0;
  while (iterations < config.max_iters) {
    boundary();
    Kokkos::parallel_for("paraseq::mpi::newton_linearize", policy(space, 0, std::size_t(B) * steps * groups),
                         LinearizeSlice<T, Cell, ScanStructure, UView, iterate_t, decltype(A), values_view>{
                             cell, u, iterate, A, c, steps, groups, d});
    scan_agreed<Direction::forward, ScanStructure>(space, comm, place, A, c, delta, ZeroInitialState{}, config.scan);
    Kokkos::parallel_for("paraseq::mpi::newton_update", policy(space, 0, std::size_t(B) * steps * N),
                         NewtonUpdate<T, HView, values_view>{h, delta, T(config.omega), steps, N});
    iterate_changed();
    ++iterations;
    if (config.residual_atol) {
      boundary();
      residual = global_residual(fn, space, comm, cell, u, iterate, shape);
      residual_current = true;
      if (largest(residual) <= *config.residual_atol) break;
    }
  }
  if ((stats || config.residual_fail) && !residual_current) {
    boundary();
    residual = global_residual(fn, space, comm, cell, u, iterate, shape);
  }
  space.fence();
  if (stats) {
    const double threshold = config.residual_atol ? *config.residual_atol
                             : config.residual_fail ? *config.residual_fail
                                                    : std::numeric_limits<double>::max();
    stats->iterations = iterations;
    stats->picard_sweeps = config.picard_iters;
    stats->mode = NewtonMode::newton;
    stats->residual = Kokkos::View<double*, memory_space>("paraseq::newton_residual", B);
    stats->converged = Kokkos::View<int*, memory_space>("paraseq::newton_converged", B);
    const auto residual_host = Kokkos::create_mirror_view(stats->residual);
    const auto converged_host = Kokkos::create_mirror_view(stats->converged);
    for (int b = 0; b < B; ++b) residual_host(b) = residual[b], converged_host(b) = residual[b] <= threshold;
    Kokkos::deep_copy(stats->residual, residual_host);
    Kokkos::deep_copy(stats->converged, converged_host);
  }
  if (config.residual_fail && !(largest(residual) <= *config.residual_fail))
    throw NewtonDivergenceError(largest(residual), iterations, *config.residual_fail);
}

template <class T, class ExecSpace, class Cell, class UView, class HView, class GView, class DUView, class DParamView,
          class H0View, class DH0View>
void backward_over_ranks(const ExecSpace& space, MPI_Comm comm, const Place& place, const std::vector<int>& steps_of,
                         const Cell& cell, const UView& u, const HView& h, const GView& g, const DUView& du,
                         const DParamView& dparams, const H0View& h0, const DH0View& dh0, const NewtonConfig& config) {
  using memory_space = typename ExecSpace::memory_space;
  using structure = typename Cell::structure;
  const std::string fn = newton_backward_fn;
  const ScanShape shape = paraseq::detail::newton_shape(cell, u);
  const int B = shape.batch, steps = shape.steps, N = cell.state_size(), d = shape.group_size, groups = shape.groups;
  const int P = cell.param_count();
  const auto entering = initial_entering<T>(space, place, h0, B, N);
  exchange_boundary(fn, space, comm, place, steps_of, h, entering);
  using iterate_t = paraseq::detail::Iterate<HView, decltype(entering)>;
  const iterate_t trajectory{h, entering, d};

  const auto A = allocate_coefficients<structure, T, memory_space>(B, steps, N);
  using values_view = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;
  Kokkos::parallel_for("paraseq::mpi::newton_adjoint_jacobians", Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * steps * groups),
                       LinearizeSlice<T, Cell, structure, UView, iterate_t, decltype(A), values_view>{
                           cell, u, trajectory, A, values_view{}, steps, groups, d});
  const values_view mu(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::mpi::newton_adjoint"), B, steps, N);
  const auto adjoint_entering =
      scan_agreed<Direction::reverse, structure>(space, comm, place, A, g, mu, ZeroInitialState{}, config.scan);

  // The slice's parameter sums, as newton_backward's newton mode forms them.
  const paraseq::detail::GradientRuns split = paraseq::detail::gradient_runs(space, shape, P);
  const int runs = split.runs, run_length = split.run_length;
  using partial_view = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;
  const partial_view partial(Kokkos::view_alloc(space, "paraseq::mpi::newton_param_partials"), std::size_t(B) * runs, P);
  Kokkos::parallel_for(
      "paraseq::mpi::newton_local_gradients", Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * runs * groups),
      paraseq::detail::LocalGradients<T, Cell, UView, HView, decltype(entering), values_view, DUView, partial_view>{
          cell, u, trajectory, mu, du, partial, steps, groups, d, runs, run_length});
  const Kokkos::View<T*, memory_space> slice_sums("paraseq::mpi::newton_param_sums", P);
  paraseq::detail::sum_partials(space, partial, slice_sums);
  // dL/dh0 on rank 0: A_0^T mu_0 of its first step, or what enters its empty slice from the ranks after it.
  if constexpr (!std::is_same_v<DH0View, NoGradient>)
    if (place.rank == 0 && dh0.data())
      Kokkos::parallel_for("paraseq::mpi::newton_dh0", Kokkos::RangePolicy<ExecSpace>(space, 0, B * N),
                           SliceLeaving<structure, T, decltype(A), values_view, decltype(adjoint_entering), DH0View>{
                               A, mu, adjoint_entering, dh0, 0, steps, N, d, true, true});
  space.fence();

  const auto sent = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, slice_sums);
  std::vector<T> gathered(std::size_t(P) * place.size);
  check_mpi(fn, MPI_Allgather(sent.data(), P, mpi_type<T>(), gathered.data(), P, mpi_type<T>(), comm), "MPI_Allgather");
  const auto total = Kokkos::create_mirror_view(dparams);
  for (int p = 0; p < P; ++p) {
    T sum = 0;
    for (int rank = 0; rank < place.size; ++rank) sum += gathered[std::size_t(rank) * P + p];
    total(p) = sum;
  }
  Kokkos::deep_copy(dparams, total);
}

// Whether every View holds T (ZeroInitialState and NoGradient hold nothing).
template <class T, class View>
constexpr bool holds() {
  if constexpr (Kokkos::is_view_v<View>) return std::is_same_v<typename View::non_const_value_type, T>;
  else return true;
}
template <class T, class... Views>
constexpr bool all_hold_v = (holds<T, Views>() && ...);

} // namespace detail

// h_t = f(h_{t-1}, u_t) by Newton's method with the time axis split across the ranks of comm
// (collective: every rank calls it with its slice of u and h, [B, T_r, ...]); h_{-1} = h0 [B, N],
// read on rank 0 only. config as for paraseq::newton_solve, with mode automatic or newton and no
// picard_adapt; stats (global residuals) on every rank or on none.
template <class ExecSpace, class Cell, class UView, class HView, class H0View = ZeroInitialState>
  requires(Kokkos::is_view_v<H0View> || std::is_same_v<H0View, ZeroInitialState>)
void newton_solve(const ExecSpace& space, MPI_Comm comm, const Cell& cell, const UView& u, const HView& h,
                  const NewtonConfig& config = {}, const H0View& h0 = {},
                  NewtonStats<typename ExecSpace::memory_space>* stats = nullptr) {
  const std::string fn = detail::newton_solve_fn;
  const Kokkos::Profiling::ScopedRegion region(fn);
  using T = typename UView::non_const_value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "paraseq::mpi::newton_solve: u must hold float or double");
  paraseq::detail::check_cell<Cell, T>();
  static_assert(Kokkos::is_view_v<HView> && !std::is_const_v<typename HView::value_type>,
                "paraseq::mpi::newton_solve: h must be a writable View");
  static_assert(detail::all_hold_v<T, HView, H0View>,
                "paraseq::mpi::newton_solve: u, h and h0 must hold the same value type");
  const detail::Place place = detail::place_in(fn, comm);
  std::exception_ptr local_error;
  try {
    detail::check_local_newton<ExecSpace>(fn.c_str(), place, cell, u, h, h0, config);
  } catch (const std::invalid_argument&) {
    local_error = std::current_exception();
  }
  const auto local = detail::newton_row<T>(detail::NewtonFunction::solve, bool(local_error), cell, u,
                                           Kokkos::is_view_v<H0View>, false, stats != nullptr, config);
  const std::vector<int> steps_of = detail::agree_newton(fn, comm, place, local, local_error);
  using structure = typename Cell::structure;
  // The quasi Jacobian of a diagonal cell is its exact one: the same scan.
  if constexpr (!std::is_same_v<structure, Diagonal>) {
    if (config.jacobian == NewtonJacobian::quasi) {
      detail::exchange_count<Diagonal>(fn, "u", int(u.extent(0)), cell.state_size());
      return detail::solve_over_ranks<Diagonal, T>(space, comm, place, steps_of, cell, u, h, config, h0, stats);
    }
  }
  detail::exchange_count<structure>(fn, "u", int(u.extent(0)), cell.state_size());
  detail::solve_over_ranks<structure, T>(space, comm, place, steps_of, cell, u, h, config, h0, stats);
}

// Gradients through mpi::newton_solve's result h (collective: every rank passes its slice of u, h,
// g = dL/dh and gets its slice of du); dparams [cell.param_count()] is the whole gradient on every
// rank; dh0 [B, N] is written on rank 0 only (NoGradient{} to skip it). config: the forward's.
template <class ExecSpace, class Cell, class UView, class HView, class GView, class DUView, class DParamView,
          class H0View = ZeroInitialState, class DH0View = NoGradient>
void newton_backward(const ExecSpace& space, MPI_Comm comm, const Cell& cell, const UView& u, const HView& h,
                     const GView& g, const DUView& du, const DParamView& dparams, const H0View& h0 = {},
                     const DH0View& dh0 = {}, const NewtonConfig& config = {}) {
  const std::string fn = detail::newton_backward_fn;
  const Kokkos::Profiling::ScopedRegion region(fn);
  using T = typename UView::non_const_value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "paraseq::mpi::newton_backward: u must hold float or double");
  paraseq::detail::check_cell_gradient<Cell, T>();
  static_assert(Kokkos::is_view_v<GView> && GView::rank == 3, "paraseq::mpi::newton_backward: g must be a [B, T, N] View");
  static_assert(Kokkos::is_view_v<DUView> && DUView::rank == 3, "paraseq::mpi::newton_backward: du must be a [B, T, U] View");
  static_assert(Kokkos::is_view_v<DParamView> && DParamView::rank == 1,
                "paraseq::mpi::newton_backward: dparams must be a rank-1 View of cell.param_count() values");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename GView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename DUView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename DParamView::memory_space>::accessible,
                "paraseq::mpi::newton_backward: g, du and dparams must be accessible from the execution space");
  static_assert(detail::all_hold_v<T, HView, GView, DUView, DParamView, H0View, DH0View>,
                "paraseq::mpi::newton_backward: u, h, g, du, dparams, h0 and dh0 must hold the same value type");
  if constexpr (!std::is_same_v<DH0View, NoGradient>)
    static_assert(Kokkos::is_view_v<DH0View> && DH0View::rank == 2, "paraseq::mpi::newton_backward: dh0 must be a [B, N] View");
  const detail::Place place = detail::place_in(fn, comm);
  std::exception_ptr local_error;
  try {
    detail::check_local_newton<ExecSpace>(fn.c_str(), place, cell, u, h, h0, config);
    const long B = long(u.extent(0)), T_r = long(u.extent(1)), N = cell.state_size();
    paraseq::detail::require_extents(fn, "g", g, {B, T_r, N}, "the shape of h");
    paraseq::detail::require_extents(fn, "du", du, {B, T_r, cell.input_size()}, "the shape of u");
    paraseq::detail::require_extents(fn, "dparams", dparams, {cell.param_count()}, "[cell.param_count()]");
    if constexpr (!std::is_same_v<DH0View, NoGradient>)
      if (place.rank == 0) paraseq::detail::require_extents(fn, "dh0", dh0, {B, N}, "[B, cell.state_size()] on rank 0");
  } catch (const std::invalid_argument&) {
    local_error = std::current_exception();
  }
  const auto local = detail::newton_row<T>(detail::NewtonFunction::backward, bool(local_error), cell, u,
                                           Kokkos::is_view_v<H0View>, !std::is_same_v<DH0View, NoGradient>, false, config);
  const std::vector<int> steps_of = detail::agree_newton(fn, comm, place, local, local_error);
  detail::exchange_count<typename Cell::structure>(fn, "u", int(u.extent(0)), cell.state_size());
  detail::backward_over_ranks<T>(space, comm, place, steps_of, cell, u, h, g, du, dparams, h0, dh0, config);
}

} // namespace paraseq::mpi
