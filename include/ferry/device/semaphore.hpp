#pragma once
// Device handle of a semaphore: a pair of monotonically increasing 64-bit counters. The waiting side
// owns `inbound`, which the signalling side increases; each side keeps private counts of what it has
// sent (outbound) and what it has consumed (expectedInbound). Signal n is matched by wait n, so no
// counter is ever reset and no signal is lost or counted twice.
//
// Who signals: a peer GPU storing into our inbound token through NVLink (MemoryChannel), or a proxy
// writing it through a Connection (PortChannel, host-to-device). The wait side is the same.
//
// Ordering contract of signal(): every write the signalling thread made before signal() is visible
// to a thread that returns from the matching wait(). Writes by *other* threads of the block must be
// ordered first with __syncthreads() (the barrier plus this release store form a cumulative chain).
//   right:  copy(...by all threads...); __syncthreads(); if (tid == 0) chan.signal();
//   wrong:  copy(...by all threads...); if (tid == 0) chan.signal();   // peer may see stale data
#include <cstdint>
#include <type_traits>

#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/macros.hpp"
#include "ferry/device/timeout.hpp"

namespace ferry {

struct SemaphoreDeviceHandle {
  std::uint64_t* inbound = nullptr;          // ours, increased by the peer
  std::uint64_t* expectedInbound = nullptr;  // ours: how many signals we have consumed
  std::uint64_t* outbound = nullptr;         // ours: how many signals we have sent
  std::uint64_t* remoteInbound = nullptr;    // the peer's `inbound`, mapped here; null if the peer is
                                             // signalled by a proxy (PortChannel) instead
  WaitContext wait_;

  // One thread at a time (signals from several threads must be ordered among themselves: within a
  // block by __syncthreads, across blocks by a release/acquire chain or a kernel boundary). Makes this
  // thread's earlier writes visible, then increments the peer's counter. The release store costs a
  // system-scope fence (about 0.5 us on H200 over NVLink); to signal several peers after one write, use
  // atomicFence(memory_order_release) once and relaxedSignal() to each.
  FERRY_HOST_DEVICE FERRY_INLINE void signal() {
    atomicStore(remoteInbound, incrementOutbound(), memory_order_release);
  }

  // One thread at a time. Like signal() but orders nothing: for data that carries its own flags
  // (packets) or that the caller fenced already.
  FERRY_HOST_DEVICE FERRY_INLINE void relaxedSignal() {
    atomicStore(remoteInbound, incrementOutbound(), memory_order_relaxed);
  }

  // One thread. Returns once the next signal has arrived; afterwards the signaller's earlier writes
  // are visible to this thread (and, after __syncthreads(), to the block).
  // (Polling with relaxed loads plus one acquire fence measured slower on H200: 4.0 against 2.9 us
  // per round trip.)
  FERRY_HOST_DEVICE FERRY_INLINE void wait() {
    const std::uint64_t expected = ++*expectedInbound;
    spinUntil([&] { return atomicLoad(inbound, memory_order_acquire) >= expected; }, wait_, "semaphore wait",
              expected);
  }

  // Stamped signals: the signaller states the value instead of counting, for protocols that know
  // it already (a call number, a round, a chunk index). They skip the read-modify-write of the
  // outbound and expected counts, which sits on the critical path of every counted signal. Values
  // from one signaller must rise strictly; a wait for v returns once the inbound word is >= v, so
  // one signal satisfies every wait at or below it. Do not mix stamped and counted use of one
  // semaphore. The ordering contract is signal()'s.
  FERRY_HOST_DEVICE FERRY_INLINE void signalAt(std::uint64_t value) const {
    atomicStore(remoteInbound, value, memory_order_release);
  }
  FERRY_HOST_DEVICE FERRY_INLINE void relaxedSignalAt(std::uint64_t value) const {
    atomicStore(remoteInbound, value, memory_order_relaxed);
  }
  // One thread. Returns the inbound word that satisfied the wait (below `value` only when the wait
  // gave up on an abort). `what` names the operation in a timeout report.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t waitAt(std::uint64_t value,
                                                      const char* what = "semaphore wait") const {
    std::uint64_t seen = 0;
    spinUntil([&] { return (seen = atomicLoad(inbound, memory_order_acquire)) >= value; }, wait_, what, value);
    return seen;
  }
  // The inbound word now (acquire): what the peer signalled last.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t inboundValue() const {
    return atomicLoad(inbound, memory_order_acquire);
  }

  // One thread. Consumes the next signal if it has arrived.
  FERRY_HOST_DEVICE FERRY_INLINE bool poll() {
    if (atomicLoad(inbound, memory_order_acquire) <= *expectedInbound) return false;
    ++*expectedInbound;
    return true;
  }

 private:
  // A load and a store, not an atomic add: one thread signals at a time, and the add sat on the
  // critical path of every signal (about 0.3 us on H200). Relaxed atomics at device scope rather
  // than plain accesses, so that a signal from another block later sees this count, not a stale
  // copy in its SM's L1.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t incrementOutbound() {
    const std::uint64_t next =
        atomicLoad<std::uint64_t, cuda::thread_scope_device>(outbound, memory_order_relaxed) + 1;
    atomicStore<std::uint64_t, cuda::thread_scope_device>(outbound, next, memory_order_relaxed);
    return next;
  }
};
static_assert(std::is_trivially_copyable_v<SemaphoreDeviceHandle>);

}  // namespace ferry
