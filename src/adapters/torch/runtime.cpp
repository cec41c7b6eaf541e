// The Kokkos runtime of the operators (runtime.hpp) and the runtime functions of work.hpp.
#include "runtime.hpp"

#include <paraseq/core/workspace.hpp>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <map>
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
  if (forked_after_start)
    throw std::runtime_error(
        "paraseq: this process was forked (os.fork or a multiprocessing 'fork' context) after paraseq's "
        "operators had run in its parent; Kokkos' OpenMP threads do not survive fork, so they cannot run in "
        "this child. Start worker processes with the 'spawn' or 'forkserver' method instead "
        "(multiprocessing.get_context(\"spawn\"), DataLoader(multiprocessing_context=\"spawn\"))");
  if (!Kokkos::is_initialized())
    throw std::runtime_error("paraseq: Kokkos has been finalized; the operators cannot run any more");
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
Kokkos::Cuda cuda_space(const char* op, const Place& place) {
  ensure_kokkos();
  const int kokkos_device = Kokkos::Cuda().cuda_device();
  if (place.index != kokkos_device)
    throw std::runtime_error(std::string(op) + ": tensors are on cuda:" + std::to_string(place.index) + ", expected cuda:" +
                             std::to_string(kokkos_device) +
                             " (Kokkos runs on one device per process; choose it with CUDA_VISIBLE_DEVICES)");
  const auto stream = static_cast<cudaStream_t>(place.stream);
  std::lock_guard<std::mutex> lock(cuda_instances_mutex);
  auto found = cuda_instances().find(stream);
  if (found == cuda_instances().end()) found = cuda_instances().emplace(stream, Kokkos::Cuda(stream)).first;
  return found->second;
}
#endif

} // namespace paraseq::torch_bridge
