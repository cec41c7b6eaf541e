#pragma once
// The solves behind the Newton operators for one cell and float type (see newton_ops.hpp):
// newton_forward and newton_gradients run on the space of the tensors' device, compiling every
// mode family; newton_forward_on and newton_gradients_on run on a given space and compile the
// families Modes alone (the generated extensions of cells of your own put each family of a CUDA
// build in a translation unit of its own: python/paraseq/_compiled_cell.py). Included only by the
// units generated from newton_instance.cpp.in and by those extensions.

#include "newton_ops.hpp"

#include <paraseq/core/fill.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include <ATen/ops/zeros.h>

#include <type_traits>

namespace paraseq::torch_bridge {

// Calls f(h0): tensors.h0 as a View or, where the call has none, ZeroInitialState for a built-in
// cell (its compiled instances take either) and zeros [B, N] for a cell of one's own, whose solver
// is then compiled for one type of initial state instead of two.
template <class T, class Space, class Cell, class F>
void with_initial_state(const Cell& cell, const NewtonTensors& tensors, const F& f) {
  if constexpr (detail::is_builtin_cell_v<Cell>) {
    if (tensors.h0.defined()) f(as_view<const T, 2, Space>(tensors.h0));
    else f(ZeroInitialState{});
  } else {
    const at::Tensor h0 =
        tensors.h0.defined() ? tensors.h0 : at::zeros({tensors.h.size(0), tensors.h.size(2)}, tensors.h.options());
    f(as_view<const T, 2, Space>(h0));
  }
}

// The cell of one call: MakeCell over its parameters, and ParaSLSTM's eps.
template <class MakeCell, class T, class Space>
auto make_cell(const NewtonTensors& tensors) {
  if constexpr (std::is_same_v<MakeCell, MakeSlstm>)
    return MakeCell{}.template operator()<T, Space>(tensors.params, tensors.eps);
  else return MakeCell{}.template operator()<T, Space>(tensors.params);
}

template <class MakeCell, class T, CompiledNewtonModes Modes = CompiledNewtonModes::all, class Space>
void newton_forward_on(const char* op, const NewtonTensors& tensors, const NewtonConfig& config, const Space& space) {
  using Mem = typename Space::memory_space;
  const bool with_residual = tensors.residual.numel() > 0;
  const auto cell = make_cell<MakeCell, T, Space>(tensors);
  const auto u_view = as_view<const T, 3, Space>(tensors.u);
  const auto h_view = as_view<T, 3, Space>(tensors.h);
  NewtonStats<Mem> stats;
  NewtonStats<Mem>* stats_ptr = with_residual ? &stats : nullptr;
  translate_errors([&] {
    try {
      with_initial_state<T, Space>(cell, tensors, [&](const auto& h0) {
        newton_solve<Modes>(space, cell, u_view, h_view, config, h0, stats_ptr);
      });
    } catch (const NewtonDivergenceError& error) {
      // With the residual asked for, the failed result and its residual are returned (the solver
      // fills both before it throws) and the caller checks them: paraseq.newton_apply raises
      // paraseq.NewtonDivergenceError, with the residual, from them. No Python exception type of
      // a package can cross torch.ops from a library without Python, and parsing the message of
      // a RuntimeError would break with its wording.
      TORCH_CHECK(with_residual, op, ": ", error.what(), " (NewtonDivergenceError)");
    }
  });
  if (with_residual) {
    paraseq::detail::copy(space, as_view<double, 1, Space>(tensors.residual), stats.residual);
    // Filled by kernels from host values: no copy from host memory, so a captured graph stays valid.
    tensors.stats.select(0, 0).fill_(int64_t(stats.iterations));
    tensors.stats.select(0, 1).fill_(scan_backend_index(stats.mode));
  }
}

template <class MakeCell, class T, CompiledNewtonModes Modes = CompiledNewtonModes::all, class Space>
void newton_gradients_on(const char* op, const NewtonTensors& tensors, const NewtonConfig& config, const Space& space) {
  const auto cell = make_cell<MakeCell, T, Space>(tensors);
  const auto u_view = as_view<const T, 3, Space>(tensors.u);
  const auto h_view = as_view<const T, 3, Space>(tensors.h);
  const auto g_view = as_view<const T, 3, Space>(tensors.grad_h);
  const auto du_view = as_view<T, 3, Space>(tensors.du);
  const auto dp_view = as_view<T, 1, Space>(tensors.dparams);
  const auto dh0_view = as_view<T, 2, Space>(tensors.dh0);
  translate_errors([&] {
    with_initial_state<T, Space>(cell, tensors, [&](const auto& h0) {
      newton_backward<Modes>(space, cell, u_view, h_view, g_view, du_view, dp_view, h0, dh0_view, config);
    });
  });
}

// The mode a solve of MakeCell's cell on `space` runs (newton.hpp's rule for NewtonMode::automatic),
// so that a caller can pick the unit that compiled its family. Errors as newton_solve's.
template <class MakeCell, class T, class Space>
NewtonMode newton_mode_on(const char* op, const NewtonTensors& tensors, const NewtonConfig& config, const Space& space) {
  const auto cell = make_cell<MakeCell, T, Space>(tensors);
  NewtonMode mode = NewtonMode::automatic;
  translate_errors([&] {
    detail::check_newton_config(config);
    mode = detail::choose_compiled_newton_mode<CompiledNewtonModes::all, decltype(cell), T>(
        detail::newton_fn, space, config, detail::newton_shape(cell, as_view<const T, 3, Space>(tensors.u)));
  });
  return mode;
}

template <class MakeCell, class T>
void newton_forward(const char* op, const NewtonTensors& tensors, const NewtonConfig& config) {
  with_space(op, tensors.u, [&](const auto& space) { newton_forward_on<MakeCell, T>(op, tensors, config, space); });
}

template <class MakeCell, class T>
void newton_gradients(const char* op, const NewtonTensors& tensors, const NewtonConfig& config) {
  with_space(op, tensors.u, [&](const auto& space) { newton_gradients_on<MakeCell, T>(op, tensors, config, space); });
}

} // namespace paraseq::torch_bridge
