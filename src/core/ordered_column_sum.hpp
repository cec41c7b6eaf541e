#pragma once
// Column sums of a matrix of rows [R, C] in one order that neither the device nor the way the rows
// arrive changes, without atomics: bitwise repeatable. The rows go in blocks of a size that R, C
// and the caller's least block size alone set; each block is summed in row order (in double), then
// the blocks in order. Rows may arrive in chunks, in row order (add(rows, begin, count)): a chunk
// continues the blocks it shares with the chunk before it. One thread per (column, block) of a
// chunk, so that thousands of rows are not one thread's chain of dependent loads.
//
// Used for the gradients of parameters that every row shares: the Newton backward's parameter
// partials (one chunk: a row per window or run of steps) and the Runge–Kutta gradients' shared
// parameters (a row per trajectory, a chunk per chunk of the batch).

#include <paraseq/core/workspace.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <string>

namespace paraseq::detail {

// blocks(q, block) += rows(row - begin, q) over the rows of `block` in [begin, begin + count), in
// row order, for the blocks first_block .. first_block + block_count - 1. Consecutive indices take
// consecutive columns of one block, so that a GPU warp reads consecutive values of each row.
template <class Rows, class Blocks>
struct AddRowsToBlocks {
  Rows rows;
  Blocks blocks;
  long begin, count, rows_per_block, first_block, block_count;
  KOKKOS_INLINE_FUNCTION void operator()(long index) const {
    const long columns = long(blocks.extent(0));
    const long block = first_block + index / columns;
    const int q = int(index % columns);
    const long end = Kokkos::min((block + 1) * rows_per_block, begin + count);
    double sum = blocks(q, block);
    for (long row = Kokkos::max(block * rows_per_block, begin); row < end; ++row) sum += double(rows(row - begin, q));
    blocks(q, block) = sum;
  }
};

// total(q) = the blocks of column q added in order, converted to total's value type.
template <class Blocks, class Total>
struct SumBlocks {
  Blocks blocks;
  Total total;
  KOKKOS_INLINE_FUNCTION void operator()(int q) const {
    double sum = 0;
    for (std::size_t block = 0; block < blocks.extent(1); ++block) sum += blocks(q, block);
    total(q) = typename Total::non_const_value_type(sum);
  }
};

template <class Space>
class OrderedColumnSum {
  using Blocks = Kokkos::View<double**, Kokkos::LayoutRight, typename Space::memory_space>;

public:
  // The block sums, from the workspace cache under `label`, start at zero; none without columns.
  OrderedColumnSum(const Space& space, const std::string& label, long rows, int columns, long least_block_rows)
      : rows_per_block_(rows_per_block(rows, columns, least_block_rows)) {
    if (columns > 0)
      blocks_ = zeroed_workspace_view<Blocks>(space, label, columns,
                                              std::max<long>(1, (rows + rows_per_block_ - 1) / rows_per_block_));
  }

  // About 2^16 (column, block) pairs of at least `least_block_rows` rows each: at most
  // max(C, 2^16) doubles.
  static long rows_per_block(long rows, int columns, long least_block_rows) {
    const long blocks = std::max(1, 65536 / std::max(columns, 1));
    return std::max(least_block_rows, (rows + blocks - 1) / blocks);
  }

  // Adds rows [0, count) of `rows` [count, C] as the matrix's rows begin .. begin + count - 1.
  template <class Rows>
  void add(const Space& space, const Rows& rows, long begin, long count) const {
    if (count <= 0 || blocks_.extent(0) == 0) return;
    const long first = begin / rows_per_block_, block_count = (begin + count - 1) / rows_per_block_ - first + 1;
    Kokkos::parallel_for("paraseq::ordered_column_sum_blocks",
                         Kokkos::RangePolicy<Space, Kokkos::IndexType<long>>(space, 0, block_count * long(blocks_.extent(0))),
                         AddRowsToBlocks<Rows, Blocks>{rows, blocks_, begin, count, rows_per_block_, first, block_count});
  }

  // total [C] = the column sums of every row added.
  template <class Total>
  void write(const Space& space, const Total& total) const {
    Kokkos::parallel_for("paraseq::ordered_column_sum", Kokkos::RangePolicy<Space>(space, 0, int(total.extent(0))),
                         SumBlocks<Blocks, Total>{blocks_, total});
  }

private:
  long rows_per_block_;
  Blocks blocks_;
};

// total [C] = the column sums of all of `rows` [R, C] at once, in OrderedColumnSum's order, its
// block sums (blocks of at least 64 rows) in the workspace cache under `label`.
template <class Space, class Rows, class Total>
void ordered_column_sums(const Space& space, const std::string& label, const Rows& rows, const Total& total) {
  const long count = long(rows.extent(0));
  const OrderedColumnSum<Space> sum(space, label, count, int(rows.extent(1)), 64);
  sum.add(space, rows, 0, count);
  sum.write(space, total);
}

} // namespace paraseq::detail
