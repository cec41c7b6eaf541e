// paraseq::linear_scan: the forward and reverse linear recurrences of core/linear_scan.hpp (the
// work: scan_work.cpp).
#include "kernels.hpp"
#include "tensors.hpp"

#include <ATen/ops/empty.h>

namespace paraseq::torch_bridge {
namespace {

constexpr const char* scan_op = "paraseq::linear_scan";

// The structure named `name`; block size k from A [B, T, N/k, k, k].
ScanStructure structure_of(const std::string& name, const at::Tensor& A) {
  if (name == "diag") return ScanStructure::diagonal;
  if (name == "dense") return ScanStructure::dense;
  TORCH_CHECK_VALUE(name == "block", scan_op, ": argument 'structure' is \"", name,
                    "\", expected \"diag\", \"block\" or \"dense\"");
  TORCH_CHECK_VALUE(A.dim() == 5 && A.size(3) == A.size(4) && A.size(3) >= 2 && A.size(3) <= 4, scan_op,
                    ": argument 'A' has shape ", A.sizes(), ", expected [B, T, N/k, k, k] with k = 2, 3 or 4 for \"block\"");
  if (A.size(3) == 2) return ScanStructure::block_2;
  if (A.size(3) == 3) return ScanStructure::block_3;
  return ScanStructure::block_4;
}

// The dimensions of A for a structure: [B, T, N], [B, T, N, N] or [B, T, N/k, k, k].
long a_rank(ScanStructure structure) {
  return structure == ScanStructure::diagonal ? 3 : structure == ScanStructure::dense ? 4 : 5;
}

} // namespace

at::Tensor linear_scan(const at::Tensor& A, const at::Tensor& b, const std::optional<at::Tensor>& h0,
                       const std::string& structure, bool reverse) {
  TORCH_CHECK_VALUE(!(reverse && h0), scan_op, ": argument 'h0' is given with reverse=True, expected None ",
                    "(the reverse recurrence starts from lambda_{T-1} = b_{T-1})");
  const ScanStructure kind = structure_of(structure, A);
  // A, the first tensor argument, is the one the others must match (dtype and device).
  check_tensor(scan_op, "A", A, a_rank(kind), A);
  check_tensor(scan_op, "b", b, 3, A);
  if (h0) check_tensor(scan_op, "h0", *h0, 2, A);
  const Place place = place_of(scan_op, b);
  const at::Tensor output = at::empty(b.sizes(), b.options().dtype(compute_dtype(b.scalar_type())));
  const at::Tensor a_c = prepared(A), b_c = prepared(b), h0_c = h0 ? prepared(*h0) : at::Tensor();
  dispatch_float(b_c.scalar_type(), [&](auto zero) {
    translate_errors([&] {
      linear_scan_work<decltype(zero)>(scan_op, place, kind, array_of(a_c), array_of(b_c), array_of(h0_c),
                                       array_of(output), reverse);
    });
  });
  return output.to(b.scalar_type());
}

} // namespace paraseq::torch_bridge
