// The partners' exchange over PortChannels (partner_exchange.hpp): one block, whose thread 0
// drives the channels while all its threads reduce or copy.
#include "collectives/partner_exchange.hpp"

#include <string>

#include "ferry/errors.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/reduce_ops.hpp"

namespace ferry {
namespace {

FERRY_DEVICE FERRY_INLINE bool has(std::uint32_t mask, int host) { return (mask >> host & 1u) != 0; }

// Tells the proxy whose partner the kernel waits for (PartnerChannels::waitingOn); 0: nobody.
FERRY_DEVICE FERRY_INLINE void waitingOn(const PartnerChannels* channels, std::uint32_t hosts) {
  if (channels->waitingOn != nullptr) *static_cast<volatile std::uint32_t*>(channels->waitingOn) = hosts;
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) partnerExchange(const PartnerChannels* channels, PartnerExchange x) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const int me = channels->host, hosts = channels->hosts;
  const std::uint64_t slotBytes = channels->slotBytes;
  const std::uint64_t slotElements = slotBytes / sizeof(T);
  for (std::uint64_t first = 0; first < x.count; first += slotElements) {
    const std::uint64_t n = x.count - first < slotElements ? x.count - first : slotElements;
    const std::uint64_t at = first * sizeof(T), bytes = n * sizeof(T);
    if (tid == 0) {
      // Copies of the handles: their methods keep no state of their own, the FIFO is in memory.
      PortChannelDeviceHandle data[kMaxHosts];
      for (int p = 0; p < hosts; ++p) data[p] = channels->data[p];
      std::uint64_t flushes[kMaxHosts];
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p))
          data[p].putWithSignal(channels->scratchOf[p], static_cast<std::uint64_t>(me) * slotBytes, kLocalPointer,
                                reinterpret_cast<std::uint64_t>(x.src + x.srcOffset[p] + at), bytes);
      // The proxy reads the source after the puts are queued: a reduce below may overwrite it
      // (allreduce's own part is its result) only once each put has landed.
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p)) flushes[p] = data[p].pushFlush();
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p)) data[p].awaitFlush(flushes[p]);
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) {
          waitingOn(channels, 1u << p);
          data[p].wait();  // partner p's part is in slot p of this scratch
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
      // or call. The acks are flushed too: the proxy stops without serving what is left in its
      // FIFO, so an ack still queued when this rank is done and tears down would leave its partner
      // waiting.
      PortChannelDeviceHandle ack[kMaxHosts];
      std::uint64_t flushes[kMaxHosts];
      for (int p = 0; p < hosts; ++p) ack[p] = channels->ack[p];
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) ack[p].signal();
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) flushes[p] = ack[p].pushFlush();
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.sendTo, p)) {
          waitingOn(channels, 1u << p);
          ack[p].wait();
        }
      waitingOn(channels, 0);
      for (int p = 0; p < hosts; ++p)
        if (p != me && has(x.recvFrom, p)) ack[p].awaitFlush(flushes[p]);
    }
    __syncthreads();
  }
}

}  // namespace

void preloadPartnerExchange() {
  forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(partnerExchange<T, Op>); });
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
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError(std::string("partners' exchange: launching the kernel failed: ") + cudaGetErrorName(err) +
                        " (" + cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

}  // namespace ferry
