#pragma once
// The GPU-to-host FIFO, host side: owns the memory behind FifoDeviceHandle (ferry/device/fifo.hpp,
// which explains the placement and the ordering) and is its single consumer. Most users do not
// drive a Fifo themselves: a Proxy (ferry/proxy.hpp) owns one and drains it on its own thread.
//
//   ferry::Fifo fifo({.size = 64, .memory = ferry::Fifo::Memory::Host});
//   ferry::FifoDeviceHandle h = fifo.deviceHandle();   // producers: h.push(...) from any thread
//   while (auto trigger = fifo.poll()) {                // consumer: one thread only
//     handle(*trigger);
//     fifo.pop();                                       // after handling: sync(slot) means "handled"
//   }
//
// Wrong: calling poll()/pop() from two threads (there is one consumer; the read position is not
// shared), or pop() before the trigger is handled when producers use sync().
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "ferry/api.hpp"
#include "ferry/device/fifo.hpp"

namespace ferry {

enum class FifoMemory {
  Gpu,   // triggers and tail in mapped pinned host memory, head in device memory (the default)
  Host,  // all in plain host memory: host producers only (CI tests, host-only transports)
};

struct FifoOptions {
  static constexpr int kDefaultSize = 512;
  static constexpr int kMaxSize = 1 << 20;
  int size = kDefaultSize;  // slots: a power of two in [1, kMaxSize]
  FifoMemory memory = FifoMemory::Gpu;
  int device = -1;  // Gpu: the CUDA device that pushes; -1: the current device
  int rank = -1;    // named by a device wait that times out
  // Bound on push() and sync(); unset: FERRY_DEVICE_TIMEOUT. Zero: wait forever.
  std::optional<std::chrono::nanoseconds> timeout;
};

class FERRY_API Fifo {
 public:
  using Memory = FifoMemory;

  // Throws Error(InvalidUsage) for a bad size, CudaError when Gpu memory cannot be allocated (no
  // GPU, bad device).
  explicit Fifo(const FifoOptions& options = {});
  ~Fifo();
  Fifo(const Fifo&) = delete;
  Fifo& operator=(const Fifo&) = delete;

  // Trivially copyable; valid while this Fifo lives. Pass it to kernels by value.
  FifoDeviceHandle deviceHandle() const;

  // The trigger at the read position, without the full bit, or nullopt when that slot is empty.
  // Does not advance: polling again returns the same trigger until pop().
  std::optional<ProxyTrigger> poll();
  // Frees the slot that poll() returned and advances the read position (the tail). The slot is
  // cleared before the tail moves: a producer may reuse a slot only once it sees the new tail,
  // so it never writes a slot that the clear could still overwrite.
  // Throws Error(InvalidUsage) when the slot holds no trigger (pop without a successful poll).
  void pop();

  // The slot number poll() looks at: how many triggers have been popped.
  std::uint64_t tail() const;
  int size() const;
  Memory memory() const;
  int device() const;  // the CUDA device of Gpu memory; -1 for Host memory

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
