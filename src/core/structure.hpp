#pragma once
// The structure of A_t in h_t = A_t h_{t-1} + b_t. Each structure splits the N channels into
// independent groups; the scan runs one coupled recurrence per group.

#include <Kokkos_Core.hpp>

namespace paraseq {

// Largest state size of a dense recurrence: a thread keeps a group's state and a composed
// N x N map on chip, and the cost per step grows as N^3.
inline constexpr int max_dense_size = 32;

// A is [B, T, N]: every channel is its own group.
struct Diagonal {
  static constexpr int fixed_group_size = 1;
  static constexpr int max_group_size = 1;
  static constexpr const char* name = "diagonal";
};

// A is [B, T, N/K, K, K]: groups of K consecutive channels.
template <int K>
struct BlockDiagonal {
  static_assert(K >= 2 && K <= 4, "paraseq::BlockDiagonal<K>: block size K must be 2, 3 or 4");
  static constexpr int fixed_group_size = K;
  static constexpr int max_group_size = K;
  static constexpr const char* name = "block-diagonal";
};

// A is [B, T, N, N] with N <= MaxSize: one group of all channels. The bound sizes what a thread
// keeps on chip (an N x N map and its offset) and every array of the kernels: a recurrence or cell
// whose state is never wider than 8 declares DenseUpTo<8> and gets maps 16 times smaller than
// Dense's, which compile and run that much faster.
template <int MaxSize>
struct DenseUpTo {
  static_assert(MaxSize >= 1 && MaxSize <= max_dense_size, "paraseq::DenseUpTo<MaxSize>: MaxSize must be 1 to 32");
  static constexpr int fixed_group_size = 0; // N, known at run time
  static constexpr int max_group_size = MaxSize;
  static constexpr const char* name = "dense";
};
using Dense = DenseUpTo<max_dense_size>;

template <class S>
inline constexpr bool is_structure_v = false;
template <>
inline constexpr bool is_structure_v<Diagonal> = true;
template <int K>
inline constexpr bool is_structure_v<BlockDiagonal<K>> = true;
template <int MaxSize>
inline constexpr bool is_structure_v<DenseUpTo<MaxSize>> = true;

template <class S>
inline constexpr bool is_dense_v = false;
template <int MaxSize>
inline constexpr bool is_dense_v<DenseUpTo<MaxSize>> = true;

// Channels per group for a state of n channels.
template <class Structure>
KOKKOS_INLINE_FUNCTION constexpr int group_size(int n) {
  if constexpr (Structure::fixed_group_size > 0) return Structure::fixed_group_size;
  else return n;
}

// Groups per batch element for a state of n channels.
template <class Structure>
KOKKOS_INLINE_FUNCTION constexpr int group_count(int n) {
  return n == 0 ? 0 : n / group_size<Structure>(n);
}

} // namespace paraseq
