#pragma once
// Filling a View with a value and copying one View into another, with one kernel per value type and
// rank. Kokkos::deep_copy compiles a kernel for every layout and index type it may pick at run time
// (on CUDA about eight per call site, each with its launch code on the host), which made these small
// copies a large share of every compiled unit of paraseq; here the View's extents and strides travel
// as run-time values, so every View type of one value type and rank shares one kernel.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace paraseq::detail {

// A View's elements as a pointer with run-time extents and strides: element i is the i-th index in
// row-major order, wherever the strides put it. in_memory_order: element i is data[i] (a fill of a
// contiguous View, or a copy between two contiguous Views of the same strides).
template <class T, int Rank>
struct StridedElements {
  T* data;
  Kokkos::Array<std::size_t, Rank> extents, strides;
  bool in_memory_order;

  KOKKOS_INLINE_FUNCTION T& operator[](std::size_t i) const {
    if (in_memory_order) return data[i];
    std::size_t offset = 0;
    for (int r = Rank - 1; r >= 0; --r) {
      offset += (i % extents[r]) * strides[r];
      i /= extents[r];
    }
    return data[offset];
  }
};

template <class View, class Element = typename View::value_type>
StridedElements<Element, int(View::rank())> strided_elements(const View& view, bool in_memory_order) {
  constexpr int rank = int(View::rank());
  StridedElements<Element, rank> elements{view.data(), {}, {}, in_memory_order};
  for (int r = 0; r < rank; ++r) {
    elements.extents[r] = view.extent(r);
    elements.strides[r] = view.stride(r);
  }
  return elements;
}

template <class T, int Rank>
struct FillElements {
  StridedElements<T, Rank> to;
  T value;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const { to[i] = value; }
};

template <class T, int Rank>
struct CopyElements {
  StridedElements<T, Rank> to;
  StridedElements<const T, Rank> from;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const { to[i] = from[i]; }
};

template <class Space, class View>
constexpr bool view_reachable_from = Kokkos::is_view_v<View> &&
                                     Kokkos::SpaceAccessibility<Space, typename View::memory_space>::accessible;

// view(i...) = value for every element, enqueued on space.
template <class Space, class View>
void fill(const Space& space, const View& view, typename View::non_const_value_type value) {
  static_assert(view_reachable_from<Space, View>, "fill: a View in memory that the execution space reaches");
  static_assert(!std::is_const_v<typename View::value_type>, "fill: a View of non-const values");
  if (view.size() == 0) return;
  using T = typename View::non_const_value_type;
  Kokkos::parallel_for("paraseq::fill", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::size_t>>(space, 0, view.size()),
                       FillElements<T, int(View::rank())>{strided_elements(view, view.span_is_contiguous()), value});
}

// to(i...) = from(i...) for every element, enqueued on space; the Views have the same extents.
template <class Space, class ToView, class FromView>
void copy(const Space& space, const ToView& to, const FromView& from) {
  static_assert(view_reachable_from<Space, ToView> && view_reachable_from<Space, FromView>,
                "copy: Views in memory that the execution space reaches");
  using T = typename ToView::non_const_value_type;
  static_assert(!std::is_const_v<typename ToView::value_type> &&
                    std::is_same_v<typename FromView::non_const_value_type, T> && ToView::rank() == FromView::rank(),
                "copy: Views of one value type and rank, the destination's values non-const");
  constexpr int rank = int(ToView::rank());
  bool in_memory_order = to.span_is_contiguous() && from.span_is_contiguous();
  for (int r = 0; r < rank; ++r) {
    if (to.extent(r) != from.extent(r))
      throw std::logic_error("paraseq::detail::copy: extent " + std::to_string(r) + " is " +
                             std::to_string(to.extent(r)) + " in the destination and " +
                             std::to_string(from.extent(r)) + " in the source");
    in_memory_order = in_memory_order && to.stride(r) == from.stride(r);
  }
  if (to.size() == 0) return;
  Kokkos::parallel_for("paraseq::copy", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::size_t>>(space, 0, to.size()),
                       CopyElements<T, rank>{strided_elements(to, in_memory_order),
                                             strided_elements<FromView, const T>(from, in_memory_order)});
}

// A View allocated on space and filled with zeros by fill (allocating it initialised would compile
// Kokkos' initialisation kernel for its type).
template <class View, class Space, class... Extents>
View zeroed_view(const Space& space, const std::string& label, Extents... extents) {
  const View view(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), extents...);
  fill(space, view, 0);
  return view;
}

} // namespace paraseq::detail
