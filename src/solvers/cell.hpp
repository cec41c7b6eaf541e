#pragma once
// The cell concept: what the Newton solver needs from a recurrence h_t = f(h_{t-1}, u_t).
//
// The state of N channels splits into groups of d channels (the declared structure of df/dh:
// Diagonal d = 1, BlockDiagonal<K> d = K, Dense d = N <= 32, DenseUpTo<M> d = N <= M); group g
// owns channels g*d .. g*d+d-1 and f of a group depends only on that group's state. The solver
// hands a cell the group's state and the group's inputs as small on-chip arrays, so a cell never
// sees Views of h or u:
//
//   struct MyCell {
//     using structure = paraseq::Diagonal;          // structure of df/dh
//     static constexpr int max_inputs_per_group = 3; // bounds for on-chip arrays
//     static constexpr int max_params_per_group = 3;
//     int state_size() const;                        // N
//     int input_size() const;                        // width of u: [B, T, input_size()]
//     int param_count() const;                       // length of the flat parameter gradient
//     KOKKOS_FUNCTION int inputs_per_group() const;
//     KOKKOS_FUNCTION int params_per_group() const;
//     KOKKOS_FUNCTION int input_column(int g, int k) const; // column of u holding input k of group g
//     KOKKOS_FUNCTION int param_index(int g, int k) const;  // gradient slot of parameter k of group g
//     void check(const char* fn) const;              // throws if the parameters are inconsistent
//     // f = f(h, u) for group g; h, f: d values, u: inputs_per_group() values
//     template <class Acc> KOKKOS_FUNCTION void step(int g, const Acc* h, const Acc* u, Acc* f) const;
//     // f as above and J = df/dh, d x d row-major: J[i*d + j] = df_i / dh_j
//     template <class Acc> KOKKOS_FUNCTION void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const;
//     // vector-Jacobian products with mu (d values): dh = (df/dh)^T mu, du = (df/du)^T mu,
//     // dparams = (df/dtheta_g)^T mu for the group's own parameters (each slot written, not added to)
//     template <class Acc> KOKKOS_FUNCTION void vjp(int g, const Acc* h, const Acc* u, const Acc* mu,
//                                                   Acc* dh, Acc* du, Acc* dparams) const;
//   };
//
// A cell whose Jacobian costs more than O(d^2) (ParaGRUHeads: O(d^3)) may also provide J's diagonal
// alone, which the quasi Jacobian (NewtonJacobian::quasi) uses instead of linearize:
//
//     // f as in linearize and J_diag[i] = df_i / dh_i
//     template <class Acc> KOKKOS_FUNCTION void linearize_diagonal(int g, const Acc* h, const Acc* u,
//                                                                  Acc* f, Acc* J_diag) const;
//
// A cell with a dense structure whose state splits into several dense groups (ParaGRUHeads' heads)
// declares their size, d <= the structure's bound, on the host: `int group_size() const;`. Without
// it a dense cell's one group is the whole state.
//
// A cell whose group's step costs O(d^2) but whose Jacobian costs more (ParaGRUHeads) may also let
// a team of threads compute a group's step and vjp together, thread j its channel j, from the
// group's parameters staged once in team scratch. The sequential mode and its adjoint then run one
// team per (batch element, group) instead of one thread, whose arrays of d x d values would sit in
// local memory on a GPU (newton_kernels.hpp, SequentialTeamRecurrence):
//
//     KOKKOS_FUNCTION int team_params_size() const; // values of the staged parameters
//     KOKKOS_FUNCTION int team_work_size() const;   // values of team scratch the step and vjp use
//     template <class Acc, class Member> KOKKOS_FUNCTION void stage_team_params(const Member& team,
//                                                                               int g, Acc* staged) const;
//     // f (d values) from h; input(k) returns input k of the group at this step
//     template <class Acc, class Member, class Input> KOKKOS_FUNCTION void team_step(const Member& team,
//         const Acc* staged, const Acc* h, const Input& input, Acc* f, Acc* work) const;
//     // vjp's dh and du (written) and dparams (added to, in param_index's slot order k)
//     template <class Acc, class Member, class Input> KOKKOS_FUNCTION void team_vjp(const Member& team,
//         const Acc* staged, const Acc* h, const Input& input, const Acc* mu, Acc* dh, Acc* du,
//         Acc* dparams, Acc* work) const;
//
// Every pointer is to team scratch; each function returns after a team barrier, with its outputs
// visible to every thread of the team.
//
// A cell whose exact Newton iterations need not converge from the solver's first guess f(0, u_t)
// in the few iterations a solve runs (ParaSLSTM: its stabiliser; docs/solvers.md, "ParaSLSTM's
// convergence") declares it, and the automatic mode then runs the sequential loop, which is exact:
//
//     static constexpr bool newton_may_diverge = true;
//
// Each parameter belongs to exactly one group (param_index is one-to-one), which keeps the gradient
// reduction free of atomics and deterministic. A cell is copied to the device by value: hold
// parameters in Views, never in host containers, and keep every member function free of exceptions.

#include <paraseq/core/structure.hpp>

#include <Kokkos_Core.hpp>

#include <concepts>

namespace paraseq {

namespace detail {

// Built-in cells (cells.hpp) specialise these: the first for every instance, the second for the
// (Cell, T, memory space) combinations that paraseq compiles once (views.hpp).
template <class Cell>
inline constexpr bool is_builtin_cell_v = false;
template <class Cell, class T, class MemorySpace>
inline constexpr bool is_compiled_cell_v = false;

template <class Cell>
concept has_cell_structure = requires { typename Cell::structure; } && is_structure_v<typename Cell::structure>;

template <class Cell>
concept has_cell_bounds = requires {
  { Cell::max_inputs_per_group } -> std::convertible_to<int>;
  { Cell::max_params_per_group } -> std::convertible_to<int>;
};

template <class Cell>
concept has_cell_sizes = requires(const Cell& cell, int g, int k, const char* fn) {
  { cell.state_size() } -> std::convertible_to<int>;
  { cell.input_size() } -> std::convertible_to<int>;
  { cell.param_count() } -> std::convertible_to<int>;
  { cell.inputs_per_group() } -> std::convertible_to<int>;
  { cell.params_per_group() } -> std::convertible_to<int>;
  { cell.input_column(g, k) } -> std::convertible_to<int>;
  { cell.param_index(g, k) } -> std::convertible_to<int>;
  cell.check(fn);
};

template <class Cell, class Acc>
concept has_cell_step = requires(const Cell& cell, int g, const Acc* in, Acc* out) { cell.step(g, in, in, out); };

template <class Cell, class Acc>
concept has_cell_linearize =
    requires(const Cell& cell, int g, const Acc* in, Acc* out) { cell.linearize(g, in, in, out, out); };

template <class Cell, class Acc>
concept has_cell_linearize_diagonal =
    requires(const Cell& cell, int g, const Acc* in, Acc* out) { cell.linearize_diagonal(g, in, in, out, out); };

template <class Cell, class Acc>
concept has_cell_vjp =
    requires(const Cell& cell, int g, const Acc* in, Acc* out) { cell.vjp(g, in, in, in, out, out, out); };

} // namespace detail

// A cell newton_solve and newton_backward can run in precision Acc (newton_solve alone needs no vjp).
template <class Cell, class Acc>
concept NewtonCell = detail::has_cell_structure<Cell> && detail::has_cell_bounds<Cell> &&
                     detail::has_cell_sizes<Cell> && detail::has_cell_step<Cell, Acc> &&
                     detail::has_cell_linearize<Cell, Acc> && detail::has_cell_vjp<Cell, Acc>;

namespace detail {

// One readable error per missing piece instead of a wall of substitution failures.
template <class Cell, class Acc>
constexpr void check_cell() {
  static_assert(has_cell_structure<Cell>,
                "paraseq cell: declare `using structure = paraseq::Diagonal;` (or BlockDiagonal<K>, Dense, DenseUpTo<M>): "
                "the structure of the state Jacobian df/dh");
  static_assert(has_cell_bounds<Cell>,
                "paraseq cell: declare `static constexpr int max_inputs_per_group` and `max_params_per_group`");
  static_assert(has_cell_sizes<Cell>,
                "paraseq cell: provide state_size(), input_size(), param_count(), inputs_per_group(), "
                "params_per_group(), input_column(g, k), param_index(g, k) and check(const char*)");
  static_assert(has_cell_step<Cell, Acc>,
                "paraseq cell: provide `template <class Acc> KOKKOS_FUNCTION void step(int g, const Acc* h, "
                "const Acc* u, Acc* f) const`");
  static_assert(has_cell_linearize<Cell, Acc>,
                "paraseq cell: provide `template <class Acc> KOKKOS_FUNCTION void linearize(int g, const Acc* h, "
                "const Acc* u, Acc* f, Acc* J) const` (J row-major, d x d)");
}

// What newton_backward needs beyond newton_solve: the vector-Jacobian products.
template <class Cell, class Acc>
constexpr void check_cell_gradient() {
  check_cell<Cell, Acc>();
  static_assert(has_cell_vjp<Cell, Acc>,
                "paraseq cell: newton_backward needs `template <class Acc> KOKKOS_FUNCTION void vjp(int g, "
                "const Acc* h, const Acc* u, const Acc* mu, Acc* dh, Acc* du, Acc* dparams) const`");
}

template <class Cell>
inline constexpr int cell_group_bound = Cell::structure::max_group_size;

// f and J's diagonal (d values) of cell group g: the cell's linearize_diagonal where it has one, else
// the diagonal of its full linearize. The quasi Jacobian of every solver takes it from here.
template <class Acc, class Cell>
KOKKOS_INLINE_FUNCTION void linearize_diagonal_of(const Cell& cell, int g, int d, const Acc* h, const Acc* u, Acc* f,
                                                  Acc* J_diag) {
  if constexpr (has_cell_linearize_diagonal<Cell, Acc>) {
    cell.linearize_diagonal(g, h, u, f, J_diag);
  } else {
    Acc J[cell_group_bound<Cell> * cell_group_bound<Cell>];
    cell.linearize(g, h, u, f, J);
    for (int i = 0; i < d; ++i) J_diag[i] = J[i * (d + 1)];
  }
}

// A cell that declares newton_may_diverge (above).
template <class Cell>
concept newton_may_diverge = requires { requires Cell::newton_may_diverge; };

// A cell with the team step above (every function is checked where it is called).
template <class Cell>
concept has_team_step = requires(const Cell& cell) {
  { cell.team_params_size() } -> std::convertible_to<int>;
  { cell.team_work_size() } -> std::convertible_to<int>;
};

template <class Cell>
concept declares_group_size = is_dense_v<typename Cell::structure> && requires(const Cell& cell) {
  { cell.group_size() } -> std::convertible_to<int>;
};

// Channels per group of the cell's state: the size it declares, else its structure's.
template <class Cell>
int cell_group_size(const Cell& cell) {
  if constexpr (declares_group_size<Cell>) return cell.group_size();
  else return group_size<typename Cell::structure>(cell.state_size());
}

} // namespace detail

} // namespace paraseq
