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
// program's to finish). Past kMaxStreams streams, drain falls back to the whole device. The same
// events order a call made on another stream than the previous one after it (orderAfterLast).
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
  // The rank its messages name (a Comm across hosts names the world's, not its host's).
  void setRank(int rank) { rank_ = rank; }
  ~StreamWork();
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

  // Before queuing a call on `stream`: when the Comm's previous call went to another stream, that
  // stream's event orders this call after it. The Comm's calls share its scratch, flags and call
  // numbers, so they must run in the order they were made, as NCCL's calls on a communicator do
  // (FSDP issues all-gathers and reduce-scatters from two streams). Within one CUDA graph capture
  // the order is captured too; across the edge of a capture (eager work, then a capture) nothing is
  // added: the graph runs later, and what ran before it is the program's to finish.
  // @pre the Comm's device is current.
  void orderAfterLast(cudaStream_t stream);
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
  // The previous call: its stream, an event recorded after it, and the capture it was made in
  // (0: none). The event is one of events_, or captured_ for a call made during a capture.
  cudaStream_t last_ = nullptr;
  cudaEvent_t lastEvent_ = nullptr;
  unsigned long long lastCapture_ = 0;
  cudaEvent_t captured_ = nullptr;
};

}  // namespace ferry
