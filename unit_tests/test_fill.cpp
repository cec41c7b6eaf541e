// detail::fill and detail::copy (core/fill.hpp), which the solvers use instead of Kokkos::deep_copy:
// every element of contiguous and strided Views of ranks 0 to 3, checked on the host element by
// element against the index it must hold; the elements outside a subview untouched; Views of two
// layouts paired by index, not by memory order; mismatched extents refused.

#include <paraseq/core/fill.hpp>

#include "test_support.hpp"

#include <stdexcept>
#include <string>

namespace {

using namespace paraseq::test;

template <class Space>
class FillTest : public ::testing::Test {};
TYPED_TEST_SUITE(FillTest, ExecutionSpaces, SpaceName);

// A value that names its index, so that a misplaced element shows which one it is.
double index_value(std::size_t i, std::size_t j, std::size_t k) { return 10000.0 * i + 100.0 * j + k + 0.5; }

TYPED_TEST(FillTest, FillsEveryElementOfContiguousAndStridedViewsAndNothingElse) {
  using Space = TypeParam;
  const Space space;
  View3<double, Space> whole("whole", 3, 5, 4);
  fill_constant(whole, -1.0);
  // Columns 1 and 2 of the middle extent: not contiguous (a LayoutStride View).
  const auto part = Kokkos::subview(whole, Kokkos::ALL, std::make_pair(1, 3), Kokkos::ALL);
  ASSERT_FALSE(part.span_is_contiguous());
  paraseq::detail::fill(space, part, 7.25);
  const auto host = to_host(whole);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      for (std::size_t k = 0; k < 4; ++k)
        EXPECT_EQ(host(i, j, k), (j == 1 || j == 2) ? 7.25 : -1.0) << "(" << i << ", " << j << ", " << k << ")";

  paraseq::detail::fill(space, whole, 3.0);
  const auto filled = to_host(whole);
  for (std::size_t e = 0; e < filled.span(); ++e) EXPECT_EQ(filled.data()[e], 3.0) << "element " << e;

  Kokkos::View<int, typename Space::memory_space> scalar("scalar");
  paraseq::detail::fill(space, scalar, 42);
  EXPECT_EQ(to_host(scalar)(), 42);
}

TYPED_TEST(FillTest, CopiesByIndexBetweenLayoutsAndStridedViews) {
  using Space = TypeParam;
  using memory_space = typename Space::memory_space;
  const Space space;
  Kokkos::View<double***, Kokkos::LayoutLeft, memory_space> source("source", 3, 5, 4);
  edit_on_host(source, [](auto& host) {
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 5; ++j)
        for (std::size_t k = 0; k < 4; ++k) host(i, j, k) = index_value(i, j, k);
  });
  // LayoutLeft into LayoutRight: the same indices, another memory order.
  View3<double, Space> right("right", 3, 5, 4);
  paraseq::detail::copy(space, right, source);
  const auto host_right = to_host(right);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(host_right(i, j, k), index_value(i, j, k));

  // A strided subview into a strided subview of another View.
  View3<double, Space> target("target", 3, 6, 4);
  fill_constant(target, -1.0);
  const auto from = Kokkos::subview(source, Kokkos::ALL, std::make_pair(1, 4), std::make_pair(1, 3));
  const auto to = Kokkos::subview(target, Kokkos::ALL, std::make_pair(2, 5), std::make_pair(0, 2));
  paraseq::detail::copy(space, to, from);
  const auto host_target = to_host(target);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 6; ++j)
      for (std::size_t k = 0; k < 4; ++k) {
        const bool inside = j >= 2 && j < 5 && k < 2;
        EXPECT_EQ(host_target(i, j, k), inside ? index_value(i, j - 1, k + 1) : -1.0)
            << "(" << i << ", " << j << ", " << k << ")";
      }
}

TYPED_TEST(FillTest, RefusesViewsOfDifferentExtents) {
  using Space = TypeParam;
  const Space space;
  View2<float, Space> to("to", 4, 3), from("from", 4, 2);
  try {
    paraseq::detail::copy(space, to, from);
    FAIL() << "copy of a 4 x 2 View into a 4 x 3 View";
  } catch (const std::logic_error& error) {
    EXPECT_NE(std::string(error.what()).find("extent 1 is 3 in the destination and 2 in the source"), std::string::npos)
        << error.what();
  }
  // Empty Views: nothing to write, no error.
  View2<float, Space> none("none", 0, 3), none_too("none_too", 0, 3);
  EXPECT_NO_THROW(paraseq::detail::copy(space, none, none_too));
  EXPECT_NO_THROW(paraseq::detail::fill(space, none, 1.0f));
}

} // namespace
