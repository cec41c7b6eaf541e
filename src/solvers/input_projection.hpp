#pragma once
// The input projection of the cells, u = x W^T + b for all steps at once (one GEMM), and its
// gradients:
//
//   project_inputs(space, x, W, b, u)                        u[b, t, :] = W x[b, t, :] + b
//   project_inputs_backward(space, x, W, du, dW, db [, dx])  dW = du^T x, db = sum over (b, t) of du,
//                                                            dx = du W (skipped with NoGradient{})
//   x: [B, T, D], W: [U, D], b: [U], u and du: [B, T, U]; contiguous LayoutRight Views (a
//   row-major tensor), so [B, T, D] is the matrix [B*T, D] without a copy.
//
// With Kokkos Kernels (PARASEQ_HAVE_KOKKOSKERNELS) the products are KokkosBlas::gemm; otherwise
// they are detail::tiled_gemm, a team-tiled GEMM with the tiles of A, B and C in team scratch.
// The bias gradient sums the rows in blocks, then the blocks in order (OrderedColumnSum):
// reproducible bit for bit.

#include <paraseq/config.hpp>
#include <paraseq/core/errors.hpp>
#include <paraseq/core/ordered_column_sum.hpp>
#include <paraseq/core/team_policy.hpp>
#include <paraseq/core/views.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/newton_config.hpp> // NoGradient

#include <Kokkos_Core.hpp>
#ifdef PARASEQ_HAVE_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif

#include <algorithm>
#include <type_traits>

namespace paraseq {

namespace detail {

// C = alpha op(A) op(B) + beta C, op(X) = X or X^T; C is M x N, the inner dimension K. A team
// computes one TM x TN tile of C: for each K-tile it stages op(A) and op(B) in scratch, then
// its threads take rows and its vector lanes columns (unit stride in C and in the B tile).
template <class ExecSpace, class AView, class BView, class CView>
struct TiledGemm {
  static constexpr int TM = 32, TN = 32, TK = 32;
  using value_type = typename CView::non_const_value_type;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using scratch_view = Kokkos::View<value_type*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr std::size_t scratch_count = TM * TK + TK * TN + TM * TN;

  AView A;
  BView B;
  CView C;
  bool transpose_a, transpose_b;
  value_type alpha, beta;
  int M, N, K, column_tiles;

  KOKKOS_INLINE_FUNCTION value_type a(int i, int k) const { return transpose_a ? A(k, i) : A(i, k); }
  KOKKOS_INLINE_FUNCTION value_type b(int k, int j) const { return transpose_b ? B(j, k) : B(k, j); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const int row0 = team.league_rank() / column_tiles * TM, col0 = team.league_rank() % column_tiles * TN;
    scratch_view scratch(team.team_scratch(0), scratch_count);
    value_type* const a_tile = scratch.data();     // [TM][TK]
    value_type* const b_tile = a_tile + TM * TK;   // [TK][TN]
    value_type* const c_tile = b_tile + TK * TN;   // [TM][TN]
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TM), [&](int i) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, TN), [&](int j) { c_tile[i * TN + j] = 0; });
    });
    for (int k0 = 0; k0 < K; k0 += TK) {
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TK), [&](int r) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, TN), [&](int c) {
          const bool k_in = k0 + r < K;
          // r indexes a row of op(A)'s tile when staging A (TM == TK) and a k of op(B)'s tile.
          a_tile[r * TK + c] = (row0 + r < M && k0 + c < K) ? a(row0 + r, k0 + c) : value_type(0);
          b_tile[r * TN + c] = (k_in && col0 + c < N) ? b(k0 + r, col0 + c) : value_type(0);
        });
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TM), [&](int i) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, TN), [&](int j) {
          value_type sum = 0;
          for (int k = 0; k < TK; ++k) sum += a_tile[i * TK + k] * b_tile[k * TN + j];
          c_tile[i * TN + j] += sum;
        });
      });
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TM), [&](int i) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, TN), [&](int j) {
        if (row0 + i < M && col0 + j < N)
          C(row0 + i, col0 + j) = alpha * c_tile[i * TN + j] + (beta == value_type(0) ? value_type(0) : beta * C(row0 + i, col0 + j));
      });
    });
  }
};

template <class ExecSpace, class AView, class BView, class CView>
void tiled_gemm(const ExecSpace& space, bool transpose_a, bool transpose_b, typename CView::non_const_value_type alpha,
                const AView& A, const BView& B, typename CView::non_const_value_type beta, const CView& C) {
  using gemm_t = TiledGemm<ExecSpace, AView, BView, CView>;
  static_assert(gemm_t::TM == gemm_t::TK && gemm_t::TK == gemm_t::TN, "the staging loop fills the A and B tiles in one sweep");
  const int M = int(C.extent(0)), N = int(C.extent(1)), K = int(transpose_a ? A.extent(0) : A.extent(1));
  if (M == 0 || N == 0) return;
  const int column_tiles = int(ceil_div(N, gemm_t::TN));
  constexpr bool on_host = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;
  const auto policy = team_policy(space, int(ceil_div(M, gemm_t::TM)) * column_tiles, on_host ? 1 : 8,
                                  gemm_t::scratch_view::shmem_size(gemm_t::scratch_count), on_host ? 1 : gemm_t::TN);
  Kokkos::parallel_for("paraseq::tiled_gemm", policy,
                       gemm_t{A, B, C, transpose_a, transpose_b, alpha, beta, M, N, K, column_tiles});
}

// C = alpha op(A) op(B) + beta C with the best GEMM available.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& space, bool transpose_a, bool transpose_b, typename CView::non_const_value_type alpha,
          const AView& A, const BView& B, typename CView::non_const_value_type beta, const CView& C) {
#ifdef PARASEQ_HAVE_KOKKOSKERNELS
  KokkosBlas::gemm(space, transpose_a ? "T" : "N", transpose_b ? "T" : "N", alpha, A, B, beta, C);
#else
  tiled_gemm(space, transpose_a, transpose_b, alpha, A, B, beta, C);
#endif
}

template <class View>
auto as_matrix(const View& view) { // [B, T, D] -> [B*T, D], no copy
  using matrix_t = Kokkos::View<typename View::value_type**, Kokkos::LayoutRight, typename View::memory_space,
                                Kokkos::MemoryUnmanaged>;
  return matrix_t(view.data(), view.extent(0) * view.extent(1), view.extent(2));
}

// u(row, column) = bias(column): the rows of u start from the bias, then the GEMM adds x W^T.
template <class Matrix, class BiasView>
struct FillBias {
  Matrix u;
  BiasView bias;
  KOKKOS_INLINE_FUNCTION void operator()(long row, long column) const { u(row, column) = bias(column); }
};

template <class View>
void require_contiguous(const char* fn, const char* argument, const View& view) {
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                "paraseq::project_inputs: x, W, u and their gradients must be LayoutRight (row-major) Views");
  if (!view.span_is_contiguous())
    throw_invalid(fn, argument, "a non-contiguous View", "a contiguous row-major View");
}

template <class ExecSpace, class XView, class WView, class BiasView, class UView>
void run_project_inputs(const ExecSpace& space, const XView& x, const WView& W, const BiasView& bias, const UView& u) {
  const auto u_matrix = as_matrix(u);
  Kokkos::parallel_for("paraseq::project_inputs_bias",
                       Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0}, {long(u_matrix.extent(0)), long(W.extent(0))}),
                       FillBias<std::decay_t<decltype(u_matrix)>, BiasView>{u_matrix, bias});
  gemm(space, false, true, 1, as_matrix(x), W, 1, u_matrix);
}

// dx is NoGradient, or a View that is empty exactly when there is nothing to write (a compiled
// instance's dx is an empty View when none was asked for).
template <class ExecSpace, class XView, class WView, class DUView, class DWView, class DBiasView, class DXView>
void run_project_inputs_backward(const ExecSpace& space, const XView& x, const WView& W, const DUView& du,
                                 const DWView& dW, const DBiasView& dbias, const DXView& dx) {
  const auto du_matrix = as_matrix(du);
  gemm(space, true, false, 1, du_matrix, as_matrix(x), 0, dW);
  if constexpr (!std::is_same_v<DXView, NoGradient>)
    if (dx.size() != 0) gemm(space, false, false, 1, du_matrix, W, 0, as_matrix(dx));

  // db: the column sums of du in a fixed order (bitwise repeatable, no atomics).
  ordered_column_sums(space, "paraseq::bias_gradient_blocks", du_matrix, dbias);
}

// The compiled instances are overloads of these (paraseq/eti/input_projection_instances.hpp; see
// linear_scan.hpp).
template <class... Arguments>
void compiled_project_inputs(const Arguments&...) = delete;
template <class... Arguments>
void compiled_project_inputs_backward(const Arguments&...) = delete;

} // namespace detail

} // namespace paraseq

#if PARASEQ_ETI
#include <paraseq/eti/input_projection_instances.hpp>
#endif

namespace paraseq {

template <class ExecSpace, class XView, class WView, class BiasView, class UView>
void project_inputs(const ExecSpace& space, const XView& x, const WView& W, const BiasView& bias, const UView& u) {
  constexpr const char* fn = "paraseq::project_inputs";
  static_assert(Kokkos::is_execution_space_v<ExecSpace>, "paraseq::project_inputs: the first argument must be a Kokkos execution space instance");
  static_assert(XView::rank == 3 && WView::rank == 2 && BiasView::rank == 1 && UView::rank == 3,
                "paraseq::project_inputs: expected x [B, T, D], W [U, D], b [U], u [B, T, U]");
  detail::require_contiguous(fn, "x", x);
  detail::require_contiguous(fn, "W", W);
  detail::require_contiguous(fn, "u", u);
  const long B = long(x.extent(0)), T = long(x.extent(1)), U = long(W.extent(0));
  detail::require_extents(fn, "W", W, {U, long(x.extent(2))}, "[U, D] with D from x");
  detail::require_extents(fn, "b", bias, {U}, "[U] with U from W");
  detail::require_extents(fn, "u", u, {B, T, U}, "[B, T, U] with B, T from x and U from W");
  using value = typename UView::non_const_value_type;
  constexpr bool compiled = detail::converts_to_compiled_view<XView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<WView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<BiasView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<UView, value, ExecSpace, true>();
  if constexpr (compiled) {
    const InView<value, 3, ExecSpace> x_view = x;
    const InView<value, 2, ExecSpace> W_view = W;
    const InView<value, 1, ExecSpace> bias_view = bias;
    const OutView<value, 3, ExecSpace> u_view = u;
    if constexpr (requires { detail::compiled_project_inputs(space, x_view, W_view, bias_view, u_view); })
      detail::compiled_project_inputs(space, x_view, W_view, bias_view, u_view);
    else detail::run_project_inputs(space, x_view, W_view, bias_view, u_view);
  } else {
    detail::run_project_inputs(space, x, W, bias, u);
  }
}

template <class ExecSpace, class XView, class WView, class DUView, class DWView, class DBiasView, class DXView = NoGradient>
void project_inputs_backward(const ExecSpace& space, const XView& x, const WView& W, const DUView& du, const DWView& dW,
                             const DBiasView& dbias, const DXView& dx = {}) {
  constexpr const char* fn = "paraseq::project_inputs_backward";
  static_assert(Kokkos::is_execution_space_v<ExecSpace>,
                "paraseq::project_inputs_backward: the first argument must be a Kokkos execution space instance");
  static_assert(XView::rank == 3 && WView::rank == 2 && DUView::rank == 3 && DWView::rank == 2 && DBiasView::rank == 1,
                "paraseq::project_inputs_backward: expected x [B, T, D], W [U, D], du [B, T, U], dW [U, D], db [U]");
  detail::require_contiguous(fn, "x", x);
  detail::require_contiguous(fn, "W", W);
  detail::require_contiguous(fn, "du", du);
  detail::require_contiguous(fn, "dW", dW);
  const long B = long(x.extent(0)), T = long(x.extent(1)), D = long(x.extent(2)), U = long(W.extent(0));
  detail::require_extents(fn, "W", W, {U, D}, "[U, D] with D from x");
  detail::require_extents(fn, "du", du, {B, T, U}, "[B, T, U]");
  detail::require_extents(fn, "dW", dW, {U, D}, "the shape of W");
  detail::require_extents(fn, "db", dbias, {U}, "[U]");
  constexpr bool without_dx = std::is_same_v<DXView, NoGradient>;
  if constexpr (!without_dx) {
    detail::require_contiguous(fn, "dx", dx);
    detail::require_extents(fn, "dx", dx, {B, T, D}, "the shape of x");
  }
  using value = typename DUView::non_const_value_type;
  constexpr bool compiled = detail::converts_to_compiled_view<XView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<WView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<DUView, value, ExecSpace, false>() &&
                            detail::converts_to_compiled_view<DWView, value, ExecSpace, true>() &&
                            detail::converts_to_compiled_view<DBiasView, value, ExecSpace, true>() &&
                            (without_dx || detail::converts_to_compiled_view<DXView, value, ExecSpace, true>());
  if constexpr (compiled) {
    const InView<value, 3, ExecSpace> x_view = x, du_view = du;
    const InView<value, 2, ExecSpace> W_view = W;
    const OutView<value, 2, ExecSpace> dW_view = dW;
    const OutView<value, 1, ExecSpace> dbias_view = dbias;
    OutView<value, 3, ExecSpace> dx_view; // empty: no dx asked for
    if constexpr (!without_dx) dx_view = dx;
    if constexpr (requires {
                    detail::compiled_project_inputs_backward(space, x_view, W_view, du_view, dW_view, dbias_view, dx_view);
                  })
      detail::compiled_project_inputs_backward(space, x_view, W_view, du_view, dW_view, dbias_view, dx_view);
    else detail::run_project_inputs_backward(space, x_view, W_view, du_view, dW_view, dbias_view, dx_view);
  } else {
    detail::run_project_inputs_backward(space, x, W, du, dW, dbias, dx);
  }
}

} // namespace paraseq
