// The work of paraseq::linear_scan (scan_ops.cpp): the recurrences of core/linear_scan.hpp on the
// arrays' device, for every structure, in float and double.
#include "runtime.hpp"

#include <paraseq/core/linear_scan.hpp>

namespace paraseq::torch_bridge {
namespace {

// Calls f(structure) with the structure type of `structure`.
template <class F>
void with_structure(ScanStructure structure, const F& f) {
  switch (structure) {
  case ScanStructure::diagonal: return f(Diagonal{});
  case ScanStructure::block_2: return f(BlockDiagonal<2>{});
  case ScanStructure::block_3: return f(BlockDiagonal<3>{});
  case ScanStructure::block_4: return f(BlockDiagonal<4>{});
  case ScanStructure::dense: return f(Dense{});
  }
}

} // namespace

template <class T>
void linear_scan_work(const char* op, const Place& place, ScanStructure structure, const Array& A, const Array& b,
                      const Array& h0, const Array& out, bool reverse) {
  with_structure(structure, [&](auto structure_tag) {
    using Structure = decltype(structure_tag);
    with_space(op, place, [&](const auto& space) {
      using Space = std::decay_t<decltype(space)>;
      const auto a_view = as_view<const T, detail::a_rank<Structure>, Space>(A);
      const auto b_view = as_view<const T, 3, Space>(b);
      const auto out_view = as_view<T, 3, Space>(out);
      if (reverse) {
        // The C++ reverse scan names its input g; the operator's is b.
        detail::check_scan_extents<Structure>(op, a_view, b_view, "b", out_view, "output");
        linear_scan_reverse(space, Structure{}, a_view, b_view, out_view);
      } else if (h0.given()) linear_scan(space, Structure{}, a_view, b_view, out_view, as_view<const T, 2, Space>(h0));
      else linear_scan(space, Structure{}, a_view, b_view, out_view);
    });
  });
}

template void linear_scan_work<float>(const char*, const Place&, ScanStructure, const Array&, const Array&,
                                      const Array&, const Array&, bool);
template void linear_scan_work<double>(const char*, const Place&, ScanStructure, const Array&, const Array&,
                                       const Array&, const Array&, bool);

} // namespace paraseq::torch_bridge
