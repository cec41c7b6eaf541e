#pragma once
// What every operator of the LibTorch bridge shares: the Kokkos runtime (initialised lazily, once per
// process), the execution space of a tensor's device (on CUDA: PyTorch's current stream), argument
// checks that name the argument, and zero-copy Views of contiguous tensors.

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <paraseq/core/views.hpp>

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>
#include <vector>

namespace paraseq::torch_bridge {

// Initialises Kokkos on the first call (unless the host program already did); finalises it at exit.
void ensure_kokkos();

using HostSpace = Kokkos::DefaultHostExecutionSpace;

inline HostSpace host_space() {
  ensure_kokkos();
  return HostSpace{};
}

#ifdef KOKKOS_ENABLE_CUDA
// A Kokkos::Cuda instance on PyTorch's current stream of `device` (one instance per stream).
Kokkos::Cuda cuda_space(const char* op, const c10::Device& device);
#endif

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

// A View of a contiguous tensor of Rank dimensions in Space's memory, of the types the compiled
// instances take (paraseq/core/views.hpp): InView for a const T, OutView otherwise.
template <class T, int Rank, class Space>
auto as_view(const at::Tensor& tensor) {
  using view_t = std::conditional_t<std::is_const_v<T>, InView<std::remove_const_t<T>, Rank, Space>, OutView<T, Rank, Space>>;
  TORCH_INTERNAL_ASSERT(tensor.dim() == Rank && tensor.is_contiguous());
  T* data = const_cast<T*>(tensor.const_data_ptr<T>());
  if constexpr (Rank == 1) return view_t(data, tensor.size(0));
  else if constexpr (Rank == 2) return view_t(data, tensor.size(0), tensor.size(1));
  else if constexpr (Rank == 3) return view_t(data, tensor.size(0), tensor.size(1), tensor.size(2));
  else if constexpr (Rank == 4) return view_t(data, tensor.size(0), tensor.size(1), tensor.size(2), tensor.size(3));
  else return view_t(data, tensor.size(0), tensor.size(1), tensor.size(2), tensor.size(3), tensor.size(4));
}

// Calls f(space) with the execution space of the device of `like`: the host space for CPU tensors,
// Kokkos::Cuda on PyTorch's current stream for CUDA tensors when Kokkos has CUDA.
template <class F>
decltype(auto) with_space(const char* op, const at::Tensor& like, const F& f) {
  if (like.is_cpu()) return f(host_space());
#ifdef KOKKOS_ENABLE_CUDA
  if (like.is_cuda()) return f(cuda_space(op, like.device()));
#endif
  TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": tensors on device ", like.device(),
                              " are not supported by this build (Kokkos devices: ", Kokkos::DefaultExecutionSpace::name(),
                              ")");
}

// Calls f(T{}) with T = float or double for the compute type of `type`.
template <class F>
decltype(auto) dispatch_float(at::ScalarType type, const F& f) {
  if (type == at::kDouble) return f(double{});
  return f(float{});
}

// Runs `body` and turns paraseq's std::invalid_argument and std::runtime_error into c10 errors
// (Python: ValueError and RuntimeError) with paraseq's message.
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
