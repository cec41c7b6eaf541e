#pragma once
// The work of the Newton operators for one cell and float type (work.hpp; the PyTorch half:
// newton_ops.cpp): newton_forward and newton_gradients run on the arrays' device, compiling every
// mode family; newton_forward_on and newton_gradients_on run on a given space and compile the
// families Modes alone (the generated extensions of cells of your own put each family of a CUDA
// build in a translation unit of its own: python/paraseq/_compiled_cell.py). Included only by the
// units generated from newton_instance.cpp.in and by those extensions.

#include "runtime.hpp"

#include <paraseq/core/fill.hpp>
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace paraseq::torch_bridge {

static_assert(gru_max_head_size == ParaGRUHeads<float>::max_head_size, "work.hpp's gru_max_head_size is ParaGRUHeads'");

// The modes by their scan_backend index (entry [7] of the packed config, and the operators' stats output).
inline constexpr NewtonMode scan_backend_modes[] = {NewtonMode::automatic, NewtonMode::newton, NewtonMode::fused,
                                                    NewtonMode::sequential, NewtonMode::one_pass};
inline int64_t scan_backend_index(NewtonMode mode) {
  int64_t index = 0;
  while (scan_backend_modes[index] != mode) ++index;
  return index;
}

// Reads the entries of one packed config (work.hpp), each error naming the entry and its field.
struct PackedConfigReader {
  static constexpr const char* fields[newton_config_layout_size] = {
      "version",      "max_iters",    "omega",        "residual_atol", "residual_fail",
      "picard_iters", "picard_adapt", "scan_backend", "jacobian"};
  const char* op;
  const PackedNewtonConfig& entries;

  // An entry as given: whole numbers in full (2147483648, not 2.14748e+09), others as streams print them.
  static std::string text(double value) {
    if (value == std::trunc(value) && std::abs(value) < 1e15) return std::to_string(int64_t(value));
    std::ostringstream stream;
    stream << value;
    return stream.str();
  }
  [[noreturn]] void refuse(int index, const char* expected) const {
    throw std::invalid_argument(std::string(op) + ": argument 'config' has entry " + std::to_string(index) + " (" +
                                fields[index] + ") = " + text(entries[index]) + ", expected " + expected +
                                " (paraseq.NewtonConfig layout version " + std::to_string(newton_config_layout_version) +
                                ")");
  }
  // A whole number in [low, high] as an int: refused, not truncated.
  int integer(int index, double low, double high, const char* expected) const {
    const double value = entries[index];
    if (!(value >= low && value <= high && value == double(int64_t(value)))) refuse(index, expected);
    return int(value);
  }
  // A residual threshold: -1 for None, or a number >= 0 (NaN would refuse or accept everything).
  std::optional<double> threshold(int index) const {
    const double value = entries[index];
    if (value == -1) return std::nullopt;
    if (!(value >= 0)) refuse(index, "-1 (None) or a number >= 0");
    return value;
  }
};

// The NewtonConfig of a packed config, checked entry by entry.
inline NewtonConfig newton_config_from_list(const char* op, const PackedNewtonConfig& config) {
  const std::string layout = " (paraseq.NewtonConfig layout version " + std::to_string(newton_config_layout_version);
  if (config.size() != std::size_t(newton_config_layout_size))
    throw std::invalid_argument(std::string(op) + ": argument 'config' has " + std::to_string(config.size()) +
                                " entries, expected " + std::to_string(newton_config_layout_size) + layout +
                                ": version, max_iters, omega, residual_atol, residual_fail, picard_iters, "
                                "picard_adapt, scan_backend, jacobian)");
  const PackedConfigReader packed{op, config};
  if (config[0] != newton_config_layout_version)
    throw std::invalid_argument(std::string(op) + ": argument 'config' has layout version " +
                                PackedConfigReader::text(config[0]) + ", expected " +
                                std::to_string(newton_config_layout_version) +
                                " (a config packed by another version of the paraseq Python package than this "
                                "operator library's)");
  constexpr double int_max = std::numeric_limits<int>::max();
  constexpr const char* count = "an integer with 0 <= value <= 2147483647 (2^31 - 1)";
  NewtonConfig result;
  result.max_iters = packed.integer(1, 0, int_max, count);
  result.omega = config[2];
  if (!(result.omega > 0 && result.omega <= 1)) packed.refuse(2, "0 < omega <= 1");
  result.residual_atol = packed.threshold(3);
  result.residual_fail = packed.threshold(4);
  result.picard_iters = packed.integer(5, 0, int_max, count);
  result.picard_adapt = packed.integer(6, 0, 1, "0 (False) or 1 (True)") == 1;
  result.mode = scan_backend_modes[packed.integer(
      7, 0, 4, "0 (\"auto\"), 1 (\"newton\"), 2 (\"fused\"), 3 (\"sequential\") or 4 (\"one_pass\")")];
  // The solver refuses the fused mode with the quasi Jacobian itself (newton.hpp, check_newton_config).
  result.jacobian = packed.integer(8, 0, 1, "0 (\"exact\") or 1 (\"quasi\")") == 1 ? NewtonJacobian::quasi
                                                                                     : NewtonJacobian::exact;
  return result;
}

// The cells over the arrays of their parameters (work.hpp).
struct MakeGru {
  template <class T, class Space>
  auto operator()(const NewtonArrays& arrays) const {
    return ParaGRU<T, typename Space::memory_space>{as_view<const T, 2, Space>(arrays.params[0])};
  }
};
struct MakeGruHeads {
  template <class T, class Space>
  auto operator()(const NewtonArrays& arrays) const {
    return ParaGRUHeads<T, typename Space::memory_space>{as_view<const T, 4, Space>(arrays.params[0])};
  }
};
struct MakeLstm {
  template <class T, class Space>
  auto operator()(const NewtonArrays& arrays) const {
    return ParaLSTM<T, typename Space::memory_space>{as_view<const T, 2, Space>(arrays.params[0]),
                                                     as_view<const T, 2, Space>(arrays.params[1])};
  }
};
struct MakeSlstm {
  template <class T, class Space>
  auto operator()(const NewtonArrays& arrays) const {
    return ParaSLSTM<T, typename Space::memory_space>{as_view<const T, 2, Space>(arrays.params[0]), arrays.eps};
  }
};

// Calls f(h0): arrays.h0 as a View or, where the call has none, ZeroInitialState for a built-in cell
// (its compiled instances take either). A cell of one's own is compiled for one type of initial
// state instead of two: its caller always gives h0 (zeros where the call has none).
template <class T, class Space, class Cell, class F>
void with_initial_state(const Cell& cell, const NewtonArrays& arrays, const F& f) {
  if constexpr (detail::is_builtin_cell_v<Cell>) {
    if (arrays.h0.given()) f(as_view<const T, 2, Space>(arrays.h0));
    else f(ZeroInitialState{});
  } else {
    if (!arrays.h0.given()) throw std::logic_error("paraseq: a cell of one's own is solved from a given h0");
    f(as_view<const T, 2, Space>(arrays.h0));
  }
}

// The cell of one call: MakeCell over its parameters.
template <class MakeCell, class T, class Space>
auto make_cell(const NewtonArrays& arrays) {
  return MakeCell{}.template operator()<T, Space>(arrays);
}

template <class MakeCell, class T, CompiledNewtonModes Modes = CompiledNewtonModes::all, class Space>
void newton_forward_on(const char* op, const NewtonArrays& arrays, const NewtonConfig& config, const Space& space) {
  using Mem = typename Space::memory_space;
  const bool with_residual = arrays.residual.extents[0] > 0;
  const auto cell = make_cell<MakeCell, T, Space>(arrays);
  const auto u_view = as_view<const T, 3, Space>(arrays.u);
  const auto h_view = as_view<T, 3, Space>(arrays.h);
  NewtonStats<Mem> stats;
  NewtonStats<Mem>* stats_ptr = with_residual ? &stats : nullptr;
  try {
    with_initial_state<T, Space>(cell, arrays, [&](const auto& h0) {
      newton_solve<Modes>(space, cell, u_view, h_view, config, h0, stats_ptr);
    });
  } catch (const NewtonDivergenceError& error) {
    // With the residual asked for, the failed result and its residual are returned (the solver
    // fills both before it throws) and the caller checks them: paraseq.newton_apply raises
    // paraseq.NewtonDivergenceError, with the residual, from them. No Python exception type of
    // a package can cross torch.ops from a library without Python, and parsing the message of
    // a RuntimeError would break with its wording.
    if (!with_residual) throw std::runtime_error(std::string(op) + ": " + error.what() + " (NewtonDivergenceError)");
  }
  if (with_residual) {
    paraseq::detail::copy(space, as_view<double, 1, Space>(arrays.residual), stats.residual);
    // Filled by kernels from host values: no copy from host memory, so a captured graph stays valid.
    const auto stats_view = as_view<int64_t, 1, Space>(arrays.stats);
    paraseq::detail::fill(space, Kokkos::subview(stats_view, std::pair(0, 1)), int64_t(stats.iterations));
    paraseq::detail::fill(space, Kokkos::subview(stats_view, std::pair(1, 2)), scan_backend_index(stats.mode));
  }
}

template <class MakeCell, class T, CompiledNewtonModes Modes = CompiledNewtonModes::all, class Space>
void newton_gradients_on(const NewtonArrays& arrays, const NewtonConfig& config, const Space& space) {
  const auto cell = make_cell<MakeCell, T, Space>(arrays);
  const auto u_view = as_view<const T, 3, Space>(arrays.u);
  const auto h_view = as_view<const T, 3, Space>(arrays.h);
  const auto g_view = as_view<const T, 3, Space>(arrays.grad_h);
  const auto du_view = as_view<T, 3, Space>(arrays.du);
  const auto dp_view = as_view<T, 1, Space>(arrays.dparams);
  const auto dh0_view = as_view<T, 2, Space>(arrays.dh0);
  with_initial_state<T, Space>(cell, arrays, [&](const auto& h0) {
    newton_backward<Modes>(space, cell, u_view, h_view, g_view, du_view, dp_view, h0, dh0_view, config);
  });
}

// The mode a solve of MakeCell's cell on `space` runs (newton.hpp's rule for NewtonMode::automatic),
// so that a caller can pick the unit that compiled its family. Errors as newton_solve's.
template <class MakeCell, class T, class Space>
NewtonMode newton_mode_on(const NewtonArrays& arrays, const NewtonConfig& config, const Space& space) {
  const auto cell = make_cell<MakeCell, T, Space>(arrays);
  detail::check_newton_config(config);
  return detail::choose_compiled_newton_mode<CompiledNewtonModes::all, decltype(cell), T>(
      detail::newton_fn, space, config, detail::newton_shape(cell, as_view<const T, 3, Space>(arrays.u)));
}

template <class MakeCell, class T>
void newton_forward(const char* op, const Place& place, const NewtonArrays& arrays, const PackedNewtonConfig& config) {
  const NewtonConfig solver_config = newton_config_from_list(op, config);
  with_space(op, place, [&](const auto& space) { newton_forward_on<MakeCell, T>(op, arrays, solver_config, space); });
}

// The backward runs the default config: the automatic mode.
template <class MakeCell, class T>
void newton_gradients(const char* op, const Place& place, const NewtonArrays& arrays) {
  with_space(op, place, [&](const auto& space) { newton_gradients_on<MakeCell, T>(arrays, NewtonConfig{}, space); });
}

} // namespace paraseq::torch_bridge
