#include "kernels.hpp"
#include "runtime.hpp"

#include <paraseq/core/workspace.hpp>

#include <ATen/core/TensorBody.h>
#include <ATen/ops/to.h>
#ifdef KOKKOS_ENABLE_CUDA
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#endif

#include <pthread.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace paraseq::torch_bridge {

namespace {
#ifdef KOKKOS_ENABLE_CUDA
// Kokkos::Cuda instances by stream; released before Kokkos::finalize.
std::mutex cuda_instances_mutex;
std::map<cudaStream_t, Kokkos::Cuda>& cuda_instances() {
  static auto* instances = new std::map<cudaStream_t, Kokkos::Cuda>();
  return *instances;
}
#endif

// Set in a child forked after Kokkos started: the parent's OpenMP (or CUDA) threads and state do
// not survive fork, and the child's first parallel region would hang in GNU OpenMP.
std::atomic<bool> forked_after_start{false};

void mark_forked_child() {
  if (Kokkos::is_initialized()) forked_after_start = true;
}

void finalize_kokkos() {
  if (forked_after_start) return; // finalising the parent's runtime could hang the same way
#ifdef KOKKOS_ENABLE_CUDA
  cuda_instances().clear();
#endif
  if (Kokkos::is_initialized() && !Kokkos::is_finalized()) Kokkos::finalize();
}
} // namespace

void ensure_kokkos() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, mark_forked_child);
    if (Kokkos::is_initialized() || Kokkos::is_finalized()) return; // the host program owns Kokkos
    // Kokkos' OpenMP warning about OMP_PROC_BIND is meant for standalone programs, not a library in Python.
    Kokkos::initialize(Kokkos::InitializationSettings().set_disable_warnings(true));
    // Registered after Kokkos' own start-up, so it runs before the static destructors of the
    // libraries loaded earlier (torch, the CUDA runtime) and while the interpreter still exists.
    std::atexit(finalize_kokkos);
  });
  TORCH_CHECK(!forked_after_start,
              "paraseq: this process was forked (os.fork or a multiprocessing 'fork' context) after paraseq's "
              "operators had run in its parent; Kokkos' OpenMP threads do not survive fork, so they cannot run in "
              "this child. Start worker processes with the 'spawn' or 'forkserver' method instead "
              "(multiprocessing.get_context(\"spawn\"), DataLoader(multiprocessing_context=\"spawn\"))");
  TORCH_CHECK(Kokkos::is_initialized(), "paraseq: Kokkos has been finalized; the operators cannot run any more");
}

std::string kokkos_configuration() {
  ensure_kokkos();
  std::ostringstream text;
  Kokkos::print_configuration(text, false);
  return text.str();
}

int64_t workspace_bytes() { return int64_t(paraseq::workspace_bytes()); }

void release_workspace() { paraseq::release_workspace(); }

#ifdef KOKKOS_ENABLE_CUDA
Kokkos::Cuda cuda_space(const char* op, const c10::Device& device) {
  ensure_kokkos();
  const int kokkos_device = Kokkos::Cuda().cuda_device();
  TORCH_CHECK(device.index() == kokkos_device, op, ": tensors are on ", device, ", expected cuda:", kokkos_device,
              " (Kokkos runs on one device per process; choose it with CUDA_VISIBLE_DEVICES)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  std::lock_guard<std::mutex> lock(cuda_instances_mutex);
  auto found = cuda_instances().find(stream);
  if (found == cuda_instances().end()) found = cuda_instances().emplace(stream, Kokkos::Cuda(stream)).first;
  return found->second;
}
#endif

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

std::vector<double> host_values(const at::Tensor& tensor) {
  const at::Tensor host = tensor.to(at::kCPU, at::kDouble).contiguous();
  const double* data = host.const_data_ptr<double>();
  return std::vector<double>(data, data + host.numel());
}

} // namespace paraseq::torch_bridge
