#pragma once
// The GPU-to-host FIFO, device side: many producers (GPU threads, or host threads in tests and
// host-only transports) push 16-byte triggers; one consumer (the proxy thread, ferry/proxy.hpp)
// polls and pops them in slot order. The host object that owns the memory is ferry::Fifo
// (ferry/fifo.hpp); kernels get a FifoDeviceHandle by value.
//
//   __global__ void k(ferry::FifoDeviceHandle fifo) {
//     std::uint64_t slot = fifo.push({/*fst=*/encode(op, bytes), /*snd=*/offset});
//     fifo.sync(slot);  // returns once the proxy's handler has run for this trigger (optional)
//   }
//
// Trigger format: the FIFO owns the top bit of `fst` (kTriggerFullBit), its "slot is full" mark;
// users own the other 127 bits. push() sets that bit whatever the caller passed, and the consumer
// hands the trigger back with it cleared, so an encoding must leave it unused. Nothing else is
// checked or changed.
//
// Memory placement (Fifo::Memory::Gpu; in Fifo::Memory::Host everything is plain host memory):
//   triggers   pinned host memory, mapped: the GPU writes them over PCIe (posted writes, cheap); the
//              proxy polls them from its own cache, without a PCIe read per poll.
//   head       device memory: only producers touch it (one atomic add per push, resolved in L2).
//   tail       pinned host memory, mapped: written by the proxy only; a GPU read is a PCIe round trip
//              (~1 us), so producers read it only when the FIFO looks full, and in sync().
//   tailCache  device memory: the newest tail value some producer has read. "Looks full" is judged
//              against it, so a push costs one L2 read instead of a PCIe read. Producers refresh it
//              themselves after each read of tail; the proxy never writes device memory (that would
//              need a copy per pop). It may lag behind tail, or even move back when two refreshes
//              race, but it never runs ahead of tail (it only ever holds values read from tail),
//              which is all correctness needs: a stale value only costs an extra read of tail.
//
// Ordering (why a consumer that sees a full mark sees the whole trigger, and why slots are reused
// safely):
//   1. push writes `snd`, then stores `fst | kTriggerFullBit` with a release store at system scope.
//      The consumer loads `fst` with acquire; if it sees the full mark, everything written before the
//      release (snd) is visible to it. On the GPU a 16-byte store to host memory is not guaranteed to
//      land as one piece, hence the two steps: the mark travels with the second, ordered store.
//   2. The consumer clears the slot (fst = 0), then advances tail with a release store. A producer
//      that wants slot s + size reads tail with acquire (directly, or through tailCache: a producer
//      that read tail with acquire stores it to tailCache with release, and readers of tailCache
//      acquire, so the chain is transitive); it writes the slot only after seeing tail > s, hence
//      after the clear, so the clear can never overwrite a new trigger.
//   3. One producer owns a slot number (fetch_add on head), and waits until slot < tail + size, so at
//      most one producer writes a given slot at a time.
//
// Scopes: head is reserved with a relaxed fetch_add at system scope. Relaxed, because head only
// hands out slot numbers; publishing is step 1's job. System scope, because producers need not all
// be threads of one GPU: host threads push in tests and host-only transports, and a GPU and host
// threads may share a FIFO whose head is in memory both can reach. On device memory a relaxed
// system-scope atomic costs what a device-scope one does (both resolve in L2; scope only changes
// the fences that stronger orders imply). tail, tailCache and fst are accessed at system scope
// because the proxy is a host thread.
#include <cstdint>
#include <type_traits>

#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/macros.hpp"
#include "ferry/device/timeout.hpp"
#if !FERRY_DEVICE_CODE
#include <thread>
#endif

namespace ferry {

// One request from a producer to the proxy. The top bit of fst belongs to the FIFO (see above).
struct alignas(16) ProxyTrigger {
  std::uint64_t fst;
  std::uint64_t snd;
};
static_assert(sizeof(ProxyTrigger) == 16);

inline constexpr std::uint64_t kTriggerFullBit = std::uint64_t{1} << 63;

struct FifoDeviceHandle {
  ProxyTrigger* triggers = nullptr;  // `size` slots
  std::uint64_t* head = nullptr;     // next slot number to hand out
  std::uint64_t* tail = nullptr;     // slots below it are handled and cleared (written by the consumer)
  std::uint64_t* tailCache = nullptr;
  int size = 0;      // a power of two
  WaitContext wait;  // rank: this rank; peer: -1 (the FIFO waits for its own proxy, not for a peer)

  // Appends `trigger` and returns its slot number (0, 1, 2, ... over the FIFO's life). Blocks while
  // the FIFO is full, up to wait.timeoutNs; then it reports "Fifo::push" and traps (host: aborts).
  // @pre trigger.fst's top bit is unused (it is overwritten).
  // @post the consumer will see the trigger after every trigger of a smaller slot number.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t push(ProxyTrigger trigger) const {
    const std::uint64_t slot = atomicFetchAdd(head, std::uint64_t{1}, memory_order_relaxed);
    const std::uint64_t lag = static_cast<std::uint64_t>(size);
    if (slot >= atomicLoad(tailCache, memory_order_acquire) + lag) {
      std::uint32_t polls = 0;
      spinUntil([&] { return slot < refreshTail(polls) + lag; }, wait, "Fifo::push", slot);
    }
    ProxyTrigger* t = &triggers[slot & (lag - 1)];
    t->snd = trigger.snd;
    atomicStore(&t->fst, trigger.fst | kTriggerFullBit, memory_order_release);
    return slot;
  }

  // Appends two triggers in consecutive slots, reserved at once (one fetch_add of 2), so that no
  // other producer's trigger lands between them: the consumer handles `first` and then `second`,
  // for requests that need more than 127 bits. Returns the slot of `second`.
  // @pre size >= 2; as push() for each trigger.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t pushPair(ProxyTrigger first, ProxyTrigger second) const {
    const std::uint64_t slot = atomicFetchAdd(head, std::uint64_t{2}, memory_order_relaxed);
    const std::uint64_t lag = static_cast<std::uint64_t>(size);
    if (slot + 1 >= atomicLoad(tailCache, memory_order_acquire) + lag) {
      std::uint32_t polls = 0;
      spinUntil([&] { return slot + 1 < refreshTail(polls) + lag; }, wait, "Fifo::push", slot + 1);
    }
    ProxyTrigger* t = &triggers[slot & (lag - 1)];
    t->snd = first.snd;
    atomicStore(&t->fst, first.fst | kTriggerFullBit, memory_order_release);
    t = &triggers[(slot + 1) & (lag - 1)];
    t->snd = second.snd;
    atomicStore(&t->fst, second.fst | kTriggerFullBit, memory_order_release);
    return slot + 1;
  }

  // Waits until the consumer has finished with `slot` (its handler returned and the slot was
  // popped), up to wait.timeoutNs; then reports "Fifo::sync" and traps (host: aborts).
  // @pre slot was returned by push() on this FIFO.
  FERRY_HOST_DEVICE FERRY_INLINE void sync(std::uint64_t slot) const {
    if (slot < atomicLoad(tailCache, memory_order_acquire)) return;
    std::uint32_t polls = 0;
    spinUntil([&] { return slot < refreshTail(polls); }, wait, "Fifo::sync", slot);
  }

 private:
  // Reads tail (a PCIe read from the GPU) and publishes it in tailCache. On the host, yields the
  // core every few failed polls: a host producer waiting on an oversubscribed machine must let
  // the consumer run.
  FERRY_HOST_DEVICE FERRY_INLINE std::uint64_t refreshTail(std::uint32_t& polls) const {
    const std::uint64_t t = atomicLoad(tail, memory_order_acquire);
    if (t > atomicLoad(tailCache, memory_order_relaxed)) atomicStore(tailCache, t, memory_order_release);
#if !FERRY_DEVICE_CODE
    if ((++polls & 15) == 0) std::this_thread::yield();
#else
    (void)polls;
#endif
    return t;
  }
};
static_assert(std::is_trivially_copyable_v<FifoDeviceHandle>);

}  // namespace ferry
