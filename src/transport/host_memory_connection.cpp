#include "transport/host_memory_connection.hpp"

#include <atomic>
#include <cstring>

namespace ferry {

void HostMemoryConnection::doWrite(void* dst, const void* src, std::uint64_t bytes) {
  std::memcpy(dst, src, bytes);
}

void HostMemoryConnection::doUpdateAndSync(std::uint64_t* dst, bool /*dstInHostMemory: always*/,
                                           std::uint64_t newValue) {
  // Release: every store of the earlier memcpy calls (same thread) happens-before a reader's
  // acquire load that sees newValue.
  std::atomic_ref<std::uint64_t>(*dst).store(newValue, std::memory_order_release);
}

void HostMemoryConnection::doFlush(std::chrono::duration<double>) {
  // Everything completed on return; the fence orders our plain stores for readers that use
  // relaxed loads followed by their own acquire fence.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace ferry
