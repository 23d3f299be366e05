#pragma once
// What the pipelined fused ops keep per ferry group (fused_pipeline.cpp): the group's symmetric
// workspace, the copy stream of each peer step, and the order of the calls.
//
//   auto ws = workspace.begin(comm, bytes, stream, who);  // grows collectively; orders the call
//   ... kernels on ws, side streams from workspace.side(step), joined back to `stream` ...
//   workspace.end(stream);
//
// The calls share the workspace's slots and signal pads, so they must run in the order they were
// made, as the Comm's own calls do (StreamWork, src/comm/stream_work.hpp): an eager call made on
// another stream than the previous eager call waits (an event, no host wait) for that call's end,
// whatever was captured between them; within one CUDA graph capture the order is captured too.
// Across the edge of a capture nothing is added: a graph runs when replayed, and what ran before
// it is the program's to finish.
// An outgrown workspace is not freed: a graph captured earlier still writes it, and freeing it
// would wait for the whole GPU (other groups' kernels included) while the ranks meet.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/communicator.hpp"
#include "ferry/symmetric_memory.hpp"

namespace ferry::torch_backend {

class FusedWorkspace {
 public:
  explicit FusedWorkspace(int device) : device_(device) {}
  // After the handles (their destructors wait for this GPU's work), the side streams.
  ~FusedWorkspace();
  FusedWorkspace(const FusedWorkspace&) = delete;
  FusedWorkspace& operator=(const FusedWorkspace&) = delete;

  // Begins a call on `stream`: symmetric memory of at least `bytes` on every rank of `comm`'s group.
  // Collective when it grows (every rank asks for the same size at the same call: the ops' shapes
  // agree), which is refused inside a CUDA graph capture with an error naming `who`. The handle
  // keeps its memory too: it stays valid for the call whatever later calls grow.
  // @pre the group's device is current; its ranks share a host.
  std::shared_ptr<const SymmetricMemory> begin(Communicator& comm, std::size_t bytes, cudaStream_t stream,
                                               const std::string& who);
  // Ends the call begun on `stream`, once its side streams are joined back to it.
  void end(cudaStream_t stream);
  // Makes every wait of the pipelined calls of every rank of the group give up (SymmetricMemory::abort
  // on each workspace, the outgrown ones included, each tried): the group's abort, while kernels
  // may wait. Throws the first failure after trying them all.
  void abort();
  // The copy stream of peer step `step` (1 to n - 1): its own stream, so that the copies to
  // different peers run side by side, and this group's own (not torch's pool, which other groups
  // draw from), so that no other group's work or capture shares it. At the device's highest
  // priority: a copy queued beside a matmul gets its SMs first (SM copies, fused_pipeline.cpp).
  // Never destroyed: torch's allocator keeps the streams its blocks were used on (recordStream)
  // and records events on them when the blocks are freed, which may be after the group is gone.
  c10::cuda::CUDAStream side(int step);

 private:
  int device_;
  std::mutex mu_;
  // A workspace: its memory, then the rendezvous on it (destroyed first: it waits for the GPU).
  struct Held {
    std::shared_ptr<void> memory;
    std::shared_ptr<const SymmetricMemory> handle;
  };
  std::shared_ptr<Held> current_;
  std::vector<std::shared_ptr<Held>> retired_;
  std::vector<cudaStream_t> sides_;
  // The previous eager call and the previous captured one: their streams, the capture's id, and an
  // event recorded after each.
  cudaStream_t lastEager_ = nullptr;
  cudaEvent_t eager_ = nullptr;
  cudaStream_t lastCaptured_ = nullptr;
  unsigned long long lastCapture_ = 0;
  cudaEvent_t captured_ = nullptr;
};

}  // namespace ferry::torch_backend
