#pragma once
// Linear recurrences over materialised Views, forward and reverse (adjoint):
//
//   linear_scan(space, structure, A, b, h [, h0])   h_t = A_t h_{t-1} + b_t,  h_{-1} = h0 (default 0)
//   linear_scan_reverse(space, structure, A, g, lambda)
//                                                   lambda_t = A_{t+1}^T lambda_{t+1} + g_t,
//                                                   lambda_{T-1} = g_{T-1}
//
// Shapes (row-major, LayoutRight or LayoutLeft Views of any memory space the space can access):
//   b, g, h, lambda: [B, T, N];  h0: [B, N]
//   A: Diagonal [B, T, N];  BlockDiagonal<K> [B, T, N/K, K, K];  Dense [B, T, N, N], N <= 32
// The reverse scan reads the same A as the forward one: no transposed or reversed copy is made.
// The accumulation type Acc (first template argument, default: b's value type) is the precision of
// the state carried between steps and of every composed map.
//
// Views that convert to core/views.hpp's types (LayoutRight, the space's memory space, Acc = the
// stored type) run the instances compiled into the paraseq library; others compile the scan where
// they are used (docs/architecture.md, "Compiled instances").
//
// Non-finite values: a NaN or Inf in A_t or b_t makes h_t and the outputs that depend on it
// non-finite (later steps of the same group, and the same batch element only); outputs before t
// and other groups or batch elements are unaffected.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/core/views.hpp>
#include <paraseq/config.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <type_traits>

namespace paraseq {

// Stands for "no initial state": h_{-1} = 0.
struct ZeroInitialState {};

namespace detail {

template <class Structure>
inline constexpr int a_rank = std::is_same_v<Structure, Diagonal> ? 3 : is_dense_v<Structure> ? 4 : 5;

// Element (i, j) of group g's block of A at (batch, t).
template <class Structure, class AView>
KOKKOS_INLINE_FUNCTION auto a_entry(const AView& A, int batch, int t, int g, int i, int j) {
  if constexpr (std::is_same_v<Structure, Diagonal>) return A(batch, t, g);
  else if constexpr (is_dense_v<Structure>) return A(batch, t, i, j);
  else return A(batch, t, g, i, j);
}

// Channel `channel` of the initial state; an h0 View without data (the compiled instances'
// ZeroInitialState) is zero too.
template <class Acc, class H0View>
KOKKOS_INLINE_FUNCTION Acc initial_value(const H0View& h0, int batch, int channel) {
  if constexpr (std::is_same_v<H0View, ZeroInitialState>) return Acc(0);
  else return h0.data() ? Acc(h0(batch, channel)) : Acc(0);
}

template <class Acc, class H0View>
KOKKOS_INLINE_FUNCTION void load_initial(const H0View& h0, int batch, int first_channel, int d, Acc* x) {
  for (int i = 0; i < d; ++i) x[i] = initial_value<Acc>(h0, batch, first_channel + i);
}

// Forward recurrence over materialised A and b; step s is time s.
template <class Structure, class Acc, class AView, class BView, class HView, class H0View>
struct MaterializedForward {
  AView A;
  BView b;
  HView h;
  H0View h0;
  int n; // channels

  KOKKOS_INLINE_FUNCTION constexpr int dim() const { return group_size<Structure>(n); }

  KOKKOS_INLINE_FUNCTION void initial(int batch, int g, Acc* x) const { load_initial<Acc>(h0, batch, g * dim(), dim(), x); }
  KOKKOS_INLINE_FUNCTION void linear(int batch, int t, int g, const Acc* x, Acc* y) const {
    for (int i = 0; i < dim(); ++i) {
      Acc sum = 0;
      for (int j = 0; j < dim(); ++j) sum += Acc(a_entry<Structure>(A, batch, t, g, i, j)) * x[j];
      y[i] = sum;
    }
  }
  KOKKOS_INLINE_FUNCTION void affine(int batch, int t, int g, const Acc* x, Acc* y) const {
    linear(batch, t, g, x, y);
    for (int i = 0; i < dim(); ++i) y[i] += Acc(b(batch, t, g * dim() + i));
  }
  KOKKOS_INLINE_FUNCTION void store(int batch, int t, int g, const Acc* y) const {
    for (int i = 0; i < dim(); ++i) h(batch, t, g * dim() + i) = typename HView::value_type(y[i]);
  }
};

// Reverse (adjoint) recurrence; step s is time t = T-1-s and uses A_{t+1} transposed.
template <class Structure, class Acc, class AView, class GView, class LView>
struct MaterializedReverse {
  AView A;
  GView g_in;
  LView lambda;
  int n; // channels
  int steps;

  KOKKOS_INLINE_FUNCTION constexpr int dim() const { return group_size<Structure>(n); }

  KOKKOS_INLINE_FUNCTION void initial(int, int, Acc* x) const {
    for (int i = 0; i < dim(); ++i) x[i] = Acc(0);
  }
  KOKKOS_INLINE_FUNCTION void linear(int batch, int s, int g, const Acc* x, Acc* y) const {
    // A_T does not exist: the first step (t = T-1) is y = 0. A select on an in-range load, not a
    // branch, so that hosts vectorise the loop over a row of groups.
    const int next = steps - s; // t + 1
    const bool inside = next < steps;
    const int row = inside ? next : steps - 1;
    for (int i = 0; i < dim(); ++i) {
      Acc sum = 0;
      for (int j = 0; j < dim(); ++j) sum += Acc(a_entry<Structure>(A, batch, row, g, j, i)) * x[j];
      y[i] = inside ? sum : Acc(0);
    }
  }
  KOKKOS_INLINE_FUNCTION void affine(int batch, int s, int g, const Acc* x, Acc* y) const {
    linear(batch, s, g, x, y);
    for (int i = 0; i < dim(); ++i) y[i] += Acc(g_in(batch, steps - 1 - s, g * dim() + i));
  }
  KOKKOS_INLINE_FUNCTION void store(int batch, int s, int g, const Acc* y) const {
    for (int i = 0; i < dim(); ++i) lambda(batch, steps - 1 - s, g * dim() + i) = typename LView::value_type(y[i]);
  }
};

template <class Structure, class ExecSpace, class AView, class BView, class OutView>
void check_scan_views() {
  static_assert(Kokkos::is_execution_space_v<ExecSpace>,
                "paraseq::linear_scan: the first argument must be a Kokkos execution space instance");
  static_assert(is_structure_v<Structure>,
                "paraseq::linear_scan: the structure must be paraseq::Diagonal, BlockDiagonal<K>, Dense or DenseUpTo<N>");
  static_assert(Kokkos::is_view_v<AView> && Kokkos::is_view_v<BView> && Kokkos::is_view_v<OutView>,
                "paraseq::linear_scan: A, b and the output must be Kokkos::Views");
  static_assert(int(AView::rank) == a_rank<Structure>,
                "paraseq::linear_scan: A must have rank 3 (Diagonal [B,T,N]), 5 (BlockDiagonal [B,T,N/K,K,K]) or 4 (Dense [B,T,N,N])");
  static_assert(BView::rank == 3 && OutView::rank == 3, "paraseq::linear_scan: b and the output must be [B, T, N]");
  static_assert(std::is_floating_point_v<typename AView::non_const_value_type> &&
                    std::is_floating_point_v<typename BView::non_const_value_type>,
                "paraseq::linear_scan: A and b must hold float or double");
  static_assert(std::is_same_v<typename AView::non_const_value_type, typename BView::non_const_value_type>,
                "paraseq::linear_scan: A and b must hold the same type (float or double): convert one of them");
  static_assert(!std::is_const_v<typename OutView::value_type>, "paraseq::linear_scan: the output View must be writable");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename AView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename BView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename OutView::memory_space>::accessible,
                "paraseq::linear_scan: every View must be accessible from the execution space");
}

// Checks the extents of A, b (named b_name) and the output (out_name); returns the scan shape.
template <class Structure, class AView, class BView, class OutView>
ScanShape check_scan_extents(const char* fn, const AView& A, const BView& b, const char* b_name, const OutView& out,
                             const char* out_name) {
  const int B = int(b.extent(0)), T = int(b.extent(1)), N = int(b.extent(2));
  require_extents(fn, out_name, out, {B, T, N}, std::string("the shape of ") + b_name);
  if constexpr (is_dense_v<Structure>) {
    if (N > Structure::max_group_size)
      throw_invalid(fn, b_name, shape_of(b),
                    "a state size N <= " + std::to_string(Structure::max_group_size) + " for a " +
                        (Structure::max_group_size == max_dense_size ? std::string("Dense")
                                                                     : "DenseUpTo<" + std::to_string(Structure::max_group_size) + ">") +
                        " A");
    require_extents(fn, "A", A, {B, T, N, N}, "[B, T, N, N] for a Dense A");
  } else if constexpr (std::is_same_v<Structure, Diagonal>) {
    require_extents(fn, "A", A, {B, T, N}, "[B, T, N] for a Diagonal A");
  } else {
    constexpr int K = Structure::fixed_group_size;
    if (N % K != 0)
      throw_invalid(fn, b_name, shape_of(b), "a state size N divisible by the block size K = " + std::to_string(K));
    require_extents(fn, "A", A, {B, T, N / K, K, K}, "[B, T, N/K, K, K] for a BlockDiagonal<" + std::to_string(K) + "> A");
  }
  return ScanShape{B, T, group_count<Structure>(N), group_size<Structure>(N)};
}

template <class Acc, class BView>
using accumulation_t = std::conditional_t<std::is_void_v<Acc>, typename BView::non_const_value_type, Acc>;

// The scans once their arguments are checked; compiled once per structure, type and space for the
// Views of views.hpp (see the end of this file), instantiated where they are called otherwise.
template <class Structure, class Acc, class ExecSpace, class AView, class BView, class HView, class H0View>
void run_linear_scan(const ExecSpace& space, const ScanShape& shape, const AView& A, const BView& b, const HView& h,
                     const H0View& h0, const ScanConfig& config) {
  using recurrence = MaterializedForward<Structure, Acc, AView, BView, HView, H0View>;
  ordered_scan<Structure, Acc>(space, shape, recurrence{A, b, h, h0, int(b.extent(2))}, config);
}

template <class Structure, class Acc, class ExecSpace, class AView, class GView, class LView>
void run_linear_scan_reverse(const ExecSpace& space, const ScanShape& shape, const AView& A, const GView& g,
                             const LView& lambda, const ScanConfig& config) {
  using recurrence = MaterializedReverse<Structure, Acc, AView, GView, LView>;
  ordered_scan<Structure, Acc>(space, shape, recurrence{A, g, lambda, int(g.extent(2)), shape.steps}, config);
}

template <class...>
inline constexpr bool always_false = false;

// Whether a scan over these Views runs a compiled instance: the accumulation type is the stored
// one and every View converts to views.hpp's types.
template <class Acc, class ExecSpace, class AView, class BView, class OutView, class H0View = ZeroInitialState>
constexpr bool scan_is_compiled() {
  using T = typename BView::non_const_value_type;
  return std::is_same_v<Acc, T> && converts_to_compiled_view<AView, T, ExecSpace, false>() &&
         converts_to_compiled_view<BView, T, ExecSpace, false>() && converts_to_compiled_view<OutView, T, ExecSpace, true>() &&
         (std::is_same_v<H0View, ZeroInitialState> || converts_to_compiled_view<H0View, T, ExecSpace, false>());
}

// PARASEQ_ETI_ONLY: the built-in structures and cells run their compiled instances only, so that no
// consumer compiles their kernels by accident.
template <bool Allowed, class... Arguments>
constexpr void check_header_path_allowed() {
#if PARASEQ_ETI_ONLY
  static_assert(Allowed || always_false<Arguments...>,
                "paraseq was built with PARASEQ_ETI_ONLY: the built-in structures and cells take LayoutRight Views "
                "of float or double in the execution space's memory space, accumulated in their own type "
                "(paraseq/core/views.hpp)");
#endif
}

// The compiled instances are overloads of these (paraseq/eti/linear_scan_instances.hpp); a call
// that matches none of them is deleted, so `requires` tells whether an instance exists.
template <class... Arguments>
void compiled_linear_scan(const Arguments&...) = delete;
template <class... Arguments>
void compiled_linear_scan_reverse(const Arguments&...) = delete;

} // namespace detail

} // namespace paraseq

#if PARASEQ_ETI
#include <paraseq/eti/linear_scan_instances.hpp>
#endif

namespace paraseq {

template <class Acc = void, class ExecSpace, class Structure, class AView, class BView, class HView, class H0View>
  requires(Kokkos::is_view_v<H0View> || std::is_same_v<H0View, ZeroInitialState>)
void linear_scan(const ExecSpace& space, Structure, const AView& A, const BView& b, const HView& h, const H0View& h0,
                 const ScanConfig& config = {}) {
  const Kokkos::Profiling::ScopedRegion region("paraseq::linear_scan"); // what profiling tools show
  detail::check_scan_views<Structure, ExecSpace, AView, BView, HView>();
  using acc_t = detail::accumulation_t<Acc, BView>;
  using T = typename BView::non_const_value_type;
  const ScanShape shape = detail::check_scan_extents<Structure>("paraseq::linear_scan", A, b, "b", h, "h");
  if constexpr (!std::is_same_v<H0View, ZeroInitialState>) {
    static_assert(Kokkos::is_view_v<H0View> && H0View::rank == 2, "paraseq::linear_scan: h0 must be a [B, N] View");
    static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename H0View::memory_space>::accessible,
                  "paraseq::linear_scan: h0 must be accessible from the execution space");
    detail::require_extents("paraseq::linear_scan", "h0", h0, {int(b.extent(0)), int(b.extent(2))}, "[B, N]");
  }
  constexpr bool compiled = detail::scan_is_compiled<acc_t, ExecSpace, AView, BView, HView, H0View>();
  detail::check_header_path_allowed<compiled, AView, BView, HView, H0View>();
  if constexpr (compiled) {
    const InView<T, detail::a_rank<Structure>, ExecSpace> a_view = A;
    const InView<T, 3, ExecSpace> b_view = b;
    const OutView<T, 3, ExecSpace> h_view = h;
    InView<T, 2, ExecSpace> h0_view;
    if constexpr (!std::is_same_v<H0View, ZeroInitialState>) h0_view = h0;
    if constexpr (requires { detail::compiled_linear_scan(space, Structure{}, shape, a_view, b_view, h_view, h0_view, config); })
      detail::compiled_linear_scan(space, Structure{}, shape, a_view, b_view, h_view, h0_view, config);
    else detail::run_linear_scan<Structure, T>(space, shape, a_view, b_view, h_view, h0_view, config);
  } else {
    detail::run_linear_scan<Structure, acc_t>(space, shape, A, b, h, h0, config);
  }
}

template <class Acc = void, class ExecSpace, class Structure, class AView, class BView, class HView>
void linear_scan(const ExecSpace& space, Structure structure, const AView& A, const BView& b, const HView& h,
                 const ScanConfig& config = {}) {
  linear_scan<Acc>(space, structure, A, b, h, ZeroInitialState{}, config);
}

template <class Acc = void, class ExecSpace, class Structure, class AView, class GView, class LView>
void linear_scan_reverse(const ExecSpace& space, Structure, const AView& A, const GView& g, const LView& lambda,
                         const ScanConfig& config = {}) {
  const Kokkos::Profiling::ScopedRegion region("paraseq::linear_scan_reverse");
  detail::check_scan_views<Structure, ExecSpace, AView, GView, LView>();
  using acc_t = detail::accumulation_t<Acc, GView>;
  using T = typename GView::non_const_value_type;
  const ScanShape shape =
      detail::check_scan_extents<Structure>("paraseq::linear_scan_reverse", A, g, "g", lambda, "lambda");
  constexpr bool compiled = detail::scan_is_compiled<acc_t, ExecSpace, AView, GView, LView>();
  detail::check_header_path_allowed<compiled, AView, GView, LView>();
  if constexpr (compiled) {
    const InView<T, detail::a_rank<Structure>, ExecSpace> a_view = A;
    const InView<T, 3, ExecSpace> g_view = g;
    const OutView<T, 3, ExecSpace> lambda_view = lambda;
    if constexpr (requires { detail::compiled_linear_scan_reverse(space, Structure{}, shape, a_view, g_view, lambda_view, config); })
      detail::compiled_linear_scan_reverse(space, Structure{}, shape, a_view, g_view, lambda_view, config);
    else detail::run_linear_scan_reverse<Structure, T>(space, shape, a_view, g_view, lambda_view, config);
  } else {
    detail::run_linear_scan_reverse<Structure, acc_t>(space, shape, A, g, lambda, config);
  }
}

} // namespace paraseq
