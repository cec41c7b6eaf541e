#pragma once
// The PyTorch half's side of work.hpp: argument checks that name the argument, tensors prepared in
// the compute type, their arrays and device, scratch from PyTorch's allocator, and the work's
// errors raised as PyTorch's. No Kokkos header (see work.hpp).

#include "work.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <memory>
#include <stdexcept>
#include <vector>

namespace paraseq::torch_bridge {

// float and double are computed natively; half and bfloat16 are stored in their own type and
// computed in float (converted on the way in and out of the operator).
inline bool is_supported_dtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16;
}
inline at::ScalarType compute_dtype(at::ScalarType type) {
  return type == at::kHalf || type == at::kBFloat16 ? at::kFloat : type;
}

// Checks that `tensor` (argument `name` of operator `op`) has `rank` dimensions (each < 2^31), a
// supported floating type, and the dtype and device of `like` (the operator's first tensor).
void check_tensor(const char* op, const char* name, const at::Tensor& tensor, long rank, const at::Tensor& like);

// The tensor in the compute type, contiguous (a copy only when it is not already).
inline at::Tensor prepared(const at::Tensor& tensor) {
  return tensor.to(compute_dtype(tensor.scalar_type())).contiguous();
}

// The array of a contiguous tensor of at most 5 dimensions; of an undefined tensor, none (not given).
inline Array array_of(const at::Tensor& tensor) {
  Array array;
  if (!tensor.defined()) return array;
  TORCH_INTERNAL_ASSERT(tensor.dim() <= 5 && tensor.is_contiguous());
  array.data = const_cast<void*>(tensor.const_data_ptr());
  array.rank = int(tensor.dim());
  for (int k = 0; k < array.rank; ++k) array.extents[k] = tensor.size(k);
  return array;
}

// The device of `tensor` for the work: the host, or (where the operators have CUDA kernels) its
// CUDA device with PyTorch's current stream there. Any other device is refused (NotImplementedError).
Place place_of(const char* op, const at::Tensor& tensor);

// Scratch for one call's work: each allocation a byte tensor on `like`'s device from PyTorch's
// allocator (which caches device blocks: no device allocation or release per call), kept until the
// returned function is destroyed.
inline AllocateBytes scratch_allocator(const at::Tensor& like) {
  auto kept = std::make_shared<std::vector<at::Tensor>>();
  return [kept, options = like.options().dtype(at::kByte)](std::size_t bytes) {
    kept->push_back(at::empty({int64_t(bytes)}, options));
    return kept->back().data_ptr();
  };
}

// Calls f(T{}) with T = float or double for the compute type of `type`.
template <class F>
decltype(auto) dispatch_float(at::ScalarType type, const F& f) {
  if (type == at::kDouble) return f(double{});
  return f(float{});
}

// Runs `body` and turns the work's std::invalid_argument and std::runtime_error into c10 errors
// (Python: ValueError and RuntimeError) with the work's message.
template <class F>
decltype(auto) translate_errors(const F& body) {
  try {
    return body();
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK_VALUE(false, error.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::runtime_error& error) {
    TORCH_CHECK(false, error.what());
  }
}

// The times of a 1-D tensor on the host, for the loops' meshes.
std::vector<double> host_values(const at::Tensor& tensor);

} // namespace paraseq::torch_bridge
