#pragma once
// Temporaries that repeated calls of one shape reuse instead of allocating (docs/memory.md). Every
// Kokkos allocation is a cudaMalloc + cudaFree on CUDA, and cudaFree synchronises the device; so the
// scans, the Newton solver, its backward pass and the input projection take their temporaries from a
// cache: one buffer per call site (its label), per memory space, per execution-space instance and
// per calling host thread. A buffer grows only when a call asks for more than it holds; otherwise
// the call gets an unmanaged View of the type it asked for into it, and allocates nothing.
//
// Why per host thread rather than one cache locked for the duration of a call: a buffer is in use
// from the call that takes it until the kernels it enqueued are done. Calls of one thread on one
// instance are ordered by that instance (its stream), so they can share a buffer; calls of two
// threads are not ordered with each other, so they must not. A lock held for a whole public call
// would need a guard at every public entry (and serialise the threads' host work); per-thread
// buffers need nothing at the call sites. The price is one set of buffers per thread that calls.
//
// release_workspace() frees every buffer (fencing first); it must not run while another thread is
// inside a paraseq call. workspace_bytes() says how much they hold. The cache is freed before
// Kokkos::finalize, so that no View outlives Kokkos.
// The PyTorch operators use this cache too, not PyTorch's caching allocator: taking the bytes from
// at::empty instead would need the tensor kept alive until the call's kernels are done, which the
// cache's per-site buffers give for free; so the memory it holds is outside torch's accounting.

#include <Kokkos_Core.hpp>

#include <paraseq/core/fill.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

namespace paraseq {

namespace detail {

// The caches of the memory spaces that were used: their release functions, which
// release_workspace() runs, and their sizes, which workspace_bytes() adds up.
struct WorkspaceCaches {
  std::mutex mutex;
  std::vector<std::function<void()>> releasers;
  std::vector<std::function<std::size_t()>> sizes;
};

inline WorkspaceCaches& workspace_caches() {
  static WorkspaceCaches instance;
  return instance;
}

template <class Space>
std::uint32_t instance_id(const Space& space) {
  if constexpr (requires { space.impl_instance_id(); }) return space.impl_instance_id();
  else return 0;
}

// The buffers of one memory space, keyed by (instance, thread, label).
template <class MemorySpace>
class WorkspaceCache {
public:
  static WorkspaceCache& get() {
    static WorkspaceCache* cache = [] {
      auto* created = new WorkspaceCache; // never destroyed: Kokkos may be finalized before static destructors run
      std::lock_guard<std::mutex> lock(workspace_caches().mutex);
      workspace_caches().releasers.push_back([created] { created->release(); });
      workspace_caches().sizes.push_back([created] { return created->bytes(); });
      return created;
    }();
    return *cache;
  }

  // At least `bytes` bytes for this call site of this thread on this instance.
  template <class Space>
  void* take(const Space& space, const std::string& label, std::size_t bytes) {
    const Key key{instance_id(space), std::this_thread::get_id(), label};
    std::lock_guard<std::mutex> lock(mutex_);
    Buffer& buffer = buffers_[key];
    grow(space, label, buffer, bytes);
    return buffer.bytes.data();
  }

  // As take(), for a buffer of 64-bit words that each carry the tag of the call that wrote them (the
  // one-pass Newton kernels' TaggedWord), and a tag that no word in the buffer carries yet: the
  // call's. A new or grown buffer is zeroed (tag 0), and so is one whose tags have run through 32 bits.
  template <class Space>
  std::pair<std::uint64_t*, std::uint32_t> take_tagged(const Space& space, const std::string& label,
                                                       std::size_t words) {
    const Key key{instance_id(space), std::this_thread::get_id(), label};
    std::lock_guard<std::mutex> lock(mutex_);
    Buffer& buffer = buffers_[key];
    // A new allocation may reuse the old one's address (CUDA's allocator does): whether it was
    // made is what tells.
    if (grow(space, label, buffer, words * sizeof(std::uint64_t)) || ++buffer.tag == 0) {
      const Kokkos::View<std::uint64_t*, MemorySpace, Kokkos::MemoryUnmanaged> all(
          reinterpret_cast<std::uint64_t*>(buffer.bytes.data()), buffer.bytes.size() / sizeof(std::uint64_t));
      fill(space, all, std::uint64_t(0));
      buffer.tag = 1;
    }
    return {reinterpret_cast<std::uint64_t*>(buffer.bytes.data()), buffer.tag};
  }

  std::size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const auto& entry : buffers_) total += entry.second.bytes.size();
    return total;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffers_.empty()) return;
    Kokkos::fence("paraseq::release_workspace"); // no kernel still reads a buffer
    buffers_.clear();
    finalize_hook_pushed_ = false; // a later Kokkos::initialize needs the hook again
  }

private:
  using Key = std::tuple<std::uint32_t, std::thread::id, std::string>;
  struct Buffer {
    Kokkos::View<unsigned char*, MemorySpace> bytes;
    std::uint32_t tag = 0; // the tag of take_tagged's last call
  };

  // Reallocates `buffer` if it holds fewer than `bytes` bytes, and says whether it did; called with
  // the mutex held.
  template <class Space>
  bool grow(const Space& space, const std::string& label, Buffer& buffer, std::size_t bytes) {
    if (!finalize_hook_pushed_) {
      Kokkos::push_finalize_hook([this] { release(); });
      finalize_hook_pushed_ = true;
    }
    if (buffer.bytes.size() >= bytes) return false;
    // The previous buffer may still be read by kernels this thread enqueued on this instance.
    if (buffer.bytes.data()) space.fence("paraseq::workspace_grow");
    buffer.bytes = {};
    buffer.bytes =
        Kokkos::View<unsigned char*, MemorySpace>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), bytes);
    return true;
  }

  std::mutex mutex_;
  std::map<Key, Buffer> buffers_;
  bool finalize_hook_pushed_ = false;
};

// An unmanaged View of type `View` (unmanaged or not: the type the kernels take) with these extents,
// from this call site's cached buffer; its values are undefined.
template <class View, class Space, class... Extents>
View workspace_view(const Space& space, const std::string& label, Extents... extents) {
  using layout = typename View::array_layout;
  static_assert(std::is_same_v<layout, Kokkos::LayoutRight> || std::is_same_v<layout, Kokkos::LayoutLeft>,
                "workspace_view: a contiguous layout, so that the extents alone give the View's size");
  using memory_space = typename View::memory_space;
  const std::size_t bytes = View::required_allocation_size(std::size_t(extents)...);
  void* data = WorkspaceCache<memory_space>::get().take(space, label, bytes);
  return View(static_cast<typename View::pointer_type>(data), std::size_t(extents)...);
}

// The same, filled with zeros on the space (an asynchronous memset, not an allocation).
template <class View, class Space, class... Extents>
View zeroed_workspace_view(const Space& space, const std::string& label, Extents... extents) {
  const View view = workspace_view<View>(space, label, extents...);
  fill(space, view, 0);
  return view;
}

// A workspace of `words` 64-bit words that carry the tag of the call that wrote them
// (WorkspaceCache::take_tagged), and the tag for this call: no word in it carries that tag yet.
template <class Space>
std::pair<Kokkos::View<std::uint64_t*, typename Space::memory_space, Kokkos::MemoryUnmanaged>, std::uint32_t>
tagged_workspace_view(const Space& space, const std::string& label, std::size_t words) {
  using view_type = Kokkos::View<std::uint64_t*, typename Space::memory_space, Kokkos::MemoryUnmanaged>;
  const auto [data, tag] = WorkspaceCache<typename Space::memory_space>::get().take_tagged(space, label, words);
  return {view_type(data, words), tag};
}

} // namespace detail

// Frees the temporaries that paraseq's calls keep for the next call of the same shape, in every
// memory space, after a fence. Call it when memory is tight; the next call allocates them again. It
// must not run while another thread is inside a paraseq call.
inline void release_workspace() {
  auto& caches = detail::workspace_caches();
  std::lock_guard<std::mutex> lock(caches.mutex);
  for (const auto& release : caches.releasers) release();
}

// The bytes that those temporaries hold now, in every memory space (what release_workspace() would
// free): on a GPU, memory that a framework's own allocator does not count.
inline std::size_t workspace_bytes() {
  auto& caches = detail::workspace_caches();
  std::lock_guard<std::mutex> lock(caches.mutex);
  std::size_t total = 0;
  for (const auto& size : caches.sizes) total += size();
  return total;
}

} // namespace paraseq
