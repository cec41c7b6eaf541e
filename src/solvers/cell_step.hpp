#pragma once
// One step of a cell for a batch, h = f(h_prev, u): decoding a model that newton_solve trained, one
// token at a time, with the same cell.
//
//   u:      [B, cell.input_size()]  the step's pre-projected inputs (input_projection.hpp)
//   h_prev: [B, N]                  the state before the step, or ZeroInitialState{}
//   h:      [B, N]                  the state after it
//
// It is newton_solve's sequential mode over one step (u and h seen as [B, 1, *]), so a built-in
// cell runs its compiled instance and a step equals the t-th state of a solve of the same inputs
// up to the solve's own convergence. The Views must be LayoutRight and contiguous.

#include <paraseq/solvers/newton.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <type_traits>

namespace paraseq {

namespace detail {

// A contiguous LayoutRight [B, K] View as [B, 1, K], without a copy.
template <class View>
auto as_one_step(const char* argument, const View& view) {
  static_assert(Kokkos::is_view_v<View> && View::rank == 2,
                "paraseq::cell_step: u, h_prev and h must be rank-2 Views [B, *]");
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                "paraseq::cell_step: u, h_prev and h must be LayoutRight (row-major) Views");
  if (!view.span_is_contiguous())
    throw_invalid("paraseq::cell_step", argument, "a non-contiguous View", "a contiguous row-major View");
  return Kokkos::View<typename View::value_type***, Kokkos::LayoutRight, typename View::memory_space,
                      Kokkos::MemoryUnmanaged>(view.data(), view.extent(0), 1, view.extent(1));
}

} // namespace detail

template <class Acc = void, class ExecSpace, class Cell, class UView, class HPrevView, class HView>
  requires(Kokkos::is_view_v<HPrevView> || std::is_same_v<HPrevView, ZeroInitialState>)
void cell_step(const ExecSpace& space, const Cell& cell, const UView& u, const HPrevView& h_prev, const HView& h) {
  constexpr const char* fn = "paraseq::cell_step";
  const Kokkos::Profiling::ScopedRegion region(fn);
  static_assert(Kokkos::is_view_v<UView> && UView::rank == 2 && Kokkos::is_view_v<HView> && HView::rank == 2,
                "paraseq::cell_step: u and h must be rank-2 Views [B, *]");
  // Named here, so that errors speak of cell_step's arguments rather than of the solve's.
  cell.check(fn);
  const long B = long(u.extent(0)), N = cell.state_size();
  detail::require_extents(fn, "u", u, {B, cell.input_size()}, "[B, cell.input_size()]");
  detail::require_extents(fn, "h", h, {B, N}, "[B, cell.state_size()] with B from u");
  if constexpr (!std::is_same_v<HPrevView, ZeroInitialState>) {
    static_assert(HPrevView::rank == 2, "paraseq::cell_step: h_prev must be a [B, N] View");
    detail::require_extents(fn, "h_prev", h_prev, {B, N}, "[B, cell.state_size()] with B from u");
  }
  NewtonConfig config;
  config.mode = NewtonMode::sequential;
  newton_solve<Acc>(space, cell, detail::as_one_step("u", u), detail::as_one_step("h", h), config, h_prev);
}

} // namespace paraseq
