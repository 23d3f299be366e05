#pragma once
// ferry as a torch.distributed backend: c10d::Backend on ferry::Comm (docs/pytorch.md). Built only
// where torch is installed, against that torch, as the module ferry._torch; python/ferry/torch
// registers it as the backend "ferry".
//
// Streams, as ProcessGroupNCCL: a synchronous op (asyncOp false) runs on the caller's current
// stream. An async op runs on the backend's stream after that stream waits (an event, no host
// sync) for the current one; its tensors are marked in use on the backend's stream, so the caching
// allocator does not hand their memory out before the op is done, and Work::wait() makes the
// current stream wait for the op's end. Sends and receives, and every op of a coalescing block, run
// on the backend's stream (one ferry group shares one stream). Nothing blocks the host but a
// barrier's wait(), so every op but the barrier can be captured in a CUDA graph.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/symmetric_memory.hpp"
#include "fused_workspace.hpp"
#include "tensors.hpp"
#include "work.hpp"

namespace ferry::torch_backend {

class FerryBackend : public c10d::Backend {
 public:
  // Joins the ranks of a UniqueId (in hex: ferry.UniqueId.hex()) and makes the Comm on `device`.
  FerryBackend(const std::string& idHex, int rank, int size, int device, std::chrono::milliseconds timeout);
  // A group split off another: its bootstrap, on the parent's device.
  // Where a Comm cannot hold the ranks (they span hosts: Comm::whyNot), no Comm is made and
  // whyNotNative() says why: python/ferry/torch then hands the group to NCCL.
  FerryBackend(std::shared_ptr<TcpBootstrap> bootstrap, int device, std::chrono::milliseconds timeout);
  ~FerryBackend() override;

  const std::string getBackendName() const override { return "ferry"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Empty when the group runs on ferry; otherwise why it cannot (its ops are then errors).
  const std::string& whyNotNative() const { return whyNotNative_; }
  bool supportsCoalescing() const override { return true; }
  // Ops queued on this group so far (torch compares them across ranks to find desynchronized
  // groups): every group starts at 0 on every rank, so there is nothing to agree on at the start.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }
  bool supportsSplitting() const override { return true; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Between start and end, every op joins one ferry group: sends and receives (batch_isend_irecv)
  // progress together in one kernel; collectives are queued at once, in order.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Collective over this group's ranks (all of them call it, in the same order as their other
  // splits): the ranks of `ranks` (this group's ranks) form a new ferry group; the others get null.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // Collective over this group's ranks, outside graph capture (docs/pytorch.md, "Registered
  // tensors"): registers the storage of `tensor` (this group's GPU) with the group's Comm, so that
  // ops whose tensors lie inside registrations on every rank run zero-copy. Every rank registers
  // its tensor of the same role, in the same order. Returns the id deregisterTensor takes.
  int64_t registerTensor(const at::Tensor& tensor);
  // Local: waits for this group's queued work, then forgets the registration. Deregister on every
  // rank before the next op that used it.
  void deregisterTensor(int64_t id);

  // The fused ops' reduce-scatter (fused_ops.cpp): `output` = the sum (or, with `average`, the
  // mean) over ranks of block `rank` of `input` (world_size blocks), 16- and 8-bit floats added
  // in float32 and rounded once (Accumulation::Float32), as the ops' contract says; synchronous,
  // on the caller's stream. Only where the group's ranks share a host (sumsInFloat32Here): a Comm
  // across hosts sums partial sums.
  void reduceScatterInFloat32(at::Tensor& input, at::Tensor& output, bool average, const char* name);
  bool sumsInFloat32Here() const { return bootstrap_ != nullptr && bootstrap_->numNodes() == 1; }

  // The pipelined fused ops' workspace (fused_pipeline.cpp, fused_workspace.hpp): beginFused starts
  // a call on `stream` with symmetric memory of at least `bytes` on every rank of the group
  // (collective when it grows), endFused ends it, fusedSide(step) is peer step `step`'s copy stream.
  // Only where the group's ranks share a host (sumsInFloat32Here: symmetric memory maps peers over
  // CUDA IPC).
  std::shared_ptr<const SymmetricMemory> beginFused(std::size_t bytes, cudaStream_t stream, const char* name);
  void endFused(cudaStream_t stream);
  c10::cuda::CUDAStream fusedSide(int step);
  int device() const { return device_; }

  // abort: stops the Comm on every rank at once (its kernels give up their waits; no hang), then
  // frees it. shutdown: waits for this group's work, then frees the Comm. Later ops are errors.
  void abort() override;
  void shutdown() override;

 private:
  // How an op runs: on the caller's stream (Sync), on the backend's after it (Async), or as Async
  // with a wait() that blocks the host (Barrier).
  enum class Mode { Sync, Async, Barrier };
  static Mode modeOf(bool asyncOp) { return asyncOp ? Mode::Async : Mode::Sync; }

  // Queues one op: picks its stream, runs body (which queues ferry calls on stream()), marks the
  // tensors in use there and returns its Work. A ferry::Error becomes a DistBackendError.
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, const char* name, std::vector<at::Tensor>& inputs,
                                     std::vector<at::Tensor>& outputs, Mode mode, const std::function<void()>& body);
  Comm& comm(const char* name);
  cudaStream_t stream() const { return opStream_; }
  void check(const at::Tensor& t, const char* op) const { checkTensor(t, device_, op); }
  void keep(const at::Tensor& t) { kept_.push_back(t); }
  // The ops of several public calls.
  void reduceInto(at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op, const char* name, int root);
  void reduceScatterInto(at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op, const char* name);
  void allGatherInto(at::Tensor& input, at::Tensor& output, const char* name);
  // Send and receive lists as one ferry group (a partner -1 or an empty tensor is skipped).
  void exchange(const std::vector<std::pair<at::Tensor, int>>& sends, const std::vector<std::pair<at::Tensor, int>>& recvs,
                const char* name);

  int device_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<TcpBootstrap> bootstrap_;  // kept for split
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<FusedWorkspace> fused_;  // made at the first pipelined call; goes before comm_
  std::string gone_;  // why comm_ is null: "aborted", "shut down", or whyNotNative_
  std::string whyNotNative_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent ready_;        // re-recorded by every async op: no event made per op
  cudaStream_t opStream_ = nullptr;  // the stream of the op being queued
  std::vector<at::Tensor> kept_;     // temporaries of the op being queued
  int coalescing_ = 0;
  uint64_t sequence_ = 0;
  // The works of the open coalescing block: their end is recorded after its group is queued.
  std::vector<c10::intrusive_ptr<FerryWork>> pending_;
  std::map<int64_t, BufferRegistration> registrations_;  // registerTensor's, by the id it returned
  int64_t nextRegistration_ = 1;
  // Ops may come from several threads (DDP queues its all-reduces from autograd's); a Comm queues
  // one call at a time.
  std::recursive_mutex mu_;
};

}  // namespace ferry::torch_backend
