#pragma once
// Sequence parallelism over MPI ranks: the scans of linear_scan.hpp with the time axis split across
// the ranks of a communicator (docs/distributed.md, "C++: MPI").
//
//   mpi::linear_scan(space, comm, structure, A, b, h [, h0], config)
//   mpi::linear_scan_reverse(space, comm, structure, A, g, lambda, config)
//
// Every rank of comm calls the function with its contiguous slice of the time axis: rank r holds
// steps [s_r, s_r + T_r), the ranks in rank order along time; T_r may differ between ranks and may
// be 0. The Views have the shapes of linear_scan.hpp with T = T_r ([B, T_r, N], A [B, T_r, ...]);
// every rank gets its slice of the one-process result. h0 is the state before the global t = 0: it is
// read on rank 0 only (the other ranks pass a View of the same type, which is not read; an empty one
// will do), and either every rank passes h0 or none does.
//
// How: a slice acts on the state entering it as one affine map, h_out = M h_in + c (M the product of
// the slice's A_t in its structure, computed by one thread per batch element and group in time
// order; c the slice's last state from a zero state). The ranks MPI_Allgather the maps; each composes
// those of the ranks before it in rank order on the host (the same operations in the same order on
// every rank: deterministic) and runs its slice again from the state entering it. The reverse scan
// runs the other way with the transposed maps (c = A_s^T lambda_s of the slice's first step s).
// Rank 0 (the last rank for the reverse scan) runs its slice once, the last rank (rank 0) once, the
// ranks between twice, and the reverse scan's re-run reads a copy of g with the entering state added
// to its last step.
//
// Collectives: one MPI_Allgather of 8 ints per rank (the ranks agree on the arguments first), then one
// of B x (map size + N) values per rank (map size N diagonal, N K block, N^2 dense), in the Views'
// value type. The data travels through host buffers (Kokkos::create_mirror_view_and_copy): GPU-aware
// MPI is not used. The functions return when the result is written (they fence `space`).
// paraseq/solvers/mpi_newton.hpp agrees once per solve and runs detail::scan_agreed, the scan
// without the agreement, once per Newton iteration.
//
// Errors: the ranks exchange their arguments before anything else, so that every rank raises alike
// and none is left waiting in a collective. A rank whose own arguments are refused (a shape) throws
// its own std::invalid_argument and the other ranks one that names it; ranks that disagree on the
// structure, the value type, B, N, whether h0 is given, or on which function they call all throw
// std::invalid_argument naming the argument and each rank's value.

#include <paraseq/config.hpp>

#if !PARASEQ_HAVE_MPI
#error "paraseq/core/mpi_scan.hpp: this paraseq was configured without MPI (PARASEQ_ENABLE_MPI=OFF, or AUTO without an MPI that find_package(MPI COMPONENTS CXX) finds); reconfigure it with -DPARASEQ_ENABLE_MPI=ON"
#endif

#include <paraseq/core/errors.hpp>
#include <paraseq/core/fill.hpp>
#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/structure.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>
#include <mpi.h>

#include <array>
#include <climits>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace paraseq::mpi {

namespace detail {

// ---- the agreement between ranks ----------------------------------------------------------------

enum class Direction : int { forward = 0, reverse = 1 };

using paraseq::detail::throw_invalid;

// What every rank sends before the scan: whether its own arguments were refused, then what the
// ranks must share.
struct Column {
  enum : int { refused, direction, batch, state_size, fixed_group, max_group, is_double, has_h0, count };
};
using AgreementRow = std::array<int, Column::count>;

inline std::string structure_name(int fixed_group_size, int max_group_size) {
  if (fixed_group_size == 1) return "Diagonal";
  if (fixed_group_size > 1) return "BlockDiagonal<" + std::to_string(fixed_group_size) + ">";
  return max_group_size == max_dense_size ? "Dense" : "DenseUpTo<" + std::to_string(max_group_size) + ">";
}

inline std::string function_name(int direction) {
  return direction == int(Direction::forward) ? "paraseq::mpi::linear_scan" : "paraseq::mpi::linear_scan_reverse";
}

// "v0 on rank 0, v1 on rank 1, ..." for one column of the gathered rows.
template <class Row, class Describe>
std::string per_rank(const std::vector<Row>& rows, int column, Describe describe) {
  std::string text;
  for (std::size_t rank = 0; rank < rows.size(); ++rank)
    text += (rank ? ", " : "") + describe(rows[rank][column]) + " on rank " + std::to_string(rank);
  return text;
}

template <class Row>
std::string ranks_where(const std::vector<Row>& rows, int column, typename Row::value_type value) {
  std::string text;
  for (std::size_t rank = 0; rank < rows.size(); ++rank)
    if (rows[rank][column] == value) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

inline void check_mpi(const std::string& fn, int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fn + ": " + call + " failed: " + std::string(text, length));
}

struct Place {
  int rank = 0;
  int size = 1;
};

// This rank's place in comm; refuses a comm that cannot be used (alike on every rank that passes it,
// before any collective).
inline Place place_in(const std::string& fn, MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw std::runtime_error(fn + ": MPI is " + (finalized ? "already finalised" : "not initialised") +
                             ", expected a call between MPI_Init and MPI_Finalize");
  if (comm == MPI_COMM_NULL) throw_invalid(fn, "comm", "the value MPI_COMM_NULL", "a communicator this rank belongs to");
  Place place;
  check_mpi(fn, MPI_Comm_rank(comm, &place.rank), "MPI_Comm_rank");
  check_mpi(fn, MPI_Comm_size(comm, &place.size), "MPI_Comm_size");
  return place;
}

template <class W>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<W, int>) return MPI_INT;
  else if constexpr (std::is_same_v<W, long long>) return MPI_LONG_LONG;
  else return std::is_same_v<W, double> ? MPI_DOUBLE : MPI_FLOAT;
}

// All_gathers every rank's row (an std::array whose column 0 says whether the rank's own arguments
// were refused) and throws on every rank alike when one was: this rank's own error, or one that
// names the ranks whose arguments were refused.
template <class Row>
std::vector<Row> gather_rows(const std::string& fn, MPI_Comm comm, const Place& place, const Row& local,
                             const std::exception_ptr& local_error) {
  using value = typename Row::value_type;
  std::vector<Row> rows(place.size);
  check_mpi(fn, MPI_Allgather(local.data(), int(local.size()), mpi_type<value>(), rows.data(), int(local.size()),
                              mpi_type<value>(), comm),
            "MPI_Allgather");
  if (local_error) std::rethrow_exception(local_error);
  const std::string refused_ranks = ranks_where(rows, 0, value(1));
  if (!refused_ranks.empty())
    throw std::invalid_argument(fn + ": the arguments of rank(s) " + refused_ranks + " of 'comm' were refused there (their " +
                                "error names the argument); nothing was computed");
  return rows;
}

// Throws on every rank alike: this rank's own error, or the ranks whose arguments were refused, or
// the first column on which the ranks differ.
inline void agree(const std::string& fn, const char* b_name, MPI_Comm comm, const Place& place, const AgreementRow& local,
                  const std::exception_ptr& local_error) {
  const std::vector<AgreementRow> rows = gather_rows(fn, comm, place, local, local_error);
  const auto differs = [&](int column) {
    for (const AgreementRow& row : rows)
      if (row[column] != rows[0][column]) return true;
    return false;
  };
  const std::string same = "the same on every rank of 'comm' (only the number of steps T may differ)";
  const auto number = [](int value) { return std::to_string(value); };
  if (differs(Column::direction))
    throw std::invalid_argument(fn + ": the ranks of 'comm' call different functions: " +
                                per_rank(rows, Column::direction, function_name) + ", expected the same on every rank");
  if (differs(Column::fixed_group) || differs(Column::max_group)) {
    std::string given;
    for (std::size_t rank = 0; rank < rows.size(); ++rank)
      given += (rank ? ", " : "") + structure_name(rows[rank][Column::fixed_group], rows[rank][Column::max_group]) +
               " on rank " + std::to_string(rank);
    throw_invalid(fn, "structure", "the value " + given, same);
  }
  const auto type_name = [](int is_double) { return std::string(is_double ? "double" : "float"); };
  if (differs(Column::is_double)) throw_invalid(fn, b_name, "value type " + per_rank(rows, Column::is_double, type_name), same);
  if (differs(Column::batch)) throw_invalid(fn, b_name, "batch size B " + per_rank(rows, Column::batch, number), same);
  if (differs(Column::state_size))
    throw_invalid(fn, b_name, "state size N " + per_rank(rows, Column::state_size, number), same);
  if (differs(Column::has_h0))
    throw_invalid(fn, "h0", "a View on rank(s) " + ranks_where(rows, Column::has_h0, 1) + " and none on rank(s) " +
                                ranks_where(rows, Column::has_h0, 0),
                  "h0 on every rank of 'comm' (it is read on rank 0 only) or on none");
}

// ---- the map of a slice -------------------------------------------------------------------------

// A slice's map for each batch element, as one row of the exchanged buffer: M ([groups, d, d]
// row-major; [N] diagonal) then c ([N]).
struct MapLayout {
  int groups = 0;
  int d = 0;
  int map_size = 0; // groups x d x d
  int row = 0;      // map_size + N
};

template <class Structure>
MapLayout map_layout(int n) {
  MapLayout layout;
  layout.groups = group_count<Structure>(n);
  layout.d = group_size<Structure>(n);
  layout.map_size = layout.groups * layout.d * layout.d;
  layout.row = layout.map_size + n;
  return layout;
}

// M = A_{T-1} ... A_1 A_0 for each (batch element, group): one thread multiplies the slice's A_t in
// time order, a column of M at a time (a fixed sequence of operations: deterministic).
template <class Structure, class W, class AView, class MapView>
struct SliceProduct {
  AView A;
  MapView maps; // [B, row]
  int steps;
  int groups;
  int d;

  KOKKOS_FUNCTION W& entry(int batch, int g, int i, int j) const { return maps(batch, (g * d + i) * d + j); }

  KOKKOS_FUNCTION void operator()(int index) const {
    const int batch = index / groups, g = index % groups;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) entry(batch, g, i, j) = W(i == j ? 1 : 0);
    W column[Structure::max_group_size];
    for (int t = 0; t < steps; ++t)
      for (int j = 0; j < d; ++j) {
        for (int i = 0; i < d; ++i) {
          W sum = 0;
          for (int k = 0; k < d; ++k) sum += W(paraseq::detail::a_entry<Structure>(A, batch, t, g, i, k)) * entry(batch, g, k, j);
          column[i] = sum;
        }
        for (int i = 0; i < d; ++i) entry(batch, g, i, j) = column[i];
      }
  }
};

// c: what the slice passes on. Forward: its last state (h0 for an empty slice of rank 0, zero for
// another empty slice). Reverse: A_0^T lambda_0 of its first step (zero for an empty slice).
template <class Structure, class W, class AView, class HView, class H0View, class MapView>
struct SliceLeaving {
  AView A;
  HView h; // h, or lambda for the reverse scan
  H0View h0;
  MapView maps;
  int offset; // map_size: where c starts in a row
  int steps;
  int n;
  int d;
  bool reverse;
  bool read_h0;

  KOKKOS_FUNCTION void operator()(int index) const {
    const int batch = index / n, channel = index % n;
    W value = 0;
    if (steps > 0 && !reverse) {
      value = W(h(batch, steps - 1, channel));
    } else if (steps > 0) {
      const int g = channel / d, i = channel % d;
      for (int j = 0; j < d; ++j) value += W(paraseq::detail::a_entry<Structure>(A, batch, 0, g, j, i)) * W(h(batch, 0, g * d + j));
    } else if constexpr (Kokkos::is_view_v<H0View>) {
      if (read_h0) value = W(h0(batch, channel));
    }
    maps(batch, offset + channel) = value;
  }
};

// g(:, T-1, :) += entering: the state that enters a slice of the reverse scan from the ranks after it.
template <class GView, class EnteringView>
struct AddAtLastStep {
  GView g;
  EnteringView entering;
  int n;

  KOKKOS_FUNCTION void operator()(int index) const {
    const int batch = index / n, channel = index % n;
    g(batch, g.extent(1) - 1, channel) += entering(batch, channel);
  }
};

// y = M x (M^T x with transpose) for each group of one batch element's row.
template <class W>
void apply_map(const MapLayout& layout, const W* map, bool transpose, const W* x, W* y) {
  const int d = layout.d;
  for (int g = 0; g < layout.groups; ++g)
    for (int i = 0; i < d; ++i) {
      W sum = 0;
      for (int j = 0; j < d; ++j) sum += (transpose ? map[(g * d + j) * d + i] : map[(g * d + i) * d + j]) * x[g * d + j];
      y[g * d + i] = sum;
    }
}

// The values each rank sends in the exchange of a scan's maps, B x (map size + N); refused (alike on
// every rank that agrees on B, N and the structure) when one MPI count cannot hold them.
template <class Structure>
int exchange_count(const std::string& fn, const char* b_name, int batch, int n) {
  const long long count = (long long)batch * map_layout<Structure>(n).row;
  if (count > INT_MAX)
    throw_invalid(fn, b_name, "B x (map size + N) = " + std::to_string(count) + " values to exchange per rank",
                  "at most " + std::to_string(INT_MAX) + " (one MPI count): split the batch into several calls");
  return int(count);
}

// The scan over the ranks once they agree on its arguments (B, N, the structure, the value type, the
// direction and whether h0 is given). For the reverse scan, b is g and h is lambda. Returns the state
// entering this rank's slice from the ranks before it (after it, reverse; zero on the rank that
// starts the recurrence).
template <Direction Dir, class Structure, class ExecSpace, class AView, class BView, class HView, class H0View>
auto scan_agreed(const ExecSpace& space, MPI_Comm comm, const Place& place, const AView& A, const BView& b,
                 const HView& h, const H0View& h0, const ScanConfig& config) {
  constexpr bool reverse = Dir == Direction::reverse;
  const std::string fn = function_name(int(Dir));
  using T = typename BView::non_const_value_type;
  using W = T; // the maps are composed in the Views' type
  using memory_space = typename ExecSpace::memory_space;
  const int B = int(b.extent(0)), steps = int(b.extent(1)), n = int(b.extent(2));
  const MapLayout layout = map_layout<Structure>(n);
  const int count = exchange_count<Structure>(fn, reverse ? "g" : "b", B, n);

  const int source = reverse ? place.size - 1 : 0; // the rank whose slice starts the recurrence
  const int last = place.size - 1 - source;         // the last to receive: its own map is never used
  const bool starts = place.rank == source, ends = place.rank == last;
  Kokkos::View<T**, Kokkos::LayoutRight, memory_space> entering("paraseq::mpi::entering", B, n);
  Kokkos::View<W**, Kokkos::LayoutRight, memory_space> maps("paraseq::mpi::slice_maps", B, layout.row);
  if (starts || !ends) {
    if (reverse) paraseq::linear_scan_reverse(space, Structure{}, A, b, h, config);
    else if (starts) paraseq::linear_scan(space, Structure{}, A, b, h, h0, config);
    else paraseq::linear_scan(space, Structure{}, A, b, h, ZeroInitialState{}, config);
    if (!starts)
      Kokkos::parallel_for("paraseq::mpi::slice_product", Kokkos::RangePolicy<ExecSpace>(space, 0, B * layout.groups),
                           SliceProduct<Structure, W, AView, decltype(maps)>{A, maps, steps, layout.groups, layout.d});
    if (place.size > 1)
      Kokkos::parallel_for("paraseq::mpi::slice_leaving", Kokkos::RangePolicy<ExecSpace>(space, 0, B * n),
                           SliceLeaving<Structure, W, AView, HView, H0View, decltype(maps)>{
                               A, h, h0, maps, layout.map_size, steps, n, layout.d, reverse, starts && !reverse});
  }
  space.fence();
  const auto sent = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, maps);
  std::vector<W> gathered(std::size_t(count) * place.size);
  check_mpi(fn, MPI_Allgather(sent.data(), count, mpi_type<W>(), gathered.data(), count, mpi_type<W>(), comm),
            "MPI_Allgather");
  if (starts) return entering;

  // The state entering this slice: the source's c, then every rank between in the order the state
  // travels (entering = M entering + c; M^T for the reverse scan).
  const auto row_of = [&](int rank, int batch) { return gathered.data() + (std::size_t(rank) * B + batch) * layout.row; };
  auto entering_host = Kokkos::create_mirror_view(entering);
  std::vector<W> state(n), next(n);
  const int step = reverse ? -1 : 1;
  for (int batch = 0; batch < B; ++batch) {
    const W* c = row_of(source, batch) + layout.map_size;
    state.assign(c, c + n);
    for (int other = source + step; other != place.rank; other += step) {
      const W* map = row_of(other, batch);
      apply_map(layout, map, reverse, state.data(), next.data());
      for (int i = 0; i < n; ++i) state[i] = next[i] + map[layout.map_size + i];
    }
    for (int i = 0; i < n; ++i) entering_host(batch, i) = T(state[i]);
  }
  Kokkos::deep_copy(entering, entering_host);

  if (!reverse) {
    paraseq::linear_scan(space, Structure{}, A, b, h, entering, config);
  } else if (steps > 0) {
    Kokkos::View<T***, Kokkos::LayoutRight, memory_space> g_entering("paraseq::mpi::g_with_entering", B, steps, n);
    paraseq::detail::copy(space, g_entering, b);
    Kokkos::parallel_for("paraseq::mpi::add_entering", Kokkos::RangePolicy<ExecSpace>(space, 0, B * n),
                           AddAtLastStep<decltype(g_entering), decltype(entering)>{g_entering, entering, n});
    paraseq::linear_scan_reverse(space, Structure{}, A, g_entering, h, config);
  }
  space.fence();
  return entering;
}

// The scan over the ranks: the ranks agree on its arguments, then scan_agreed.
template <Direction Dir, class Structure, class ExecSpace, class AView, class BView, class HView, class H0View>
void scan_over_ranks(const ExecSpace& space, MPI_Comm comm, const AView& A, const BView& b, const HView& h,
                     const H0View& h0, const ScanConfig& config) {
  constexpr bool reverse = Dir == Direction::reverse;
  const std::string fn = function_name(int(Dir));
  const char* b_name = reverse ? "g" : "b";
  const char* h_name = reverse ? "lambda" : "h";
  paraseq::detail::check_scan_views<Structure, ExecSpace, AView, BView, HView>();
  using T = typename BView::non_const_value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "paraseq::mpi: A and b must hold float or double");
  const Place place = place_in(fn, comm);

  const int B = int(b.extent(0)), n = int(b.extent(2));
  std::exception_ptr local_error;
  try {
    paraseq::detail::check_scan_extents<Structure>(fn.c_str(), A, b, b_name, h, h_name);
    if constexpr (Kokkos::is_view_v<H0View>)
      if (place.rank == 0) paraseq::detail::require_extents(fn, "h0", h0, {B, n}, "[B, N] on rank 0");
  } catch (const std::invalid_argument&) {
    local_error = std::current_exception();
  }
  const AgreementRow local{local_error ? 1 : 0, int(Dir), B, n, Structure::fixed_group_size, Structure::max_group_size,
                           std::is_same_v<T, double> ? 1 : 0, Kokkos::is_view_v<H0View> ? 1 : 0};
  agree(fn, b_name, comm, place, local, local_error);
  scan_agreed<Dir, Structure>(space, comm, place, A, b, h, h0, config);
}

} // namespace detail

// h_t = A_t h_{t-1} + b_t with the time axis split across the ranks of comm (collective: every rank
// calls it with its slice of A, b and h, [B, T_r, ...]); h_{-1} = h0 [B, N], read on rank 0 only.
template <class ExecSpace, class Structure, class AView, class BView, class HView, class H0View>
  requires(Kokkos::is_view_v<H0View>)
void linear_scan(const ExecSpace& space, MPI_Comm comm, Structure, const AView& A, const BView& b, const HView& h,
                 const H0View& h0, const ScanConfig& config = {}) {
  const Kokkos::Profiling::ScopedRegion region("paraseq::mpi::linear_scan");
  static_assert(H0View::rank == 2, "paraseq::mpi::linear_scan: h0 must be a [B, N] View");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename H0View::memory_space>::accessible,
                "paraseq::mpi::linear_scan: h0 must be accessible from the execution space");
  detail::scan_over_ranks<detail::Direction::forward, Structure>(space, comm, A, b, h, h0, config);
}

// The same from h_{-1} = 0.
template <class ExecSpace, class Structure, class AView, class BView, class HView>
void linear_scan(const ExecSpace& space, MPI_Comm comm, Structure, const AView& A, const BView& b, const HView& h,
                 const ScanConfig& config = {}) {
  const Kokkos::Profiling::ScopedRegion region("paraseq::mpi::linear_scan");
  detail::scan_over_ranks<detail::Direction::forward, Structure>(space, comm, A, b, h, ZeroInitialState{}, config);
}

// lambda_t = A_{t+1}^T lambda_{t+1} + g_t with the time axis split across the ranks of comm
// (collective; lambda_{T-1} = g_{T-1} at the global end, on the last rank with steps).
template <class ExecSpace, class Structure, class AView, class GView, class LView>
void linear_scan_reverse(const ExecSpace& space, MPI_Comm comm, Structure, const AView& A, const GView& g,
                         const LView& lambda, const ScanConfig& config = {}) {
  const Kokkos::Profiling::ScopedRegion region("paraseq::mpi::linear_scan_reverse");
  detail::scan_over_ranks<detail::Direction::reverse, Structure>(space, comm, A, g, lambda, ZeroInitialState{}, config);
}

} // namespace paraseq::mpi
