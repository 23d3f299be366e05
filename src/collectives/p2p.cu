// The send/recv kernel: every block serves one stream of a group, some of the lanes of each of its
// messages (p2p.hpp says how lanes, chunks and the two counters work).
#include "kernels/launch.hpp"
#include "collectives/p2p.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/ranges.hpp"
#include "platform/cuda_check.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/device/copy.hpp"
#include "ferry/device/packet.hpp"
#include "ferry/device/semaphore.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

// Kernel parameters: 4 KiB is what every CUDA version takes.
static_assert(sizeof(P2PContext) + sizeof(P2PBatch) <= 4096,
              "the send/recv kernel's parameters outgrow 4 KiB");

// The cell of (sender, lane, slot) in an array of message sizes.
FERRY_DEVICE FERRY_INLINE std::uint64_t sizeCell(int sender, int lane, std::uint64_t slot) {
  return (static_cast<std::uint64_t>(sender) * kP2PLanes + lane) * kP2PSlots + slot;
}

// The counters of (peer, lane) are semaphores of the channel layer (ferry/device/semaphore.hpp),
// used stamped: `arrived` carries the sender's "chunk g is in its slot" as g + 1, `acked` the
// receiver's "chunk g's slot is free again" as g + 1. own: this rank's inbound words
// ([sender][lane]); peers: each peer's, mapped here.
FERRY_DEVICE FERRY_INLINE SemaphoreDeviceHandle laneSemaphore(const P2PContext& c, std::uint64_t* own,
                                                              std::uint64_t* const* peers, int peer, int lane) {
  SemaphoreDeviceHandle s;
  s.inbound = own + peer * kP2PLanes + lane;
  s.remoteInbound = peers[peer] + c.rank * kP2PLanes + lane;
  s.wait_ = WaitContext{c.rank, peer, c.timeoutNs, c.abortFlag};
  return s;
}

// The packet slot of chunk g of (sender, lane) in an inbox (p2p.hpp: packets have slots of their own).
FERRY_DEVICE FERRY_INLINE std::uint64_t packetSlot(const P2PContext& c, int sender, int lane, std::uint64_t g) {
  return p2pPacketSlotOffset(c.nranks, sender, lane, g % kP2PPacketSlots);
}

FERRY_DEVICE FERRY_INLINE bool aborted(const WaitContext& wait) {
  return wait.abortFlag != nullptr && *static_cast<const volatile std::uint32_t*>(wait.abortFlag) != 0;
}

// One message's lane: chunks through the ring of slots, continuing the running total of
// (peer, lane). Every thread reads the total before the first barrier of the loop; thread 0
// advances it only after the last.
FERRY_DEVICE FERRY_INLINE void sendLane(const P2PContext& c, int peer, const char* src, std::uint64_t bytes,
                                        int lane, const Range& part) {
  std::uint64_t* total = c.sent + peer * kP2PLanes + lane;
  const std::uint64_t first = *total;
  const std::uint64_t chunk = p2pChunkBytes(part.size());
  const std::uint64_t chunks = (part.size() + chunk - 1) / chunk;
  const SemaphoreDeviceHandle data = laneSemaphore(c, c.arrived, c.peerArrived, peer, lane);
  const SemaphoreDeviceHandle freed = laneSemaphore(c, c.acked, c.peerAcked, peer, lane);
  char* inbox = c.peerInbox[peer];
  if (p2pPackets(bytes)) {
    // One chunk of packets: word w of the part in packet w + 1, the message's size in packet 0 (for
    // the receiver's check). No `arrived` signal: the packets are it.
    const std::uint64_t g = first;
    if (threadIdx.x == 0 && g >= kP2PPacketSlots)
      freed.waitAt(g + 1 - kP2PPacketSlots, "send: waiting for the receiver to free a slot");
    __syncthreads();
    auto* packets = reinterpret_cast<LL16Packet*>(inbox + packetSlot(c, c.rank, lane, g));
    const auto flag = static_cast<std::uint32_t>(g + 1);
    if (threadIdx.x == 0) packets[0].write(bytes, flag);
    const std::uint64_t words = (part.size() + 7) / 8;
    for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x)
      packets[1 + w].write(loadWord(src + part.begin, w, part.size()), flag);
    if (threadIdx.x == 0) *total = first + 1;
    return;
  }
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t g = first + i;
    if (threadIdx.x == 0 && g >= kP2PSlots)
      freed.waitAt(g + 1 - kP2PSlots, "send: waiting for the receiver to free a slot");
    __syncthreads();
    const std::uint64_t off = i * chunk, len = min(chunk, part.size() - off);
    copy(inbox + p2pSlotOffset(c.rank, lane, g % kP2PSlots), src + part.begin + off, len, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
      c.peerSizes[peer][sizeCell(c.rank, lane, g % kP2PSlots)] = bytes;  // released with `arrived`
      data.signalAt(g + 1);
    }
  }
  if (threadIdx.x == 0) *total = first + chunks;
}

// A recv whose sender's message has another size: the lanes of the two sides no longer match,
// so going on would deliver wrong bytes or wait for chunks that never come.
FERRY_DEVICE void reportSizeMismatch(const P2PContext& c, int peer, std::uint64_t bytes,
                                     std::uint64_t theirs) {
  printf(
      "ferry: rank %d: recv from rank %d: this recv is %llu bytes, but rank %d sent %llu; every send must "
      "have the count and data type of its recv (sends and recvs between two ranks pair up in the order "
      "they were issued)\n",
      c.rank, peer, static_cast<unsigned long long>(bytes), peer, static_cast<unsigned long long>(theirs));
  __trap();
}

FERRY_DEVICE FERRY_INLINE void recvLane(const P2PContext& c, int peer, char* dst, std::uint64_t bytes,
                                        int lane, const Range& part) {
  std::uint64_t* total = c.received + peer * kP2PLanes + lane;
  const std::uint64_t first = *total;
  const std::uint64_t chunk = p2pChunkBytes(part.size());
  const std::uint64_t chunks = (part.size() + chunk - 1) / chunk;
  const SemaphoreDeviceHandle data = laneSemaphore(c, c.arrived, c.peerArrived, peer, lane);
  const SemaphoreDeviceHandle freed = laneSemaphore(c, c.acked, c.peerAcked, peer, lane);
  if (p2pPackets(bytes)) {
    // Packet 0 holds the sender's size. A sender whose message is too large for packets signals
    // `arrived` instead, with its size beside the slot: thread 0 watches for both.
    const std::uint64_t g = first;
    const auto* packets = reinterpret_cast<const LL16Packet*>(c.inbox + packetSlot(c, peer, lane, g));
    const auto flag = static_cast<std::uint32_t>(g + 1);
    const WaitContext wait = data.wait_;
    if (threadIdx.x == 0) {
      std::uint64_t theirs = 0;
      bool raw = false;
      spinUntil(
          [&] {
            if (packets[0].tryRead(flag, theirs)) return true;
            if (data.inboundValue() < g + 1) return false;
            // `arrived` passed g: chunk g was raw, or packets that a later raw chunk's signal (a
            // release, after them) has made visible by now.
            raw = !packets[0].tryRead(flag, theirs);
            return true;
          },
          wait, "recv: waiting for the sender's packets", g + 1);
      if (raw) theirs = c.sizes[sizeCell(peer, lane, g % kP2PSlots)];
      if (theirs != bytes && !aborted(wait)) reportSizeMismatch(c, peer, bytes, theirs);
    }
    const std::uint64_t words = (part.size() + 7) / 8;
    for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x) {
      std::uint64_t v = 0;
      spinUntil([&] { return packets[1 + w].tryRead(flag, v); }, wait, "recv: waiting for the sender's packets",
                g + 1);
      storeWord(dst + part.begin, w, part.size(), v);
    }
    __syncthreads();  // every packet is read (its data stored) before the sender may overwrite the slot
    if (threadIdx.x == 0) {
      freed.relaxedSignalAt(g + 1);
      *total = first + 1;
    }
    return;
  }
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t g = first + i;
    // (The wait also returns on an abort, with nothing arrived: then there is nothing to compare.)
    // A sender whose message is small enough for packets sends them instead of signalling: the
    // first chunk's wait also watches its size packet.
    if (threadIdx.x == 0) {
      const auto* sizePacket = reinterpret_cast<const LL16Packet*>(c.inbox + packetSlot(c, peer, lane, g));
      std::uint64_t theirs = 0;
      bool packets = false;
      spinUntil(
          [&] {
            return data.inboundValue() >= g + 1 ||
                   (i == 0 && lane < kP2PPacketLanes &&
                    (packets = sizePacket->tryRead(static_cast<std::uint32_t>(g + 1), theirs)));
          },
          data.wait_, "recv: waiting for the sender's data", g + 1);
      // `arrived` past g does not make chunk g raw: a packet chunk g followed by a raw g + 1 (a
      // small send, then a large one, for this large recv) passes it too, and sizes[] then holds
      // an older chunk's size. Its packets came before g + 1's release, which the acquire above
      // saw, so the size packet tells.
      if (!packets && i == 0 && lane < kP2PPacketLanes && !aborted(data.wait_))
        packets = sizePacket->tryRead(static_cast<std::uint32_t>(g + 1), theirs);
      if (!packets && !aborted(data.wait_)) theirs = c.sizes[sizeCell(peer, lane, g % kP2PSlots)];
      if ((packets || !aborted(data.wait_)) && theirs != bytes) reportSizeMismatch(c, peer, bytes, theirs);
    }
    __syncthreads();
    const std::uint64_t off = i * chunk, len = min(chunk, part.size() - off);
    copy(dst + part.begin + off, c.inbox + p2pSlotOffset(peer, lane, g % kP2PSlots), len, threadIdx.x, blockDim.x);
    // Every read of the slot is done before the sender may overwrite it: each thread stored what it
    // read before the barrier, so its loads had returned. The signal orders nothing else, so it is
    // relaxed; a release would hold every recv kernel up by a system-scope fence at its end.
    __syncthreads();
    if (threadIdx.x == 0) freed.relaxedSignalAt(g + 1);
  }
  if (threadIdx.x == 0) *total = first + chunks;
}

__global__ void __launch_bounds__(kP2PThreads, 2) p2pKernel(P2PContext c, P2PBatch batch) {
  // Before the first access to memory: the running totals and the buffers are the previous
  // kernel's to write until it ends (device_context.hpp). Every block of this kernel is resident by
  // the time the next one's blocks take SMs, so a send waiting for a recv of the group still runs.
  awaitPreviousKernel();
  // (Block 0's thread 0 reads the count the kernel before it wrote, with a strong load: an L1 line
  // an earlier kernel left could be stale under early launch. stampPhase ignores the others.)
  const std::uint64_t m =
      c.stamps != nullptr && blockIdx.x == 0 && threadIdx.x == 0
          ? atomicLoad<std::uint64_t, cuda::thread_scope_device>(c.kernelsRun, memory_order_relaxed) + 1
          : 0;
  stampPhase(c.stamps, m, kEntered, kPhaseSendRecv, batch.messages > 0 ? batch.message[0].bytes : 0);
  stampPhase(c.stamps, m, kAnnounced);  // (no start handshake: the lanes' own flags)
  int k = 0;
  while (k + 1 < batch.streams && batch.stream[k + 1].firstBlock <= static_cast<int>(blockIdx.x)) ++k;
  const P2PStream& s = batch.stream[k];
  const int block = static_cast<int>(blockIdx.x) - s.firstBlock;
  for (int i = 0; i < s.messages; ++i) {
    const P2PMessage& msg = batch.message[s.firstMessage + i];
    const int lanes = p2pLanes(msg.bytes);
    // A lane this message does not have leaves that lane's total where it is.
    for (int lane = block; lane < lanes; lane += s.blocks) {
      // Equal parts in 16-byte grains, so that aligned buffers stay aligned in every lane.
      const Range part = splitRange(msg.bytes, lanes, lane, 16);
      switch (s.kind) {
        case P2PKind::Send: sendLane(c, s.peer, msg.buffer, msg.bytes, lane, part); break;
        case P2PKind::Recv: recvLane(c, s.peer, msg.buffer, msg.bytes, lane, part); break;
        case P2PKind::Copy:
          copy(msg.buffer + part.begin, msg.source + part.begin, part.size(), threadIdx.x, blockDim.x);
          break;
      }
      __syncthreads();  // thread 0's new total is what every thread reads for the next lane
    }
  }
  if (c.stamps != nullptr) {  // (a kernel parameter: every thread takes the same branch)
    __syncthreads();
    stampPhase(c.stamps, m, kDataDone);
    if (blockIdx.x == 0 && threadIdx.x == 0)
      atomicStore<std::uint64_t, cuda::thread_scope_device>(c.kernelsRun, m, memory_order_relaxed);
    stampPhase(c.stamps, m, kExited);
  }
}

}  // namespace

int p2pResidentBlocks() {
  int device = 0, sms = 0, perSm = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FERRY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, p2pKernel, kP2PThreads, 0));
  return sms * perSm;
}

void preloadP2P() { preloadKernel(p2pKernel); }

void launchP2P(const P2PBatch& batch, const P2PContext& context, cudaStream_t stream, bool early) {
  if (batch.streams == 0) return;
  // Early only where the launch is a visible part of the call: messages of up to kP2PEarlyBytes.
  std::uint64_t largest = 0;
  for (int i = 0; i < batch.messages; ++i) largest = std::max(largest, batch.message[i].bytes);
  early = early && largest <= kP2PEarlyBytes;
  launchMaybeEarly(early, p2pKernel, static_cast<unsigned>(batch.blocks), kP2PThreads, stream, context, batch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError("rank " + std::to_string(context.rank) + ": send/recv: launching the kernel failed: " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

}  // namespace ferry
