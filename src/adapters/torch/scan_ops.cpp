// paraseq::linear_scan: the forward and reverse linear recurrences of core/linear_scan.hpp.
#include "kernels.hpp"
#include "runtime.hpp"

#include <paraseq/core/linear_scan.hpp>

#include <ATen/ops/empty.h>

namespace paraseq::torch_bridge {
namespace {

constexpr const char* scan_op = "paraseq::linear_scan";

// Calls f(structure) for the structure named `name`; block size k from A [B, T, N/k, k, k].
template <class F>
void with_structure(const std::string& name, const at::Tensor& A, const F& f) {
  if (name == "diag") return f(Diagonal{});
  if (name == "dense") return f(Dense{});
  TORCH_CHECK_VALUE(name == "block", scan_op, ": argument 'structure' is \"", name,
                    "\", expected \"diag\", \"block\" or \"dense\"");
  TORCH_CHECK_VALUE(A.dim() == 5 && A.size(3) == A.size(4) && A.size(3) >= 2 && A.size(3) <= 4, scan_op,
                    ": argument 'A' has shape ", A.sizes(), ", expected [B, T, N/k, k, k] with k = 2, 3 or 4 for \"block\"");
  if (A.size(3) == 2) return f(BlockDiagonal<2>{});
  if (A.size(3) == 3) return f(BlockDiagonal<3>{});
  return f(BlockDiagonal<4>{});
}

} // namespace

at::Tensor linear_scan(const at::Tensor& A, const at::Tensor& b, const std::optional<at::Tensor>& h0,
                       const std::string& structure, bool reverse) {
  TORCH_CHECK_VALUE(!(reverse && h0), scan_op, ": argument 'h0' is given with reverse=True, expected None ",
                    "(the reverse recurrence starts from lambda_{T-1} = b_{T-1})");
  at::Tensor output;
  with_structure(structure, A, [&](auto structure_tag) {
    using Structure = decltype(structure_tag);
    constexpr int rank = detail::a_rank<Structure>;
    // A, the first tensor argument, is the one the others must match (dtype and device).
    check_tensor(scan_op, "A", A, rank, A);
    check_tensor(scan_op, "b", b, 3, A);
    if (h0) check_tensor(scan_op, "h0", *h0, 2, A);
    output = at::empty(b.sizes(), b.options().dtype(compute_dtype(b.scalar_type())));
    const at::Tensor a_c = prepared(A), b_c = prepared(b), h0_c = h0 ? prepared(*h0) : at::Tensor();
    with_space(scan_op, b, [&](const auto& space) {
      using Space = std::decay_t<decltype(space)>;
      dispatch_float(b_c.scalar_type(), [&](auto zero) {
        using T = decltype(zero);
        const auto a_view = as_view<const T, rank, Space>(a_c);
        const auto b_view = as_view<const T, 3, Space>(b_c);
        const auto out_view = as_view<T, 3, Space>(output);
        translate_errors([&] {
          if (reverse) {
            // The C++ reverse scan names its input g; the operator's is b.
            detail::check_scan_extents<Structure>(scan_op, a_view, b_view, "b", out_view, "output");
            linear_scan_reverse(space, Structure{}, a_view, b_view, out_view);
          } else if (h0) linear_scan(space, Structure{}, a_view, b_view, out_view, as_view<const T, 2, Space>(h0_c));
          else linear_scan(space, Structure{}, a_view, b_view, out_view);
        });
      });
    });
  });
  return output.to(b.scalar_type());
}

} // namespace paraseq::torch_bridge
