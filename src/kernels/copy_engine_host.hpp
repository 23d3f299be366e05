#pragma once
// The host side of a Comm's copy engine (copy_engine.hpp says what kernels ask of it). Made with
// the Comm (streams, events and the FIFO are allocated then, never during a call or a capture); its
// proxy thread starts on the first call that uses it and dozes when idle, so a Comm that never runs
// a copy-engine algorithm costs no core.
#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <mutex>
#include <optional>

#include "kernels/copy_engine.hpp"
#include "ferry/proxy.hpp"

namespace ferry {

class CopyEngine {
 public:
  // @pre the Comm's device is current. rank names this rank in errors and in device timeouts.
  CopyEngine(int rank, int worldSize, int device);
  ~CopyEngine();  // stops the proxy, then waits (bounded) for copies still in flight
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Starts the proxy if it is not running (a handler error stopped it: rethrown here, naming the
  // request) and returns the handle kernels push to.
  CopyEngineHandle handle();

 private:
  ProxyHandlerResult handleTrigger(ProxyTrigger trigger);
  // Returns once the copies queued on `stream` (up to event `upTo`, or all) are complete; a
  // TimeoutError naming this rank and the peer after FERRY_DEVICE_TIMEOUT.
  void awaitCopies(int stream, cudaEvent_t upTo = nullptr) const;

  int rank_;
  int worldSize_;
  int device_;
  std::array<cudaStream_t, kCeStreams> streams_{};
  std::array<std::array<cudaEvent_t, kCeStreams>, kCeMarks> events_{};
  std::uint32_t* locks_ = nullptr;  // device memory: CopyEngineHandle::locks
  std::unique_ptr<Proxy> proxy_;
  std::mutex startMutex_;
  // Per stream, a CopyTo waiting for its CopyFrom (proxy thread only): the two halves of a copy
  // pair up by stream, so producers that use different streams may push at the same time.
  std::array<std::optional<CeRequest>, kCeStreams> pending_{};
};

}  // namespace ferry
