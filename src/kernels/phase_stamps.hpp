#pragma once
// Phase stamps: where the time of one collective call goes, measured inside its kernel
// (FERRY_PHASE_STAMPS=1; docs/architecture.md, "Latency"). Block 0's thread 0 writes, for each call,
// one record into a ring on its GPU: the SM clock at each phase boundary below and the global timer
// at entry and exit (the gap between one call's exit and the next call's entry is the launch).
// The Comm prints a summary per (collective, count) when it is destroyed (src/comm/phase_stamps.cpp).
// Off (a null ring), a stamp is one predicated-off branch on a kernel parameter.
#include <cstdint>

#include "ferry/device/macros.hpp"

namespace ferry {

// The boundaries a call passes, in order. A kernel that has no start wait leaves kStarted at 0.
enum PhasePoint : int {
  kEntered = 0,    // beginCall has the call's number (its first loads returned: device_context.hpp)
  kAnnounced = 1,  // this rank's start word is stored at every peer
  kStarted = 2,    // every peer this call writes to has started the previous call
  kDataDone = 3,   // every thread of block 0 is done moving data (endCall's barrier)
  kExited = 4,     // the peers' shapes are checked (the last instruction of the call)
  kPhasePoints = 5,
};

// One record: the call, its key (collective << 56 | count), the SM clocks of the points, and the
// global timer (ns) at kEntered and kExited.
struct PhaseRecord {
  std::uint64_t call;
  std::uint64_t key;
  std::uint64_t clocks[kPhasePoints];
  std::uint64_t enteredNs;
  std::uint64_t exitedNs;
};

inline constexpr std::uint64_t kPhaseRecords = 1u << 16;  // the ring: the last 65536 calls

// The send/recv kernel's records (collectives/p2p.cu), in a ring of their own: this op, and the
// bytes of the group's first message for the count.
inline constexpr int kPhaseSendRecv = 255;

FERRY_HOST_DEVICE constexpr std::uint64_t phaseKey(int op, std::uint64_t count) {
  return static_cast<std::uint64_t>(op) << 56 | (count & ((std::uint64_t{1} << 56) - 1));
}

#if defined(__CUDACC__)
FERRY_DEVICE FERRY_INLINE std::uint64_t globalTimerNs() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block 0, thread 0 only; nothing when the ring is null.
FERRY_DEVICE FERRY_INLINE void stampPhase(PhaseRecord* ring, std::uint64_t m, PhasePoint point, int op = 0,
                                          std::uint64_t count = 0) {
  if (ring == nullptr || blockIdx.x != 0 || threadIdx.x != 0) return;
  PhaseRecord& rec = ring[m % kPhaseRecords];
  rec.clocks[point] = clock64();
  if (point == kEntered) {
    rec.call = m;
    rec.key = phaseKey(op, count);
    rec.clocks[kStarted] = 0;
    rec.enteredNs = globalTimerNs();
  } else if (point == kExited) {
    rec.exitedNs = globalTimerNs();
  }
}
#endif

}  // namespace ferry
