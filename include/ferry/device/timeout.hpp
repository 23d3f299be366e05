#pragma once
// Bounded spinning (architecture.md rule 2): every device wait goes through spinUntil, which gives up
// after the handle's bound (FERRY_DEVICE_TIMEOUT, set on the host when the handle is made) and
// reports who was waiting for whom and for what before it stops the kernel with a trap. The
// host sees the trap as cudaErrorLaunchFailure (or cudaErrorIllegalInstruction) on its next
// synchronization, with the report on stdout.
#include <cstdint>

#include "ferry/device/arch/timer.hpp"
#include "ferry/device/macros.hpp"
#if !FERRY_DEVICE_CODE
#include <cstdio>
#include <cstdlib>
#endif

namespace ferry {

// Who waits, for whom, and how long at most. Trivially copyable; lives inside device handles.
struct WaitContext {
  std::int32_t rank = -1;
  std::int32_t peer = -1;
  std::uint64_t timeoutNs = 0;  // 0: never give up (only for debugging)
  // Non-null for the waits of a communicator that can be aborted (Comm::abort): once the word is
  // non-zero, every wait gives up at once, without a report, and the kernel runs to its end
  // (computing garbage) instead of trapping, so the stream and the CUDA context stay usable.
  const std::uint32_t* abortFlag = nullptr;
};

// Calls done() until it returns true, or until ctx.abortFlag is raised. On timeout: reports and
// traps (device) or aborts (host). `what` names the operation, e.g. "MemoryChannel::wait".
template <class Done>
FERRY_HOST_DEVICE FERRY_INLINE void spinUntil(Done&& done, const WaitContext& ctx, const char* what,
                                              std::uint64_t detail = 0) {
  if (done()) return;
  const std::uint64_t start = nowNs();
  for (std::uint32_t spins = 1;; ++spins) {
    if (done()) return;
    // Reading the timer (or the abort word) costs more than a poll; look every 1024 polls.
    if ((spins & 1023) != 0) continue;
    if (ctx.abortFlag != nullptr && *static_cast<const volatile std::uint32_t*>(ctx.abortFlag) != 0) return;
    if (ctx.timeoutNs != 0 && nowNs() - start > ctx.timeoutNs) {
      const char* report =
          "ferry: rank %d: %s waiting for rank %d timed out after %llu ms (detail %llu); the peer is "
          "missing, "
          "hung, or did not issue the matching operation (raise FERRY_DEVICE_TIMEOUT if it is only slow)\n";
      const auto ms = static_cast<unsigned long long>(ctx.timeoutNs / 1000000);
#if FERRY_DEVICE_CODE
      printf(report, ctx.rank, what, ctx.peer, ms, static_cast<unsigned long long>(detail));
      __trap();
#else
      std::fprintf(stderr, report, ctx.rank, what, ctx.peer, ms, static_cast<unsigned long long>(detail));
      std::abort();
#endif
    }
  }
}

}  // namespace ferry
