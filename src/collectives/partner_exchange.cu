// The partners' exchange over PortChannels (partner_exchange.hpp): one block, whose thread 0
// drives the channels while all its threads reduce or copy.
#include "collectives/partner_exchange.hpp"

#include <algorithm>
#include <string>

#include "ferry/errors.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/reduce_ops.hpp"

namespace ferry {
namespace {

FERRY_DEVICE FERRY_INLINE bool has(std::uint32_t mask, int host) { return (mask >> host & 1u) != 0; }

// Tells the proxy whose partner the kernel waits for (PartnerChannels::waitingOn, or waitingOnAcks
// for acknowledgement waits where given); 0: nobody.
FERRY_DEVICE FERRY_INLINE void waitingOn(const PartnerChannels* channels, std::uint32_t hosts, bool forAcks = false) {
  std::uint32_t* word = forAcks && channels->waitingOnAcks != nullptr ? channels->waitingOnAcks : channels->waitingOn;
  if (word != nullptr) *static_cast<volatile std::uint32_t*>(word) = hosts;
}

// A put with signal into partner p's scratch, and a signal alone; each returns its FIFO slot, for
// the FIFO's sync (PortChannelDeviceHandle's putWithSignal and signal keep it to themselves). A
// part is at most a slot, far below the 1 GiB a trigger pair carries: one pair.
FERRY_DEVICE FERRY_INLINE std::uint64_t putPart(PortChannelDeviceHandle& channel, MemoryId scratch,
                                                std::uint64_t dstOffset, const char* src, std::uint64_t bytes,
                                                std::uint32_t kinds = PortRequest::Put | PortRequest::Signal) {
  const PortPutRequest r{kinds, channel.channel, scratch, kLocalPointer, dstOffset,
                         reinterpret_cast<std::uint64_t>(src), bytes};
  ProxyTrigger first, second;
  r.encode(first, second);
  return channel.fifo.pushPair(first, second);
}
FERRY_DEVICE FERRY_INLINE std::uint64_t signalOnly(PortChannelDeviceHandle& channel) {
  const PortRequest r{PortRequest::Signal, channel.channel, 0, 0, 0};
  return channel.fifo.push(r.encode());
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) partnerExchange(const PartnerChannels* channels, PartnerExchange x) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const int me = channels->host, hosts = channels->hosts;
  const std::uint64_t slotBytes = channels->slotBytes;
  const std::uint64_t slotElements = slotBytes / sizeof(T);
  // The digests' cells after the slots: a host's cell holds the digest it put with its first part
  // (bytes 0-7) and the one it put with its first acknowledgement (8-15); this rank keeps what it
  // puts in the same halves of its own cell, whence the proxy reads them (apart, because a link of
  // send/recv across hosts runs a send's kernel and a recv's at once: p2p_across_hosts.cpp).
  char* const cells = channels->scratch + static_cast<std::uint64_t>(hosts) * slotBytes;
  const std::uint64_t myCell = static_cast<std::uint64_t>(me) * kDigestBytes;
  const auto cellOf = [&](int p, std::uint64_t half) {
    const char* cell = cells + static_cast<std::uint64_t>(p) * kDigestBytes + half;
    return *reinterpret_cast<volatile const std::uint64_t*>(cell);
  };
  std::uint32_t mismatch = 0;  // (thread 0's) 1 + the first partner whose digest differed
  for (std::uint64_t first = 0; first < x.count; first += slotElements) {
    const std::uint64_t n = x.count - first < slotElements ? x.count - first : slotElements;
    const std::uint64_t at = first * sizeof(T), bytes = n * sizeof(T);
    if (tid == 0) {
      // Copies of the handles: their methods keep no state of their own, the FIFO is in memory.
      PortChannelDeviceHandle data[kMaxHosts];
      for (int p = 0; p < hosts; ++p) data[p] = channels->data[p];
      // The proxy reads the source after the puts are queued: a reduce below may overwrite it
      // (allreduce's own part is its result) only once the proxy has read it. An Ethernet
      // connection's write has read its source when it returns (into the socket or its page-locked
      // buffers), so the proxy having handled the last put (the FIFO's sync, here, with no round
      // trip to the partner as a flush takes) is enough; the FIFO is the partners' one, in order.
      std::uint64_t last = 0;
      int via = -1;
      // The digest first, from this rank's own cell (read by the proxy before the syncs below).
      if (first == 0) {
        if (x.sendTo != 0) *reinterpret_cast<volatile std::uint64_t*>(cells + myCell) = x.digest;
        if (x.recvFrom != 0) *reinterpret_cast<volatile std::uint64_t*>(cells + myCell + kDigestBytes / 2) = x.digest;
        __threadfence_system();
      }
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p)) {
          if (first == 0)
            putPart(data[p], channels->scratchOf[p], static_cast<std::uint64_t>(hosts) * slotBytes + myCell,
                    cells + myCell, sizeof(std::uint64_t), PortRequest::Put);
          last = putPart(data[p], channels->scratchOf[p], static_cast<std::uint64_t>(me) * slotBytes,
                         x.src + x.srcOffset[p] + at, bytes);
          via = p;
        }
      if (via >= 0) data[via].fifo.sync(last);
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) {
          waitingOn(channels, 1u << p);
          data[p].wait();  // partner p's part is in slot p of this scratch (its digest before it)
          if (first == 0 && mismatch == 0 && cellOf(p, 0) != x.digest) mismatch = static_cast<std::uint32_t>(p) + 1;
        }
      waitingOn(channels, 0);
    }
    __syncthreads();
    if (x.reduce && x.recvFrom != 0) {
      const char* src[kMaxHosts];
      int nsrc = 0;
      for (int h = 0; h < hosts; ++h) {  // in host order, so every host rounds alike
        if (h == me)
          src[nsrc++] = x.src + x.srcOffset[me] + at;
        else if (has(x.recvFrom, h))
          src[nsrc++] = channels->scratch + static_cast<std::uint64_t>(h) * slotBytes;
      }
      char* dst[1] = {x.dst + at};
      reduceSources<T, Op>(dst, 1, src, nsrc, x.divisor, n, tid, nt);
    } else if (!x.reduce) {
      for (int h = 0; h < hosts; ++h) {
        if (h == me || !has(x.recvFrom, h)) continue;
        char* dst[1] = {x.dst + x.dstOffset[h] + at};
        copyToMany(dst, 1, channels->scratch + static_cast<std::uint64_t>(h) * slotBytes, bytes, tid, nt);
      }
    }
    __syncthreads();
    if (tid == 0) {
      // Every slot received is read (the block's loads are done: their values are stored): free
      // them, and wait until this rank's slots in the receivers' scratch are free for the next round
      // or call. The acks are synced too: the proxy stops without serving what is left in its FIFO,
      // so an ack still queued when this rank is done and tears down would leave its partner
      // waiting; one the proxy has handled is in the socket, which delivers it as it closes.
      PortChannelDeviceHandle ack[kMaxHosts];
      for (int p = 0; p < hosts; ++p) ack[p] = channels->ack[p];
      std::uint64_t last = 0;
      int via = -1;
      // The first acknowledgement carries this rank's digest back, so that a partner that only
      // sends to it compares too (broadcast's root host, reduce's other hosts).
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) {
          last = first == 0 ? putPart(ack[p], channels->scratchOf[p],
                                      static_cast<std::uint64_t>(hosts) * slotBytes + myCell + kDigestBytes / 2,
                                      cells + myCell + kDigestBytes / 2, sizeof(std::uint64_t))
                            : signalOnly(ack[p]);
          via = p;
        }
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p)) {
          waitingOn(channels, 1u << p, true);
          ack[p].wait();
          if (first == 0 && mismatch == 0 && cellOf(p, kDigestBytes / 2) != x.digest)
            mismatch = static_cast<std::uint32_t>(p) + 1;
        }
      waitingOn(channels, 0, true);
      if (via >= 0) ack[via].fifo.sync(last);
      // Raised only now that this round's acknowledgements have left: the proxy fails on it, and an
      // acknowledgement it had not yet sent would leave a partner waiting instead of comparing.
      // (The call's output is garbage; the next call throws.)
      if (mismatch != 0 && channels->mismatch != nullptr) {
        *static_cast<volatile std::uint32_t*>(channels->mismatch) = mismatch;
        __threadfence_system();
      }
    }
    __syncthreads();
  }
}

struct Parts {
  const char* at[kMaxHosts];
};

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) partnerReduce(char* dst, Parts parts, int nparts, std::uint64_t count,
                                                          int divisor) {
  // The blocks take consecutive pieces of the range, each starting 16-byte aligned (when the range
  // does), so that every block loads and stores whole vectors.
  constexpr std::uint64_t grain = 16 / sizeof(T);
  const std::uint64_t per = ((count + gridDim.x - 1) / gridDim.x + grain - 1) / grain * grain;
  const std::uint64_t first = per * blockIdx.x;
  if (first >= count) return;
  const std::uint64_t n = count - first < per ? count - first : per;
  const char* src[kMaxHosts];
  for (int i = 0; i < nparts; ++i) src[i] = parts.at[i] + first * sizeof(T);
  char* out[1] = {dst + first * sizeof(T)};
  reduceSources<T, Op>(out, 1, src, nparts, divisor, n, threadIdx.x, blockDim.x);
}

// NcclPartners' call check (partner_exchange.hpp): this rank's digest into device memory, for
// NCCL's sends; then each received digest compared with it.
__global__ void partnerDigestWrite(std::uint64_t* own, std::uint64_t digest) { *own = digest; }

__global__ void partnerDigestCheck(const std::uint64_t* theirs, std::uint32_t hosts, std::uint64_t digest,
                                   std::uint32_t* mismatch) {
  for (int h = 0; h < kMaxHosts; ++h) {
    if ((hosts >> h & 1u) == 0 || theirs[h] == digest) continue;
    auto* word = static_cast<volatile std::uint32_t*>(mismatch);
    if (*word == 0) *word = static_cast<std::uint32_t>(h) + 1;
    __threadfence_system();
    return;
  }
}

void checkLaunch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError(std::string(what) + ": launching the kernel failed: " + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

}  // namespace

void preloadPartnerExchange() {
  forEveryTypeOp([&]<class T, ReduceOp Op>() {
    preloadKernel(partnerExchange<T, Op>);
    preloadKernel(partnerReduce<T, Op>);
  });
  preloadKernel(partnerDigestWrite);
  preloadKernel(partnerDigestCheck);
}

void launchPartnerDigestWrite(std::uint64_t* own, std::uint64_t digest, cudaStream_t stream) {
  partnerDigestWrite<<<1, 1, 0, stream>>>(own, digest);
  checkLaunch("partners' digest");
}

void launchPartnerDigestCheck(const std::uint64_t* theirs, std::uint32_t hosts, std::uint64_t digest,
                              std::uint32_t* mismatch, cudaStream_t stream) {
  partnerDigestCheck<<<1, 1, 0, stream>>>(theirs, hosts, digest, mismatch);
  checkLaunch("partners' digest check");
}

void launchPartnerReduce(char* dst, const char* const* parts, int nparts, std::uint64_t count, DataType type,
                         ReduceOp op, int divisor, cudaStream_t stream) {
  if (count == 0) return;
  if (nparts < 1 || nparts > kMaxHosts)
    throw Error(ErrorCode::InternalError, "partners' reduce: " + std::to_string(nparts) + " parts");
  Parts p{};
  for (int i = 0; i < nparts; ++i) p.at[i] = parts[i];
  // About 64 KiB a block, at most 32 blocks: the parts of a round are at most a slot.
  const std::uint64_t bytes = count * sizeOf(type);
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>(32, (bytes + 65535) / 65536));
  dispatchTypeOp(type, op, [&]<class T, ReduceOp Op>() {
    partnerReduce<T, Op><<<blocks, kThreads, 0, stream>>>(dst, p, nparts, count, divisor);
  });
  checkLaunch("partners' reduce");
}

void launchPartnerExchange(const PartnerChannels* channels, std::uint64_t slotBytes, const PartnerExchange& exchange,
                           DataType type, ReduceOp op, cudaStream_t stream) {
  if (exchange.count == 0 || (exchange.sendTo == 0 && exchange.recvFrom == 0)) return;
  if (slotBytes < 16 || slotBytes % 16 != 0)
    throw Error(ErrorCode::InternalError, "partners' exchange: a scratch slot of " + std::to_string(slotBytes) +
                                              " bytes (it must be a positive multiple of 16)");
  // A copy moves bytes whatever the op: one instantiation per type serves it.
  dispatchTypeOp(type, exchange.reduce ? op : ReduceOp::Sum, [&]<class T, ReduceOp Op>() {
    partnerExchange<T, Op><<<1, kThreads, 0, stream>>>(channels, exchange);
  });
  checkLaunch("partners' exchange");
}

}  // namespace ferry
