#pragma once
// The kernels of the Newton solver (newton.hpp) that run on every element of the sequence: where a
// pass finds the current iterate, the fused operands of one Newton iteration for the ordered scan,
// a Picard sweep, the sequential loop and the residual max|F|.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/ordered_column_sum.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/cell.hpp>
#include <paraseq/solvers/newton_config.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>

namespace paraseq {

namespace detail {

inline constexpr const char* newton_fn = "paraseq::newton_solve";
inline constexpr const char* newton_backward_fn = "paraseq::newton_backward";

// The decomposition of the Newton mode's scans (forward and adjoint). Their steps' maps are the
// cell's linearisations, computed where they are used, so a second pass over a time chunk would
// compute them again: on devices they take the one-pass time split unless the config names one
// (H200, docs/performance.md: 1.5x at (1, 65536, 256) and (1, 262144, 1)).
template <class ExecSpace>
ScanConfig newton_scan_config(const ScanConfig& scan) {
  ScanConfig chosen = scan;
  if (chosen.time_split == TimeSplit::automatic && !runs_on_host<ExecSpace>) chosen.time_split = TimeSplit::single_pass;
  return chosen;
}

// Copies group g's inputs at (b, t) out of u.
template <class Acc, class Cell, class UView>
KOKKOS_INLINE_FUNCTION void gather_inputs(const Cell& cell, const UView& u, int b, int t, int g, Acc* in) {
  for (int k = 0; k < cell.inputs_per_group(); ++k) in[k] = Acc(u(b, t, cell.input_column(g, k)));
}

// y = J x (transposed: y = J^T x) for a d x d row-major J.
template <class Acc>
KOKKOS_INLINE_FUNCTION void small_matvec(int d, const Acc* J, const Acc* x, Acc* y, bool transposed) {
  for (int i = 0; i < d; ++i) {
    Acc sum = 0;
    for (int j = 0; j < d; ++j) sum += (transposed ? J[j * d + i] : J[i * d + j]) * x[j];
    y[i] = sum;
  }
}

// Where a pass reads the current iterate h^k of group g at step t (t = -1 is the initial state).
// Every pass reads a View: an initial guess that is not given is written into one first
// (CellAtZeroState), so that each scan's kernels exist once per solve, not once per guess.
template <class HView, class H0View>
struct Iterate {
  HView h;
  H0View h0;
  int d;
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void load(int b, int t, int g, Acc* x) const {
    if (t < 0) return load_initial<Acc>(h0, b, g * d, d, x);
    for (int i = 0; i < d; ++i) x[i] = Acc(h(b, t, g * d + i));
  }
};

// linearize_diagonal_of, called rather than inlined: a quasi scan is diagonal over channels, and its
// kernels unroll several channels per thread, so a group of d >= 4 inlined there costs nvcc minutes.
template <class Acc, class Cell>
KOKKOS_FUNCTION __attribute__((noinline)) void linearize_diagonal_called(const Cell& cell, int g, int d, const Acc* h,
                                                                         const Acc* u, Acc* f, Acc* J_diag) {
  linearize_diagonal_of(cell, g, d, h, u, f, J_diag);
}

// A group's step, linearisation and vector-Jacobian product in the fused kernels (newton_fused.hpp,
// newton_fused_adjoint.hpp), which repeat them in each unrolled step of a chunk and in both window
// variants: inlined for groups of up to 4 values, whose operands stay in registers; called for
// larger ones, whose chunks live in local memory either way, and which inlined made most of nvcc's
// time for a dense cell. (The Newton scans inline them: calling them there did not shorten the
// dense Elman cell's test units under nvcc 13.0.)
template <class Cell>
inline constexpr bool inlines_cell_functions = cell_group_bound<Cell> <= 4;

template <class Acc, class Cell>
KOKKOS_FUNCTION __attribute__((noinline)) void step_called(const Cell& cell, int g, const Acc* h, const Acc* u,
                                                           Acc* f) {
  cell.step(g, h, u, f);
}
template <class Acc, class Cell>
KOKKOS_FUNCTION __attribute__((noinline)) void linearize_called(const Cell& cell, int g, const Acc* h, const Acc* u,
                                                                Acc* f, Acc* J) {
  cell.linearize(g, h, u, f, J);
}
template <class Acc, class Cell>
KOKKOS_FUNCTION __attribute__((noinline)) void vjp_called(const Cell& cell, int g, const Acc* h, const Acc* u,
                                                          const Acc* mu, Acc* dh, Acc* du, Acc* dp) {
  cell.vjp(g, h, u, mu, dh, du, dp);
}

template <class Acc, class Cell>
KOKKOS_INLINE_FUNCTION void repeated_step(const Cell& cell, int g, const Acc* h, const Acc* u, Acc* f) {
  if constexpr (inlines_cell_functions<Cell>) cell.step(g, h, u, f);
  else step_called(cell, g, h, u, f);
}
template <class Acc, class Cell>
KOKKOS_INLINE_FUNCTION void repeated_linearize(const Cell& cell, int g, const Acc* h, const Acc* u, Acc* f, Acc* J) {
  if constexpr (inlines_cell_functions<Cell>) cell.linearize(g, h, u, f, J);
  else linearize_called(cell, g, h, u, f, J);
}
template <class Acc, class Cell>
KOKKOS_INLINE_FUNCTION void repeated_vjp(const Cell& cell, int g, const Acc* h, const Acc* u, const Acc* mu, Acc* dh,
                                         Acc* du, Acc* dp) {
  if constexpr (inlines_cell_functions<Cell>) cell.vjp(g, h, u, mu, dh, du, dp);
  else vjp_called(cell, g, h, u, mu, dh, du, dp);
}

// A quasi scan's operands of one step on a device (NewtonLinearization::operands), called rather
// than inlined: the diagonal scan's kernels unroll steps and channels, and for groups of d >= 4
// each inlined copy of the loads and the call around linearize_diagonal_called made most of ptxas'
// time (nvcc 13.0, sm_90, 2026-12-06: a dense cell's quasi one-pass scan 49 s, 22 s called).
template <class Linearization, class Acc>
KOKKOS_FUNCTION __attribute__((noinline)) void quasi_operands_called(const Linearization& linearization, int b,
                                                                     int t, int g, Acc* f, Acc* J, Acc* h_t) {
  linearization.inlined_operands(b, t, g, f, J, h_t);
}

// The fused operands of one Newton iteration for the ordered scan (state: delta). With Quasi the
// scan is diagonal over channels and uses only J's diagonal; otherwise its groups are the cell's.
template <class Acc, class Cell, bool Quasi, class UView, class Iterate, class HOut>
struct NewtonLinearization {
  static constexpr int D = cell_group_bound<Cell>;
  static constexpr int jacobian_size = Quasi ? D : D * D; // operands' J: d x d, or its diagonal with Quasi
  Cell cell;
  UView u;
  Iterate old;
  HOut h_new;
  Acc omega;
  int d; // the cell's group size

  KOKKOS_INLINE_FUNCTION int cell_group(int g) const { return Quasi ? g / d : g; }

  // f(h^k_{t-1}, u_t), h^k_t and the Jacobian of the cell group holding scan group g: J (d x d),
  // or with Quasi its diagonal (linearize_diagonal_of, cell.hpp).
  KOKKOS_INLINE_FUNCTION void operands(int b, int t, int g, Acc* f, Acc* J, Acc* h_t) const {
    if constexpr (Quasi && D >= 4) {
      KOKKOS_IF_ON_DEVICE((quasi_operands_called(*this, b, t, g, f, J, h_t);))
      KOKKOS_IF_ON_HOST((inlined_operands(b, t, g, f, J, h_t);))
    } else {
      inlined_operands(b, t, g, f, J, h_t);
    }
  }
  KOKKOS_INLINE_FUNCTION void inlined_operands(int b, int t, int g, Acc* f, Acc* J, Acc* h_t) const {
    Acc h_prev[D], in[Cell::max_inputs_per_group];
    old.template load<Acc>(b, t - 1, cell_group(g), h_prev);
    old.template load<Acc>(b, t, cell_group(g), h_t);
    gather_inputs<Acc>(cell, u, b, t, cell_group(g), in);
    if constexpr (Quasi && D >= 4) linearize_diagonal_called(cell, cell_group(g), d, h_prev, in, f, J);
    else if constexpr (Quasi) linearize_diagonal_of(cell, cell_group(g), d, h_prev, in, f, J);
    else cell.linearize(cell_group(g), h_prev, in, f, J);
  }

  KOKKOS_INLINE_FUNCTION void initial(int, int, Acc* x) const {
    for (int i = 0; i < (Quasi ? 1 : d); ++i) x[i] = Acc(0);
  }
  KOKKOS_INLINE_FUNCTION void linear(int b, int t, int g, const Acc* x, Acc* y) const {
    Acc f[D], J[jacobian_size], h_t[D];
    operands(b, t, g, f, J, h_t);
    if constexpr (Quasi) y[0] = J[g % d] * x[0];
    else small_matvec(d, J, x, y, false);
  }
  KOKKOS_INLINE_FUNCTION void affine(int b, int t, int g, const Acc* x, Acc* y) const {
    Acc f[D], J[jacobian_size], h_t[D];
    operands(b, t, g, f, J, h_t);
    if constexpr (Quasi) {
      const int i = g % d;
      y[0] = J[i] * x[0] + f[i] - h_t[i];
    } else {
      small_matvec(d, J, x, y, false);
      for (int i = 0; i < d; ++i) y[i] += f[i] - h_t[i];
    }
  }
  // The whole map from one linearisation: L = J (column-major, stride MapD), c = f - h_t.
  template <int MapD>
  KOKKOS_INLINE_FUNCTION void step_map(int b, int t, int g, Acc* map) const {
    Acc f[D], J[jacobian_size], h_t[D];
    operands(b, t, g, f, J, h_t);
    if constexpr (Quasi) {
      const int i = g % d;
      map[0] = J[i];
      map[MapD * MapD] = f[i] - h_t[i];
    } else {
      for (int j = 0; j < d; ++j)
        for (int i = 0; i < d; ++i) map[j * MapD + i] = J[i * d + j];
      for (int i = 0; i < d; ++i) map[MapD * MapD + i] = f[i] - h_t[i];
    }
  }
  KOKKOS_INLINE_FUNCTION void store(int b, int t, int g, const Acc* delta) const {
    Acc h_t[D];
    old.template load<Acc>(b, t, cell_group(g), h_t);
    using out_t = typename HOut::value_type;
    if constexpr (Quasi) h_new(b, t, g) = out_t(h_t[g % d] + omega * delta[0]);
    else
      for (int i = 0; i < d; ++i) h_new(b, t, g * d + i) = out_t(h_t[i] + omega * delta[i]);
  }
};

// One Picard sweep, h^{k+1}_t = f(h^k_{t-1}, u_t), all (b, t, g) in parallel.
template <class Acc, class Cell, class UView, class Iterate, class HOut>
struct PicardSweep {
  Cell cell;
  UView u;
  Iterate old;
  HOut h_new;
  int steps, groups, d;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int g = int(index % groups), t = int(index / groups % steps), b = int(index / groups / steps);
    Acc h_prev[cell_group_bound<Cell>], in[Cell::max_inputs_per_group], f[cell_group_bound<Cell>];
    old.template load<Acc>(b, t - 1, g, h_prev);
    gather_inputs<Acc>(cell, u, b, t, g, in);
    cell.step(g, h_prev, in, f);
    for (int i = 0; i < d; ++i) h_new(b, t, g * d + i) = typename HOut::value_type(f[i]);
  }
};

// The initial guess h^0_t = f(0, u_t), all (b, t, g) in parallel.
template <class Acc, class Cell, class UView, class HOut>
struct CellAtZeroState {
  Cell cell;
  UView u;
  HOut h;
  int steps, groups, d;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int g = int(index % groups), t = int(index / groups % steps), b = int(index / groups / steps);
    Acc zero[cell_group_bound<Cell>] = {}, in[Cell::max_inputs_per_group], x[cell_group_bound<Cell>];
    gather_inputs<Acc>(cell, u, b, t, g, in);
    cell.step(g, zero, in, x);
    for (int i = 0; i < d; ++i) h(b, t, g * d + i) = typename HOut::value_type(x[i]);
  }
};

// The sequential loop: one thread per (batch, row of adjacent groups). On a GPU a row is one group
// (consecutive threads take consecutive groups); on a host a thread sweeps a row of 32 groups per
// step, so that it reads contiguous memory, as the ordered scan's rows do: one group per thread
// walked each channel through time with a stride of the state size and ran at 0.4x a plain loop
// (ParaGRU, B=16, T=4096, H=1024, one OpenMP thread, the 2-core machine, 2026-12-01).
template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
struct SequentialRecurrence {
  static constexpr int Row = lanes_per_thread<typename Cell::structure, ExecSpace>;
  Cell cell;
  UView u;
  HView h;
  H0View h0;
  int steps, groups, d;
  KOKKOS_INLINE_FUNCTION static int rows_of(int groups) { return (groups + Row - 1) / Row; }
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t index) const {
    const int rows = rows_of(groups), b = int(index / rows), first = int(index % rows) * Row;
    const int count = Kokkos::min(int(Row), groups - first); // by value: nvcc has no device address of Row
    Acc x[Row][cell_group_bound<Cell>], y[cell_group_bound<Cell>], in[Cell::max_inputs_per_group];
    for (int r = 0; r < count; ++r) load_initial<Acc>(h0, b, (first + r) * d, d, x[r]);
    for (int t = 0; t < steps; ++t)
      for (int r = 0; r < count; ++r) {
        const int g = first + r;
        gather_inputs<Acc>(cell, u, b, t, g, in);
        cell.step(g, x[r], in, y);
        for (int i = 0; i < d; ++i) {
          h(b, t, g * d + i) = typename HView::value_type(y[i]);
          x[r][i] = y[i];
        }
      }
  }
};

// The sequential loop of a cell with a team step (cell.hpp, has_team_step): one team per (batch
// element, group) walks t, thread j computing channel j, with the group's parameters and state in
// team scratch. A dense head of d channels costs a thread O(d) per step rather than O(d^2), and no
// thread holds an array of d x d values (a GPU puts those in local memory). Teams have d threads on
// devices and one on hosts (team_step_threads, also the adjoint's: newton_backward.hpp).
template <class ExecSpace>
int team_step_threads(int d) {
  return runs_on_host<ExecSpace> ? 1 : d;
}

template <class Acc, class ExecSpace, class Cell, class UView, class HView, class H0View>
struct SequentialTeamRecurrence {
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Cell cell;
  UView u;
  HView h;
  H0View h0;
  int steps, groups, d;

  KOKKOS_INLINE_FUNCTION static std::size_t scratch_bytes(const Cell& cell, int d) {
    return sizeof(Acc) * std::size_t(cell.team_params_size() + 2 * d + cell.team_work_size());
  }
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int b = team.league_rank() / groups, g = team.league_rank() % groups;
    Acc* staged = static_cast<Acc*>(team.team_scratch(0).get_shmem(scratch_bytes(cell, d)));
    Acc *current = staged + cell.team_params_size(), *next = current + d, *work = next + d;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d),
                         [&](int i) { current[i] = initial_value<Acc>(h0, b, g * d + i); });
    cell.stage_team_params(team, g, staged); // ends with a barrier
    for (int t = 0; t < steps; ++t) {
      cell.team_step(team, staged, current, [&](int k) { return Acc(u(b, t, cell.input_column(g, k))); }, next, work);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d),
                           [&](int i) { h(b, t, g * d + i) = typename HView::value_type(next[i]); });
      Acc* swapped = current;
      current = next, next = swapped;
    }
  }
};

// Per batch element, max over (t, channels) of |F_t| = |h_t - f(h_{t-1}, u_t)|; non-finite counts
// as +infinity so that a NaN can never pass a threshold. Teams reduce slices; a second kernel
// takes the max of each batch element's slices.
template <class Acc, class ExecSpace, class Cell, class UView, class Iterate>
struct ResidualSlices {
  Cell cell;
  UView u;
  Iterate iterate;
  Kokkos::View<double*, typename ExecSpace::memory_space> slice_max;
  int steps, groups, d, slices;
  double infinity;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Kokkos::TeamPolicy<ExecSpace>::member_type& team) const {
    const int b = team.league_rank() / slices, slice = team.league_rank() % slices;
    const long count = long(steps) * groups, per_slice = (count + slices - 1) / slices;
    const long begin = slice * per_slice, end = Kokkos::min(count, begin + per_slice);
    double slice_result = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, Kokkos::max(begin, end)),
        [&](long index, double& running) {
          const int t = int(index / groups), g = int(index % groups);
          Acc h_prev[cell_group_bound<Cell>], h_t[cell_group_bound<Cell>], in[Cell::max_inputs_per_group],
              f[cell_group_bound<Cell>];
          iterate.template load<Acc>(b, t - 1, g, h_prev);
          iterate.template load<Acc>(b, t, g, h_t);
          gather_inputs<Acc>(cell, u, b, t, g, in);
          cell.step(g, h_prev, in, f);
          for (int i = 0; i < d; ++i) {
            const double e = double(Kokkos::abs(h_t[i] - f[i]));
            if (!(e <= running)) running = Kokkos::isnan(e) ? infinity : e;
          }
        },
        Kokkos::Max<double>(slice_result));
    Kokkos::single(Kokkos::PerTeam(team), [&]() { slice_max(team.league_rank()) = slice_result; });
  }
};

template <class MemorySpace>
struct ConvergenceFlags {
  Kokkos::View<double*, MemorySpace> slice_max, residual;
  Kokkos::View<int*, MemorySpace> converged;
  int slices;
  double threshold;
  KOKKOS_INLINE_FUNCTION void operator()(int b) const {
    double r = 0;
    for (int s = 0; s < slices; ++s) r = Kokkos::max(r, slice_max(b * slices + s));
    residual(b) = r;
    if (converged.data()) converged(b) = r <= threshold;
  }
};

// Fills residual [B] (and converged [B] when it is allocated) for the iterate; never syncs.
template <class Acc, class ExecSpace, class Cell, class UView, class Iterate, class MemorySpace>
void compute_residual(const ExecSpace& space, const Cell& cell, const UView& u, const Iterate& iterate,
                      const ScanShape& shape, const Kokkos::View<double*, MemorySpace>& residual,
                      const Kokkos::View<int*, MemorySpace>& converged, double threshold) {
  const long work = long(shape.steps) * shape.groups;
  const long want = detail::ceil_div(4 * std::max<long>(1, space.concurrency()), std::max(1, shape.batch));
  const int slices = int(std::clamp<long>(std::min(want, detail::ceil_div(work, 256)), 1, 1 << 16));
  const auto slice_max = detail::workspace_view<Kokkos::View<double*, MemorySpace>>(
      space, "paraseq::newton_residual_slices", std::size_t(shape.batch) * slices);
  using slices_t = ResidualSlices<Acc, ExecSpace, Cell, UView, Iterate>;
  Kokkos::parallel_for("paraseq::newton_residual", team_policy(space, shape.batch * slices, Kokkos::AUTO),
                       slices_t{cell, u, iterate, slice_max, shape.steps, shape.groups, shape.group_size, slices,
                                std::numeric_limits<double>::infinity()});
  Kokkos::parallel_for("paraseq::newton_convergence", Kokkos::RangePolicy<ExecSpace>(space, 0, shape.batch),
                       ConvergenceFlags<MemorySpace>{slice_max, residual, converged, slices, threshold});
}

// The largest residual of the batch; a NaN wins, so that divergence is never read as convergence.
template <class MemorySpace>
struct LargestResidual {
  Kokkos::View<double*, MemorySpace> residual;
  KOKKOS_INLINE_FUNCTION void operator()(int b, double& largest) const {
    if (!(residual(b) <= largest)) largest = residual(b);
  }
};

// The solver reads device data on the host in these two functions only: the largest residual of
// the batch, and a count (the fused mode's iterations under residual_atol).
template <class ExecSpace, class MemorySpace>
double read_residual_on_host(const ExecSpace& space, const Kokkos::View<double*, MemorySpace>& residual) {
  ++newton_host_sync_counter();
  double largest = 0;
  Kokkos::parallel_reduce("paraseq::newton_max_residual", Kokkos::RangePolicy<ExecSpace>(space, 0, residual.extent(0)),
                          LargestResidual<MemorySpace>{residual}, Kokkos::Max<double>(largest));
  space.fence("paraseq::newton_solve: read the residual");
  return largest;
}

template <class ExecSpace, class MemorySpace>
int read_count_on_host(const ExecSpace& space, const Kokkos::View<int, MemorySpace>& count) {
  ++newton_host_sync_counter();
  int value = 0;
  Kokkos::deep_copy(space, value, count);
  space.fence("paraseq::newton_solve: read the iteration count");
  return value;
}

// out(p) = the sum of column p of partial in a fixed order (bitwise repeatable; OrderedColumnSum):
// blocks of at least 64 rows, each in row order, then the blocks in order, so that thousands of
// rows (the one-pass adjoint's, one per window) are not one thread's chain of dependent loads.
template <class ExecSpace, class PartialView, class OutView>
void sum_partials(const ExecSpace& space, const PartialView& partial, const OutView& out) {
  ordered_column_sums(space, "paraseq::newton_param_partial_blocks", partial, out);
}

} // namespace detail

} // namespace paraseq
