// The send/recv kernel: every block is one lane of one send or recv of a group (p2p.hpp says how
// lanes, chunks and the two counters work).
#include "collectives/p2p.hpp"
#include "core/cuda_check.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/timeout.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

struct Lane {
  std::uint64_t begin, bytes;  // this lane's part of the message
};

FERRY_DEVICE FERRY_INLINE Lane laneOf(std::uint64_t bytes, int lanes, int lane) {
  // Equal parts, multiples of 16 bytes, so that aligned buffers stay aligned in every lane.
  std::uint64_t per = (bytes + lanes - 1) / lanes;
  per = (per + 15) / 16 * 16;
  const std::uint64_t b = min(lane * per, bytes), e = min(b + per, bytes);
  return {b, e - b};
}

FERRY_DEVICE FERRY_INLINE void sendLane(const P2PContext& c, const P2PWork& w, int lane, const Lane& part) {
  const int slotBase = c.rank;  // this rank's rows in the receiver's inbox and counters
  std::uint64_t* total = c.sent + w.peer * kP2PLanes + lane;
  const std::uint64_t first = *total;
  const std::uint64_t chunks = (part.bytes + kP2PChunkBytes - 1) / kP2PChunkBytes;
  const std::uint64_t* acked = c.acked + w.peer * kP2PLanes + lane;
  char* inbox = c.peerInbox[w.peer];
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t g = first + i;
    if (threadIdx.x == 0 && g >= kP2PSlots)
      spinUntil([&] { return atomicLoad(acked, memory_order_acquire) + kP2PSlots >= g + 1; },
                WaitContext{c.rank, w.peer, c.timeoutNs}, "send: waiting for the receiver to free a slot", g);
    __syncthreads();
    const std::uint64_t off = i * kP2PChunkBytes, len = min(kP2PChunkBytes, part.bytes - off);
    copy(inbox + p2pSlotOffset(slotBase, lane, g % kP2PSlots), w.src + part.begin + off, len, threadIdx.x,
         blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0)
      atomicStore(c.peerArrived[w.peer] + slotBase * kP2PLanes + lane, g + 1, memory_order_release);
  }
  if (threadIdx.x == 0) *total = first + chunks;
}

FERRY_DEVICE FERRY_INLINE void recvLane(const P2PContext& c, const P2PWork& w, int lane, const Lane& part) {
  std::uint64_t* total = c.received + w.peer * kP2PLanes + lane;
  const std::uint64_t first = *total;
  const std::uint64_t chunks = (part.bytes + kP2PChunkBytes - 1) / kP2PChunkBytes;
  const std::uint64_t* arrived = c.arrived + w.peer * kP2PLanes + lane;
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t g = first + i;
    if (threadIdx.x == 0)
      spinUntil([&] { return atomicLoad(arrived, memory_order_acquire) >= g + 1; },
                WaitContext{c.rank, w.peer, c.timeoutNs}, "recv: waiting for the sender's data", g);
    __syncthreads();
    const std::uint64_t off = i * kP2PChunkBytes, len = min(kP2PChunkBytes, part.bytes - off);
    copy(w.dst + part.begin + off, c.inbox + p2pSlotOffset(w.peer, lane, g % kP2PSlots), len, threadIdx.x,
         blockDim.x);
    __syncthreads();  // every read of the slot is done before the sender may overwrite it
    if (threadIdx.x == 0)
      atomicStore(c.peerAcked[w.peer] + c.rank * kP2PLanes + lane, g + 1, memory_order_release);
  }
  if (threadIdx.x == 0) *total = first + chunks;
}

__global__ void __launch_bounds__(kP2PThreads, 2) p2pKernel(P2PContext c, P2PBatch batch) {
  int k = 0;
  while (k + 1 < batch.count && batch.work[k + 1].firstBlock <= static_cast<int>(blockIdx.x)) ++k;
  const P2PWork& w = batch.work[k];
  const int lanes = p2pLanes(w.bytes), lane = static_cast<int>(blockIdx.x) - w.firstBlock;
  const Lane part = laneOf(w.bytes, lanes, lane);
  // Every thread reads the running total before the loop's first barrier; thread 0 advances it
  // only after the loop.
  if (w.isSend)
    sendLane(c, w, lane, part);
  else
    recvLane(c, w, lane, part);
}

}  // namespace

void launchP2P(const P2PBatch& batch, const P2PContext& context, cudaStream_t stream) {
  if (batch.count == 0) return;
  p2pKernel<<<batch.blocks, kP2PThreads, 0, stream>>>(context, batch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError("rank " + std::to_string(context.rank) + ": send/recv: launching the kernel failed: " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

}  // namespace ferry
