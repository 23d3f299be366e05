#pragma once
// One collective call as the algorithms see it, and the argument checks every call goes through
// before anything is queued.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/comm.hpp"
#include "ferry/datatype.hpp"

namespace ferry {

struct CollectiveCall {
  Collective collective = Collective::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  // The API's count: per rank for allGather (sendCount) and reduceScatter (recvCount), per peer
  // for allToAll, the whole buffer for allReduce and broadcast.
  std::size_t count = 0;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  cudaStream_t stream = nullptr;
  int rank = 0;
  int worldSize = 1;
  // Registrations (Comm::registerBuffer) holding the buffers; id 0: not registered.
  std::uint64_t sendId = 0, sendOffset = 0, recvId = 0, recvOffset = 0;
  // Run as if nothing were registered, whatever the registry holds: for a call whose ranks could
  // see their buffers differently (a phase of a Comm across hosts that gives one rank a buffer of
  // the Comm's own), since every rank of a call must choose alike.
  bool unregistered = false;
  // How a sum of 16- and 8-bit floats accumulates (ferry/datatype.hpp).
  Accumulation accumulation = Accumulation::Stepwise;

  std::size_t elementBytes() const { return sizeOf(type); }
  // The collective has a root (broadcast, reduce).
  bool rooted() const { return collective == Collective::Broadcast || collective == Collective::Reduce; }
  // This rank uses its send buffer (every collective but a broadcast off the root).
  bool usesSend() const { return collective != Collective::Broadcast || rank == root; }
  // This rank uses its recv buffer (every collective but a reduce off the root).
  bool usesRecv() const { return collective != Collective::Reduce || rank == root; }
  // Every buffer this rank uses is registered: what the direct (zero-copy) algorithms need.
  bool registered() const { return (!usesRecv() || recvId != 0) && (!usesSend() || sendId != 0); }
  // Elements of the send and recv buffers.
  std::size_t sendElements() const;
  std::size_t recvElements() const;
  // The larger of the two buffers, in bytes: what the selector goes by.
  std::size_t bytes() const;
  bool inPlace() const;
  bool reduces() const {
    return collective == Collective::AllReduce || collective == Collective::ReduceScatter ||
           collective == Collective::Reduce;
  }
  // The call asks for float32 accumulation where that changes its result: a sum or average of
  // 16- or 8-bit floats (kWideSum). Only algorithms that say so run it (Algorithm::sumsInFloat32).
  bool sumsInFloat32() const;
};

// Error(InvalidUsage) naming the rank, the collective and the argument for: a null buffer where
// one is needed, a count whose byte size overflows, a type outside the enum, an op outside the enum
// (checked only for the collectives that reduce), a root out of range (broadcast, reduce), buffers not
// aligned to the element size, send and recv that overlap other than in place, and a pointer that is not
// device memory of `device` (when device >= 0 and the stream is not being captured; the check asks CUDA).
void validateCall(const CollectiveCall& call, int device);

// Error(InvalidUsage) for a PreMulSum op of `call`: a null factor, a factor on the host that is
// device memory, or one said to be on the device that is not memory of `device` (asked of CUDA
// as validateCall does, so not while the stream is being captured).
void validatePreMul(const CollectiveCall& call, const PreMulSum& op, int device);

// "rank 2: allReduce" — the prefix of every message about a call.
std::string describe(const CollectiveCall& call);

// One send or recv as Comm::send and Comm::recv take it.
struct PeerCall {
  bool isSend = true;
  const void* buffer = nullptr;
  std::size_t count = 0;
  DataType type = DataType::Float32;
  int peer = 0;
  cudaStream_t stream = nullptr;
  int rank = 0;
  int worldSize = 1;
  std::size_t bytes() const { return count * sizeOf(type); }
};

// Error(InvalidUsage) naming the rank, the operation, the peer and the argument for: a type
// outside the enum, a peer out of range, a byte size that overflows, a null or misaligned buffer,
// and (as validateCall) a buffer that is not device memory of `device`.
void validatePeerCall(const PeerCall& call, int device);

// "rank 2: send to rank 3" / "rank 3: recv from rank 2".
std::string describe(const PeerCall& call);

}  // namespace ferry
