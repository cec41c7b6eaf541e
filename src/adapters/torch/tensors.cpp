// The PyTorch half's shared functions (tensors.hpp).
#include "tensors.hpp"

#include <ATen/ops/to.h>
#ifdef PARASEQ_TORCH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#endif

#include <climits>

namespace paraseq::torch_bridge {

void check_tensor(const char* op, const char* name, const at::Tensor& tensor, long rank, const at::Tensor& like) {
  TORCH_CHECK_TYPE(is_supported_dtype(tensor.scalar_type()), op, ": argument '", name, "' has dtype ",
                   tensor.scalar_type(), ", expected float32, float64, float16 or bfloat16");
  TORCH_CHECK_TYPE(tensor.scalar_type() == like.scalar_type(), op, ": argument '", name, "' has dtype ",
                   tensor.scalar_type(), ", expected ", like.scalar_type(), " (the dtype of the first tensor argument)");
  TORCH_CHECK(tensor.device() == like.device(), op, ": argument '", name, "' is on device ", tensor.device(),
              ", expected ", like.device(), " (the device of the first tensor argument)");
  TORCH_CHECK_VALUE(tensor.dim() == rank, op, ": argument '", name, "' has shape ", tensor.sizes(), ", expected ",
                    rank, " dimensions");
  for (const int64_t size : tensor.sizes()) // the solvers index extents with int
    TORCH_CHECK_VALUE(size <= INT_MAX, op, ": argument '", name, "' has shape ", tensor.sizes(),
                      ", expected every dimension at most 2147483647 (2^31 - 1)");
}

Place place_of(const char* op, const at::Tensor& tensor) {
  if (tensor.is_cpu()) return {};
#ifdef PARASEQ_TORCH_CUDA_KERNELS
  if (tensor.is_cuda())
    return {true, tensor.device().index(), c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream()};
  constexpr const char* devices = "the CPU and CUDA";
#else
  constexpr const char* devices = "the CPU";
#endif
  TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": tensors on device ", tensor.device(),
                              " are not supported by this build (its devices: ", devices, ")");
}

std::vector<double> host_values(const at::Tensor& tensor) {
  const at::Tensor host = tensor.to(at::kCPU, at::kDouble).contiguous();
  const double* data = host.const_data_ptr<double>();
  return std::vector<double>(data, data + host.numel());
}

} // namespace paraseq::torch_bridge
