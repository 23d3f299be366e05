#pragma once
// A stream of a Comm's own beside the caller's, and the events that fork work onto it and join it
// back: a call across hosts runs its partners' exchanges there while the caller's stream runs the
// host's phases (across_hosts_algorithms.hpp, across_hosts_pipelined). Work goes onto it only
// after an event of the caller's stream, and the caller's stream waits for all of it before the
// call ends, so a CUDA graph capture takes it in (fork and join) and the Comm's StreamWork, which
// sees only the caller's stream, still covers it.
#include <cuda_runtime_api.h>

#include <vector>

namespace ferry {

class SideStream {
 public:
  // `events` events, indexed 0 .. events - 1. @pre the Comm's device is current.
  explicit SideStream(int events);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t stream() const { return stream_; }
  int events() const { return static_cast<int>(events_.size()); }
  // Event i marks what `on` has queued so far; `waiter` then waits for it (an event's wait is for
  // its latest record, so each mark of one call takes an index of its own).
  void record(int i, cudaStream_t on);
  void wait(cudaStream_t waiter, int i);
  // After an error in a call that forked the side stream: `waiter` waits for all the side stream
  // was given (a capture must join every stream it forked; a later call must not overtake the
  // work). Through an event of its own; errors are swallowed, the call's own error is the one to
  // report.
  void join(cudaStream_t waiter) noexcept;

 private:
  cudaEvent_t event(int i) const;  // Error(InternalError) outside 0 .. events - 1

  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t joined_ = nullptr;
};

}  // namespace ferry
