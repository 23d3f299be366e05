// The partners' allreduce over PortChannels (partner_allreduce.hpp): one block, whose thread 0
// drives the channels while all its threads reduce.
#include "collectives/partner_allreduce.hpp"

#include <string>

#include "ferry/errors.hpp"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "kernels/reduce_ops.hpp"

namespace ferry {
namespace {

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) partnerAllReduce(const PartnerChannels* channels, char* buf,
                                                             std::uint64_t count, int divisor) {
  const std::uint32_t tid = threadIdx.x, nt = blockDim.x;
  const int me = channels->host, hosts = channels->hosts;
  const std::uint64_t slotBytes = channels->slotBytes;
  const std::uint64_t slotElements = slotBytes / sizeof(T);
  for (std::uint64_t first = 0; first < count; first += slotElements) {
    const std::uint64_t n = count - first < slotElements ? count - first : slotElements;
    char* mine = buf + first * sizeof(T);
    if (tid == 0) {
      // Copies of the handles: their methods keep no state of their own, the FIFO is in memory.
      PortChannelDeviceHandle data[kMaxHosts];
      for (int p = 0; p < hosts; ++p) data[p] = channels->data[p];
      std::uint64_t flushes[kMaxHosts];
      for (int p = 0; p < hosts; ++p)
        if (p != me)
          data[p].putWithSignal(channels->scratchOf[p], static_cast<std::uint64_t>(me) * slotBytes, kLocalPointer,
                                reinterpret_cast<std::uint64_t>(mine), n * sizeof(T));
      // The proxy reads `mine` after the puts are queued: the reduce below may overwrite it only
      // once each put has landed.
      for (int p = 0; p < hosts; ++p)
        if (p != me) flushes[p] = data[p].pushFlush();
      for (int p = 0; p < hosts; ++p)
        if (p != me) data[p].awaitFlush(flushes[p]);
      for (int p = 0; p < hosts; ++p)
        if (p != me) data[p].wait();  // partner p's part is in slot p of this rank's scratch
    }
    __syncthreads();
    const char* src[kMaxHosts];
    for (int h = 0; h < hosts; ++h)
      src[h] = h == me ? mine : channels->scratch + static_cast<std::uint64_t>(h) * slotBytes;
    char* dst[1] = {mine};
    reduceSources<T, Op>(dst, 1, src, hosts, divisor, n, tid, nt);
    __syncthreads();
    if (tid == 0) {
      // Every slot is read (the block's loads are done: their values are stored): free them, and
      // wait until this rank's slots in the partners' scratch are free for the next round or call.
      // The acks are flushed too: the proxy stops without serving what is left in its FIFO, so an
      // ack still queued when this rank is done and tears down would leave its partner waiting.
      PortChannelDeviceHandle ack[kMaxHosts];
      std::uint64_t flushes[kMaxHosts];
      for (int p = 0; p < hosts; ++p) ack[p] = channels->ack[p];
      for (int p = 0; p < hosts; ++p)
        if (p != me) ack[p].signal();
      for (int p = 0; p < hosts; ++p)
        if (p != me) flushes[p] = ack[p].pushFlush();
      for (int p = 0; p < hosts; ++p)
        if (p != me) ack[p].wait();
      for (int p = 0; p < hosts; ++p)
        if (p != me) ack[p].awaitFlush(flushes[p]);
    }
    __syncthreads();
  }
}

}  // namespace

void preloadPartnerAllReduce() {
  forEveryTypeOp([&]<class T, ReduceOp Op>() { preloadKernel(partnerAllReduce<T, Op>); });
}

void launchPartnerAllReduce(const PartnerChannels* channels, std::uint64_t slotBytes, void* buf, std::size_t count,
                            DataType type, ReduceOp op, int divisor, cudaStream_t stream) {
  if (count == 0) return;
  if (slotBytes < 16 || slotBytes % 16 != 0)
    throw Error(ErrorCode::InternalError, "partners' allreduce: a scratch slot of " + std::to_string(slotBytes) +
                                              " bytes (it must be a positive multiple of 16)");
  dispatchTypeOp(type, op, [&]<class T, ReduceOp Op>() {
    partnerAllReduce<T, Op><<<1, kThreads, 0, stream>>>(channels, static_cast<char*>(buf), count, divisor);
  });
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw CudaError(std::string("partners' allreduce: launching the kernel failed: ") + cudaGetErrorName(err) +
                        " (" + cudaGetErrorString(err) + ")",
                    static_cast<int>(err));
}

}  // namespace ferry
