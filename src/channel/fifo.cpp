#include "ferry/fifo.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <new>
#include <string>

#include "platform/cuda_check.hpp"
#include "platform/device_guard.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "core/deadline.hpp"

namespace ferry {
namespace {

// Keeps tail (polled by producers) and head/tailCache off the triggers' cache lines and off each
// other's: 128 bytes covers a GPU L2 line and two host cache lines (adjacent-line prefetch).
constexpr std::size_t kLine = 128;

std::size_t roundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

void validate(const FifoOptions& o) {
  const bool powerOfTwo = o.size > 0 && (o.size & (o.size - 1)) == 0;
  if (!powerOfTwo || o.size > FifoOptions::kMaxSize)
    throw Error(ErrorCode::InvalidUsage, "Fifo: size " + std::to_string(o.size) +
                                             " is not valid: expected a power of two from 1 to " +
                                             std::to_string(FifoOptions::kMaxSize));
  if (o.timeout && o.timeout->count() < 0) throw Error(ErrorCode::InvalidUsage, "Fifo: negative timeout");
}

std::uint64_t timeoutNs(const FifoOptions& o) {
  if (o.timeout) return static_cast<std::uint64_t>(o.timeout->count());
  return timeoutNanoseconds(env().deviceTimeout);
}

// Zeroes device memory and waits for it, on a stream of its own: a memset is asynchronous to the
// host, and a kernel on any stream may push as soon as the constructor returns. No device-wide
// synchronization, so a Fifo can be made while other kernels run.
void zeroDeviceMemory(void* ptr, std::size_t bytes) {
  cudaStream_t stream = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t err = cudaMemsetAsync(ptr, 0, bytes, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);
  if (err != cudaSuccess)
    detail::throwCudaError(err, "cudaMemsetAsync + cudaStreamSynchronize (Fifo head)",
                           SourceLocation::current());
}

}  // namespace

struct Fifo::Impl {
  FifoOptions options;
  // Host view of the shared memory: triggers and tail first (kLine-aligned tail after the
  // triggers), then head and tailCache, each on its own line.
  void* hostBlock = nullptr;    // triggers + tail: pinned (Gpu) or plain (Host)
  void* deviceBlock = nullptr;  // head + tailCache: device memory (Gpu) or plain (Host)
  ProxyTrigger* triggers = nullptr;
  std::uint64_t* tail = nullptr;
  FifoDeviceHandle handle{};
  std::uint64_t readPos = 0;  // the consumer's copy of tail: only the consumer writes tail

  explicit Impl(const FifoOptions& o) : options(o) {
    validate(o);
    const std::size_t triggerBytes = roundUp(sizeof(ProxyTrigger) * static_cast<std::size_t>(o.size), kLine);
    const std::size_t hostBytes = triggerBytes + kLine;
    const std::size_t deviceBytes = 2 * kLine;
    handle.size = o.size;
    handle.wait.rank = o.rank;
    handle.wait.timeoutNs = timeoutNs(o);
    if (o.memory == FifoMemory::Host) {
      hostBlock = ::operator new (hostBytes, std::align_val_t{kLine});
      deviceBlock = ::operator new (deviceBytes, std::align_val_t{kLine});
      std::memset(hostBlock, 0, hostBytes);
      std::memset(deviceBlock, 0, deviceBytes);
      triggers = static_cast<ProxyTrigger*>(hostBlock);
      tail = reinterpret_cast<std::uint64_t*>(static_cast<char*>(hostBlock) + triggerBytes);
      handle.triggers = triggers;
      handle.tail = tail;
      handle.head = static_cast<std::uint64_t*>(deviceBlock);
      handle.tailCache = reinterpret_cast<std::uint64_t*>(static_cast<char*>(deviceBlock) + kLine);
      return;
    }
    if (options.device < 0) FERRY_CUDA_CHECK(cudaGetDevice(&options.device));
    DeviceGuard guard(options.device);
    try {
      FERRY_CUDA_CHECK(cudaHostAlloc(&hostBlock, hostBytes, cudaHostAllocMapped));
      std::memset(hostBlock, 0, hostBytes);
      FERRY_CUDA_CHECK(cudaMalloc(&deviceBlock, deviceBytes));
      zeroDeviceMemory(deviceBlock, deviceBytes);
      void* mapped = nullptr;
      FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, hostBlock, 0));
      triggers = static_cast<ProxyTrigger*>(hostBlock);
      tail = reinterpret_cast<std::uint64_t*>(static_cast<char*>(hostBlock) + triggerBytes);
      handle.triggers = static_cast<ProxyTrigger*>(mapped);
      handle.tail = reinterpret_cast<std::uint64_t*>(static_cast<char*>(mapped) + triggerBytes);
      handle.head = static_cast<std::uint64_t*>(deviceBlock);
      handle.tailCache = reinterpret_cast<std::uint64_t*>(static_cast<char*>(deviceBlock) + kLine);
    } catch (...) {
      release();
      throw;
    }
  }

  ~Impl() { release(); }

  void release() noexcept {
    if (options.memory == FifoMemory::Host) {
      ::operator delete (hostBlock, std::align_val_t{kLine});
      ::operator delete (deviceBlock, std::align_val_t{kLine});
      return;
    }
    if (hostBlock != nullptr) {
      if (cudaError_t err = cudaFreeHost(hostBlock); err != cudaSuccess)
        FERRY_LOG(Warn, Transport) << "Fifo: cudaFreeHost failed: " << cudaGetErrorString(err);
    }
    if (deviceBlock != nullptr) {
      if (cudaError_t err = cudaFree(deviceBlock); err != cudaSuccess)
        FERRY_LOG(Warn, Transport) << "Fifo: cudaFree failed: " << cudaGetErrorString(err);
    }
    hostBlock = deviceBlock = nullptr;
  }
};

Fifo::Fifo(const FifoOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Fifo::~Fifo() = default;

FifoDeviceHandle Fifo::deviceHandle() const { return impl_->handle; }

std::optional<ProxyTrigger> Fifo::poll() {
  ProxyTrigger* slot = &impl_->triggers[impl_->readPos & static_cast<std::uint64_t>(impl_->options.size - 1)];
  const std::uint64_t fst = atomicLoad(&slot->fst, memory_order_acquire);
  if ((fst & kTriggerFullBit) == 0) return std::nullopt;
  // snd was written before the release store of fst that the acquire load above saw.
  return ProxyTrigger{fst & ~kTriggerFullBit, slot->snd};
}

void Fifo::pop() {
  ProxyTrigger* slot = &impl_->triggers[impl_->readPos & static_cast<std::uint64_t>(impl_->options.size - 1)];
  if ((atomicLoad(&slot->fst, memory_order_relaxed) & kTriggerFullBit) == 0)
    throw Error(ErrorCode::InvalidUsage, "Fifo::pop: slot " + std::to_string(impl_->readPos) +
                                             " holds no trigger (pop without a successful poll)");
  // The clear must be visible before the new tail (release): see device/fifo.hpp, ordering 2.
  atomicStore(&slot->fst, std::uint64_t{0}, memory_order_relaxed);
  atomicStore(impl_->tail, ++impl_->readPos, memory_order_release);
}

std::uint64_t Fifo::tail() const { return impl_->readPos; }
int Fifo::size() const { return impl_->options.size; }
Fifo::Memory Fifo::memory() const { return impl_->options.memory; }
int Fifo::device() const { return impl_->options.memory == FifoMemory::Gpu ? impl_->options.device : -1; }

}  // namespace ferry
