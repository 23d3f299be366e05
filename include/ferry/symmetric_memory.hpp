#pragma once
// SymmetricMemory: a buffer of the same size on every rank of a Communicator, each mapped into every
// rank's process, plus a signal pad per rank for synchronising from the GPU. It is what
// torch.distributed._symmetric_memory calls a symmetric memory handle; ferry.torch.symm builds on
// it (docs/symmetric_memory.md).
//
// rendezvous() is collective over every rank of the communicator's bootstrap, in the same order on
// each. Each rank passes its own buffer: device memory from gpuAlloc (or a part of such an
// allocation), or cudaMalloc memory; the caller keeps it alive, the handle keeps it registered and
// mapped. Every rank must pass the same size and signal-pad size: a mismatch is Error(InvalidUsage)
// naming both ranks, on every rank.
//
// Signal pads: signalPadBytes / 4 uint32 slots per rank, zero at first. Slot
// [channel * worldSize + src] of rank dst is "src signalled dst on channel":
//   putSignal(dst, channel)  waits until that slot on dst is 0, then sets it to 1, with release
//                            order: what this stream wrote before (into any rank's buffer) is
//                            visible to dst once its waitSignal returns;
//   waitSignal(src, channel) waits until this rank's slot for src is 1, then sets it back to 0
//                            (acquire);
//   barrier(channel)         putSignal to every other rank, then waitSignal from every other rank.
// put(dst, offset, src, bytes, blocks) copies into rank dst's buffer on a stream: by the copy
// engines (blocks = 0), which leave the SMs to other kernels, or by that many thread blocks of SM
// stores, which take only those SMs and, with a few dozen, reach NVLink's rate where one copy
// engine between two GPUs may not. A putSignal after it on the same stream says the bytes landed.
// Each is a one-block kernel on `stream` (it can be captured into a CUDA graph). Two operations on
// one channel between the same pair must not run at once (one channel per concurrent stream).
// A wait gives up after `timeout` (zero: FERRY_DEVICE_TIMEOUT), prints who waited for whom on which
// channel, and traps: the host sees cudaErrorLaunchFailure at its next synchronisation. abort()
// (a peer is gone, the job is ending) makes every wait of every rank's handle of this rendezvous
// give up at once instead, without a report, leaving the stream and the CUDA context usable; the
// handle's buffers then hold whatever was written, and later signals return at once.
//
//   auto buf = ferry::gpuAlloc(bytes);
//   auto symm = ferry::SymmetricMemory::rendezvous(comm, buf.get(), bytes);
//   myKernel<<<g, b, 0, stream>>>(symm->bufferPtrsDevice(), ...);  // writes peers' buffers
//   symm->barrier(0, {}, stream);                                   // then all ranks see them
// Wrong: reading a peer's buffer right after rendezvous without a barrier: rendezvous does not
// order the GPU work of the ranks.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/communicator.hpp"

namespace ferry {

class FERRY_API SymmetricMemory {
 public:
  // PyTorch's default signal pad size.
  static constexpr std::size_t kDefaultSignalPadBytes = 2048;

  // @pre a current CUDA device, the one that holds `buffer`; bytes > 0; signalPadBytes a positive
  //      multiple of 4 that holds at least one channel (4 * worldSize bytes).
  // @post bufferPtrs()[r] is rank r's buffer mapped in this process (this rank's: `buffer`).
  static std::shared_ptr<SymmetricMemory> rendezvous(Communicator& comm, void* buffer, std::size_t bytes,
                                                     std::size_t signalPadBytes = kDefaultSignalPadBytes,
                                                     int tag = 0);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  int rank() const noexcept;
  int worldSize() const noexcept;
  std::size_t bufferBytes() const noexcept;
  std::size_t signalPadBytes() const noexcept;
  // The channels a signal pad holds: signalPadBytes / (4 * worldSize).
  int channels() const noexcept;
  const std::vector<void*>& bufferPtrs() const noexcept;
  const std::vector<std::uint32_t*>& signalPadPtrs() const noexcept;
  // The same pointers in device memory, for kernels.
  void* const* bufferPtrsDevice() const noexcept;
  std::uint32_t* const* signalPadPtrsDevice() const noexcept;

  void putSignal(int dstRank, int channel, std::chrono::duration<double> timeout, cudaStream_t stream) const;
  void waitSignal(int srcRank, int channel, std::chrono::duration<double> timeout, cudaStream_t stream) const;
  void barrier(int channel, std::chrono::duration<double> timeout, cudaStream_t stream) const;
  // Raises the abort word of every rank of this rendezvous (through the mappings: from one rank is
  // enough), on a stream of its own, and returns once it is written: every signal wait of every
  // rank's handle gives up. For a host thread while kernels wait (PyTorch's abort of a group).
  void abort() const;
  // Copies `bytes` from `src` (memory this GPU can read: its own, or a peer's mapped here) into rank
  // dstRank's buffer from byte dstOffset, on `stream`: blocks = 0 by the copy engines
  // (cudaMemcpyAsync), blocks in [1, 1024] by that many thread blocks of 512 threads.
  // @throws Error(InvalidUsage) naming this rank: dstRank outside the group, a range past the
  //         buffer's end, blocks outside [0, 1024].
  void put(int dstRank, std::size_t dstOffset, const void* src, std::size_t bytes, int blocks,
           cudaStream_t stream) const;

  struct Impl;

 private:
  explicit SymmetricMemory(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
