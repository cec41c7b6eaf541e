#pragma once
// The View types paraseq's compiled instances take (explicit instantiation: docs/architecture.md,
// "Compiled instances"). Every public entry point converts the caller's Views to these when it can:
// unmanaged, const where read, LayoutRight, in the memory space of the execution space. The set of
// kernel types is then closed, so the library compiles them once and a consumer does not. Views of
// another layout or memory space take the header path and are compiled where they are used.

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace paraseq {

namespace detail {

template <class T, int Rank>
struct add_pointers {
  using type = typename add_pointers<T, Rank - 1>::type*;
};
template <class T>
struct add_pointers<T, 0> {
  using type = T;
};

} // namespace detail

// A read-only (In) or writable (Out) unmanaged LayoutRight View of rank Rank in the memory space
// of ExecSpace.
template <class T, int Rank, class ExecSpace>
using InView = Kokkos::View<typename detail::add_pointers<const T, Rank>::type, Kokkos::LayoutRight,
                            typename ExecSpace::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, int Rank, class ExecSpace>
using OutView = Kokkos::View<typename detail::add_pointers<T, Rank>::type, Kokkos::LayoutRight,
                             typename ExecSpace::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

namespace detail {

// True when View converts to InView<T, rank, ExecSpace> (or OutView when Writable) without a copy:
// same value type, LayoutRight, the space's own memory space.
template <class View, class T, class ExecSpace, bool Writable>
constexpr bool converts_to_compiled_view() {
  if constexpr (!Kokkos::is_view_v<View>) return false;
  else {
    using value = typename View::value_type;
    return std::is_same_v<typename View::non_const_value_type, T> &&
           std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> &&
           std::is_same_v<typename View::memory_space, typename ExecSpace::memory_space> &&
           (!Writable || !std::is_const_v<value>);
  }
}

} // namespace detail

} // namespace paraseq
