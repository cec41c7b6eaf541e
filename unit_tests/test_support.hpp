#pragma once
// Shared test machinery: the list of enabled execution spaces every kernel test is instantiated for,
// and helpers to make random device Views and compare them with host references.

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

namespace paraseq::test {

namespace detail {
template <class Tuple>
struct to_gtest_types;
template <class... Spaces>
struct to_gtest_types<std::tuple<Spaces...>> {
  using type = ::testing::Types<Spaces...>;
};
} // namespace detail

// Every execution space this Kokkos was built with.
using ExecutionSpaces = typename detail::to_gtest_types<decltype(std::tuple_cat(
#ifdef KOKKOS_ENABLE_CUDA
    std::declval<std::tuple<Kokkos::Cuda>>(),
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    std::declval<std::tuple<Kokkos::OpenMP>>(),
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    std::declval<std::tuple<Kokkos::Serial>>(),
#endif
    std::declval<std::tuple<>>()))>::type;

// A call that a test expects to throw: EXPECT_THAT(Call([&] { ... }), ThrowsMessage<...>(...)). As one
// type for every lambda, gmock compiles its exception matcher once per matcher, not once per call.
using Call = std::function<void()>;

// Names typed tests after the space: ctest then lists "LinearScan/OpenMP.Accuracy".
struct SpaceName {
  template <class Space>
  static std::string GetName(int) {
    return Space::name();
  }
};

template <class T, class Space>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, typename Space::memory_space>;
template <class T, class Space>
using View5 = Kokkos::View<T*****, Kokkos::LayoutRight, typename Space::memory_space>;

// dst = src for two contiguous Views of one element type, extents and strides in any memory
// spaces (a device View and its host mirror), copied as bytes. Kokkos::deep_copy of typed Views
// compiles copy kernels and their host code for each element type, rank and layout on every
// device, seconds of nvcc per test unit; as bytes, all the copies of a unit share one set.
template <class Dst, class Src>
void copy_contiguous(const Dst& dst, const Src& src) {
  using T = typename Dst::non_const_value_type;
  static_assert(std::is_same_v<T, typename Src::non_const_value_type> && int(Dst::rank) == int(Src::rank),
                "copy_contiguous: Views of one element type and rank");
  bool same_shape = dst.span_is_contiguous() && src.span_is_contiguous() && dst.span() == src.span();
  for (int r = 0; r < int(Dst::rank); ++r)
    same_shape = same_shape && dst.extent(r) == src.extent(r) && dst.stride(r) == src.stride(r);
  if (!same_shape)
    throw std::invalid_argument("paraseq::test::copy_contiguous: '" + dst.label() + "' and '" + src.label() +
                                "' must be contiguous Views with the same extents and strides");
  if (static_cast<const void*>(dst.data()) == static_cast<const void*>(src.data())) return;
  using Byte = unsigned char;
  using DstBytes = Kokkos::View<Byte*, typename Dst::memory_space, Kokkos::MemoryUnmanaged>;
  using SrcBytes = Kokkos::View<const Byte*, typename Src::memory_space, Kokkos::MemoryUnmanaged>;
  const std::size_t bytes = dst.span() * sizeof(T);
  Kokkos::deep_copy(DstBytes(reinterpret_cast<Byte*>(dst.data()), bytes),
                    SrcBytes(reinterpret_cast<const Byte*>(src.data()), bytes));
}

// A host copy of a contiguous View (the View itself when it is in host memory).
template <class View>
auto to_host(const View& view) {
  auto host = Kokkos::create_mirror_view(Kokkos::HostSpace{}, view);
  copy_contiguous(host, view);
  return host;
}

// Fills a View with uniform values in [lo, hi) drawn on the host from a fixed seed.
template <class View>
void fill_uniform(const View& view, double lo, double hi, unsigned seed) {
  auto host = Kokkos::create_mirror_view(view);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  auto* data = host.data();
  for (std::size_t i = 0; i < host.span(); ++i) data[i] = typename View::non_const_value_type(dist(rng));
  copy_contiguous(view, host);
}

// Every element of a View set to value, through its host copy (see copy_contiguous).
template <class View>
void fill_constant(const View& view, typename View::non_const_value_type value) {
  auto host = Kokkos::create_mirror_view(view);
  std::fill_n(host.data(), host.span(), value);
  copy_contiguous(view, host);
}

// edit(host) on a host copy of a View, then the copy back: `edit_on_host(v, [](auto& h) { h(2, 1) = NAN; })`.
template <class View, class Edit>
void edit_on_host(const View& view, const Edit& edit) {
  auto host = to_host(view);
  edit(host);
  copy_contiguous(view, host);
}

// Host copies in double precision, for comparisons with the float64 reference loops.
using Host2 = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using Host3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

template <class View>
Host2 as_double2(const View& view) {
  static_assert(View::rank == 2, "as_double2 takes a rank-2 View");
  auto host = to_host(view);
  Host2 out("double", host.extent(0), host.extent(1));
  for (std::size_t i = 0; i < host.extent(0); ++i)
    for (std::size_t j = 0; j < host.extent(1); ++j) out(i, j) = double(host(i, j));
  return out;
}

template <class View>
Host3 as_double3(const View& view) {
  static_assert(View::rank == 3, "as_double3 takes a rank-3 View");
  auto host = to_host(view);
  Host3 out("double", host.extent(0), host.extent(1), host.extent(2));
  for (std::size_t i = 0; i < host.extent(0); ++i)
    for (std::size_t j = 0; j < host.extent(1); ++j)
      for (std::size_t k = 0; k < host.extent(2); ++k) out(i, j, k) = double(host(i, j, k));
  return out;
}

// max |x - ref| / max |ref| over all elements (ref is a host View of the same shape).
template <class View, class RefView>
double max_relative_error(const View& x, const RefView& ref) {
  auto host = to_host(x);
  double max_error = 0, max_ref = 0;
  for (std::size_t i = 0; i < host.span(); ++i) {
    const double r = double(ref.data()[i]);
    max_error = std::fmax(max_error, std::fabs(double(host.data()[i]) - r));
    if (!std::isfinite(double(host.data()[i]))) max_error = INFINITY;
    max_ref = std::fmax(max_ref, std::fabs(r));
  }
  return max_error / (max_ref > 0 ? max_ref : 1.0);
}

template <class ViewA, class ViewB>
bool bitwise_equal(const ViewA& a, const ViewB& b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  return ha.span() == hb.span() &&
         std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(typename ViewA::non_const_value_type)) == 0;
}

} // namespace paraseq::test
