#pragma once
// The work a Comm has queued, so that destroying the Comm or deregistering a buffer can wait for
// that work alone, not for the whole device (a PyTorch allocator hook deregisters while other work
// runs; cudaDeviceSynchronize would also wait for every other Comm's kernels, and for work that
// waits on this thread).
//
//   work.note(call.stream);              // after queuing a call: an event recorded on its stream
//   work.drain("deregisterBuffer", t);   // waits for those events, touching no stream
//
// One event per stream the Comm was called on, recorded after every call: an event marks all the
// stream's work queued before it, so the newest covers the Comm's earlier calls there too. drain
// waits only on the Comm's own events, so a stream the program destroyed since is never touched.
// Calls captured into a graph record nothing (nothing of a capture runs yet; replays are the
// program's to finish). Past kMaxStreams streams, drain falls back to the whole device.
#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

class StreamWork {
 public:
  static constexpr std::size_t kMaxStreams = 64;

  StreamWork(int rank, int device) : rank_(rank), device_(device) {}
  ~StreamWork();
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

  // @pre the Comm's device is current.
  void note(cudaStream_t stream);
  // Waits until the work noted so far is done, up to `timeout`; then a TimeoutError naming this
  // rank and `what`. @pre the Comm's device is current.
  void drain(const std::string& what, std::chrono::duration<double> timeout);

 private:
  int rank_;
  int device_;
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> events_;
  bool overflow_ = false;  // called on more than kMaxStreams streams
};

}  // namespace ferry
