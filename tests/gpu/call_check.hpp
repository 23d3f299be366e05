#pragma once
// One collective call checked end to end, for the GPU tests of the Comm (collectives_test.cpp,
// comm_across_hosts_test.cpp): its buffers (in place as the API's rule says), the input on random
// data over a poisoned output, the call, and every element of the output against the host
// reference (tools/common/collective_data.hpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/collective_data.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "gpu_test_util.hpp"

namespace ferry::test {

using tools::CallShape;

// deviceFactors: for a PreMulSum shape, read the factor from there (Rank::factors) when the call
// runs; without it, pass the factor from the host.
inline void issue(Comm& comm, const CallShape& s, const void* send, void* recv, cudaStream_t stream,
           const void* deviceFactors = nullptr) {
  if (s.preMulSum) {
    const std::uint64_t bits = tools::preMulFactorBits(s.type, s.rank);
    const PreMulSum op =
        deviceFactors
            ? PreMulSum{static_cast<const char*>(deviceFactors) + 8 * static_cast<int>(s.type), true}
            : PreMulSum{&bits, false};
    switch (s.collective) {
      case Collective::AllReduce: comm.allReduce(send, recv, s.count, s.type, op, stream); return;
      case Collective::ReduceScatter: comm.reduceScatter(send, recv, s.count, s.type, op, stream); return;
      case Collective::Reduce: comm.reduce(send, recv, s.count, s.type, op, s.root, stream); return;
      default: FAIL() << "PreMulSum shape of a collective that does not reduce"; return;
    }
  }
  if (s.accumulation != Accumulation::Stepwise) {  // the overloads that take it
    switch (s.collective) {
      case Collective::AllReduce: comm.allReduce(send, recv, s.count, s.type, s.op, s.accumulation, stream); return;
      case Collective::ReduceScatter:
        comm.reduceScatter(send, recv, s.count, s.type, s.op, s.accumulation, stream);
        return;
      case Collective::Reduce: comm.reduce(send, recv, s.count, s.type, s.op, s.accumulation, s.root, stream); return;
      default: FAIL() << "an accumulation for a collective that does not reduce"; return;
    }
  }
  switch (s.collective) {
    case Collective::AllReduce: comm.allReduce(send, recv, s.count, s.type, s.op, stream); break;
    case Collective::AllGather: comm.allGather(send, recv, s.count, s.type, stream); break;
    case Collective::ReduceScatter: comm.reduceScatter(send, recv, s.count, s.type, s.op, stream); break;
    case Collective::AllToAll: comm.allToAll(send, recv, s.count, s.type, stream); break;
    case Collective::Broadcast: comm.broadcast(send, recv, s.count, s.type, s.root, stream); break;
    case Collective::Reduce: comm.reduce(send, recv, s.count, s.type, s.op, s.root, stream); break;
  }
}

// Device buffers for one call; in place, send points into recv as the API's in-place rule says.
struct CallBuffers {
  DeviceBuffer recvBuf, sendBuf;
  void* send;
  void* recv;
  CallBuffers(int dev, const CallShape& s, bool inPlace)
      : recvBuf(dev, std::max<std::size_t>(1, s.recvCount() * sizeOf(s.type)) +
                         (inPlace ? std::max(s.sendCount(), s.recvCount()) * sizeOf(s.type) : 0)),
        sendBuf(dev, inPlace ? 1 : std::max<std::size_t>(1, s.sendCount() * sizeOf(s.type))) {
    recv = recvBuf.ptr;
    send = sendBuf.ptr;
    if (inPlace) {
      const std::size_t es = sizeOf(s.type);
      send = s.collective == Collective::AllGather ? static_cast<char*>(recv) + s.rank * s.count * es : recv;
      if (s.collective == Collective::ReduceScatter) {
        // recv == send + rank * recvCount: the whole input lives in recvBuf, the output inside it.
        send = recvBuf.ptr;
        recv = static_cast<char*>(recvBuf.ptr) + s.rank * s.count * es;
      }
    }
  }
};

// Fills, poisons, runs `s` on `b` and checks it; returns the number of wrong elements. `reordered`:
// the reduction may add in another order than rank order (floats within rounding).
inline std::size_t fillRunCheck(Comm& comm, Bootstrap& boot, cudaStream_t stream, const CallShape& s, CallBuffers& b,
                                bool inPlace, bool reordered, const void* deviceFactors = nullptr) {
  const std::size_t es = sizeOf(s.type);
  std::vector<char> send(s.sendCount() * es), want(s.recvCount() * es), got(s.recvCount() * es);
  tools::fillSend(s.type, send.data(), s.sendCount(), s.rank, s.seed);
  const bool hasSend = s.hasSend();
  // Poison first, then the input on top: in place, whatever of the output is not input stays poison.
  // (In-place reduceScatter's output lies inside its input: nothing of it can be poisoned.)
  if (!(inPlace && s.collective == Collective::ReduceScatter))
    cudaMemset(b.recv, tools::kPoisonByte, s.recvCount() * es);
  if (hasSend) cudaMemcpy(b.send, send.data(), send.size(), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  boot.barrier();  // nobody writes into a buffer that is still being filled
  issue(comm, s, hasSend ? b.send : nullptr, b.recv, stream, deviceFactors);
  const cudaError_t err = cudaStreamSynchronize(stream);
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  cudaMemcpy(got.data(), b.recv, got.size(), cudaMemcpyDeviceToHost);
  tools::expectedRecv(s, want.data(), inPlace);
  if (reordered) return tools::countWrongReordered(s.type, s.op, s.worldSize, got.data(), want.data(), s.recvCount());
  return tools::countWrong(s.type, got.data(), want.data(), s.recvCount());
}

}  // namespace ferry::test
