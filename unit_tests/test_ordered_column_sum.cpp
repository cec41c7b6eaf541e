// The ordered column sum (core/ordered_column_sum.hpp) that the Newton backward's parameter partials
// and the Runge–Kutta gradients' shared parameters go through: exact sums against a float64 loop
// where every order gives the same number, the same bits however the rows arrive in chunks, and
// the empty cases.

#include <paraseq/core/ordered_column_sum.hpp>

#include "test_support.hpp"

#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace paraseq::test;
using paraseq::detail::OrderedColumnSum;

template <class Space>
class OrderedColumnSumTest : public ::testing::Test {};
TYPED_TEST_SUITE(OrderedColumnSumTest, ExecutionSpaces, SpaceName);

// rows [R, C] on the space from row-major host values.
template <class Space>
View2<float, Space> device_rows(const std::vector<float>& values, long rows, int columns) {
  View2<float, Space> device("rows", rows, columns);
  const auto host = Kokkos::create_mirror_view(device);
  for (long r = 0; r < rows; ++r)
    for (int q = 0; q < columns; ++q) host(r, q) = values[std::size_t(r) * columns + q];
  copy_contiguous(device, host);
  return device;
}

// The column sums of `rows` added in chunks of the given lengths (in row order, covering them all).
template <class Space>
std::vector<double> chunked_sums(const View2<float, Space>& rows, const std::vector<long>& chunks, long least_block_rows) {
  const Space space;
  const long R = long(rows.extent(0));
  const int C = int(rows.extent(1));
  const OrderedColumnSum<Space> sum(space, "test::ordered_column_sum", R, C, least_block_rows);
  long begin = 0;
  for (long length : chunks) {
    const auto part = Kokkos::subview(rows, std::make_pair(begin, begin + length), Kokkos::ALL);
    sum.add(space, part, begin, length);
    begin += length;
  }
  EXPECT_EQ(begin, R) << "the chunks cover the rows";
  View1<double, Space> total("total", C);
  sum.write(space, total);
  const auto host = Kokkos::create_mirror_view(total);
  copy_contiguous(host, total);
  return std::vector<double>(host.data(), host.data() + C);
}

// R x C row-major values from `draw(generator)`, seeded, and their column sums by a float64 loop.
struct ValuesAndSums {
  std::vector<float> values;
  std::vector<double> loop_sums;
};
template <class Distribution>
ValuesAndSums values_and_sums(long R, int C, unsigned seed, Distribution draw) {
  std::mt19937 generator(seed);
  ValuesAndSums drawn{std::vector<float>(std::size_t(R) * C), std::vector<double>(C, 0.0)};
  for (float& v : drawn.values) v = float(draw(generator));
  for (long r = 0; r < R; ++r)
    for (int q = 0; q < C; ++q) drawn.loop_sums[q] += double(drawn.values[std::size_t(r) * C + q]);
  return drawn;
}

// Integers up to 1000 in magnitude: every partial sum is exact in double, so the sums equal the
// float64 loop's whatever the order; 5003 rows of 64-row blocks make 79 blocks per column.
TYPED_TEST(OrderedColumnSumTest, SumsOfIntegersEqualTheFloat64Loop) {
  const long R = 5003;
  const int C = 3;
  const ValuesAndSums drawn = values_and_sums(R, C, 7, std::uniform_int_distribution<int>(-1000, 1000));
  const auto rows = device_rows<TypeParam>(drawn.values, R, C);
  EXPECT_EQ(chunked_sums<TypeParam>(rows, {R}, 64), drawn.loop_sums);
  EXPECT_EQ(chunked_sums<TypeParam>(rows, {1, 63, 64, 1000, 3875}, 64), drawn.loop_sums);
}

// Random floats: within double rounding of the float64 loop, and the same bits in one chunk as in
// chunks that start inside blocks (the least block of 256 rows, as the Runge–Kutta gradients take).
TYPED_TEST(OrderedColumnSumTest, ChunksThatStartInsideBlocksGiveTheSameBits) {
  const long R = 70001;
  const int C = 2;
  const ValuesAndSums drawn = values_and_sums(R, C, 11, std::uniform_real_distribution<float>(-1.0f, 1.0f));
  const auto rows = device_rows<TypeParam>(drawn.values, R, C);
  const std::vector<double> whole = chunked_sums<TypeParam>(rows, {R}, 256);
  for (int q = 0; q < C; ++q) EXPECT_NEAR(whole[q], drawn.loop_sums[q], 1e-9) << "column " << q;
  const std::vector<std::vector<long>> chunkings = {{100, R - 100}, {257, 255, 30000, R - 30512}, {R - 1, 1}};
  for (const auto& chunks : chunkings) {
    const std::vector<double> chunked = chunked_sums<TypeParam>(rows, chunks, 256);
    for (int q = 0; q < C; ++q)
      EXPECT_EQ(std::memcmp(&chunked[q], &whole[q], sizeof(double)), 0) << "column " << q << ", first chunk " << chunks[0];
  }
}

// No rows: zero sums; no columns: nothing to add or write.
TYPED_TEST(OrderedColumnSumTest, EmptyMatricesSumToZero) {
  const auto no_rows = device_rows<TypeParam>({}, 0, 4);
  EXPECT_EQ(chunked_sums<TypeParam>(no_rows, {}, 64), std::vector<double>(4, 0.0));
  const auto no_columns = device_rows<TypeParam>({}, 10, 0);
  EXPECT_EQ(chunked_sums<TypeParam>(no_columns, {10}, 64), std::vector<double>{});
}

} // namespace
