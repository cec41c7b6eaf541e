#pragma once
// The Kokkos half's side of work.hpp, which every unit of the work shares: the Kokkos runtime
// (initialised lazily, once per process), the execution space of a Place (on CUDA: PyTorch's
// current stream), and zero-copy Views of the arrays. No PyTorch header (see work.hpp).

#include "work.hpp"

#include <paraseq/core/views.hpp>

#include <Kokkos_Core.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace paraseq::torch_bridge {

// Initialises Kokkos on the first call (unless the host program already did); finalises it at exit.
void ensure_kokkos();

using HostSpace = Kokkos::DefaultHostExecutionSpace;

inline HostSpace host_space() {
  ensure_kokkos();
  return HostSpace{};
}

#ifdef KOKKOS_ENABLE_CUDA
// A Kokkos::Cuda instance on the place's stream (one instance per stream).
Kokkos::Cuda cuda_space(const char* op, const Place& place);
#endif

// A View of an array of Rank dimensions in Space's memory, of the types the compiled instances take
// (paraseq/core/views.hpp): InView for a const T, OutView otherwise.
template <class T, int Rank, class Space>
auto as_view(const Array& array) {
  using view_t = std::conditional_t<std::is_const_v<T>, InView<std::remove_const_t<T>, Rank, Space>, OutView<T, Rank, Space>>;
  if (array.rank != Rank)
    throw std::logic_error("paraseq: an array of rank " + std::to_string(array.rank) + " was passed where rank " +
                           std::to_string(Rank) + " was expected");
  T* data = static_cast<T*>(array.data);
  const int64_t* e = array.extents;
  if constexpr (Rank == 1) return view_t(data, e[0]);
  else if constexpr (Rank == 2) return view_t(data, e[0], e[1]);
  else if constexpr (Rank == 3) return view_t(data, e[0], e[1], e[2]);
  else if constexpr (Rank == 4) return view_t(data, e[0], e[1], e[2], e[3]);
  else return view_t(data, e[0], e[1], e[2], e[3], e[4]);
}

// Calls f(space) with the execution space of `place`: the host space, or Kokkos::Cuda on the
// place's stream. (The PyTorch half refuses the devices of no execution space here: place_of.)
template <class F>
decltype(auto) with_space(const char* op, const Place& place, const F& f) {
#ifdef KOKKOS_ENABLE_CUDA
  if (place.cuda) return f(cuda_space(op, place));
#else
  if (place.cuda)
    throw std::runtime_error(std::string(op) + ": tensors on a CUDA device are not supported by this build (Kokkos devices: " +
                             Kokkos::DefaultExecutionSpace::name() + ")");
#endif
  return f(host_space());
}

} // namespace paraseq::torch_bridge
