// Memory sharing between GPUs, one process per GPU (forked; rank r uses device r): ferry
// (cuMem), cudaMalloc and hostAlloc memory registered for CudaIpc, sent to every peer, mapped
// there, written by a kernel through the mapped pointer and by CudaIpcConnection::write and
// updateAndSync, then with random byte ranges (1 byte, unaligned); every element is checked.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ferry/communicator.hpp"
#include "ferry/memory.hpp"
#include "gpu_test_process.hpp"
#include "memory_sharing_kernels.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

#define CUDA_OK(call)                                                                                     \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

enum class Kind { GpuAlloc, CudaMalloc, HostAlloc };
std::string kindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::GpuAlloc: return "GpuAlloc";
    case Kind::CudaMalloc: return "CudaMalloc";
    case Kind::HostAlloc: return "HostAlloc";
  }
  return "unknown";
}

std::shared_ptr<void> allocate(Kind kind, std::size_t bytes) {
  switch (kind) {
    case Kind::GpuAlloc: return gpuAlloc(bytes);
    case Kind::HostAlloc: return hostAlloc(bytes);
    case Kind::CudaMalloc: {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0, bytes) != cudaSuccess) return nullptr;
      cudaDeviceSynchronize();
      return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    }
  }
  return nullptr;
}

std::vector<std::uint32_t> readBack(Kind kind, const void* ptr, std::size_t count) {
  std::vector<std::uint32_t> out(count);
  if (kind == Kind::HostAlloc)
    std::memcpy(out.data(), ptr, count * 4);
  else
    cudaMemcpy(out.data(), ptr, count * 4, cudaMemcpyDefault);
  return out;
}

struct ByteOp {
  std::size_t dstOff, srcOff, bytes;
};
// Writer p's op in round r: identical on every rank.
ByteOp byteOp(int writer, int round, std::size_t slotBytes) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(writer) * 1000 + round);
  std::size_t bytes = round == 0   ? 1
                      : round == 1 ? slotBytes - 3
                                   : 1 + rng() % (round % 2 ? 4099 : slotBytes);
  return {rng() % (slotBytes - bytes + 1), rng() % (slotBytes - bytes + 1), bytes};
}

class MemorySharing : public ::testing::TestWithParam<Kind> {};

TEST_P(MemorySharing, MappedWrittenAndCheckedOnEveryPair) {
  const int gpus = gpuCountWithoutInit();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const int n = std::min(gpus, 4);
  const Kind kind = GetParam();
  constexpr std::size_t kSlotElems = (1 << 20) + 37;
  constexpr std::size_t kSlotBytes = kSlotElems * 4;
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    CUDA_OK(cudaSetDevice(rank));
    auto boot = TcpBootstrap::create(id, rank, n);
    Communicator comm(boot);
    auto buf = allocate(kind, kSlotBytes * n);
    ASSERT_TRUE(buf);
    auto flags = gpuCallocShared<std::uint64_t>(n);
    auto src = gpuCallocShared<std::uint32_t>(kSlotElems);
    CUDA_OK(launchFill(src.get(), kSlotElems, 1000 + rank, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    TransportFlags t =
        kind == Kind::HostAlloc ? Transport::CudaIpc | Transport::HostMemory : Transport::CudaIpc;
    RegisteredMemory bufMem = comm.registerMemory(buf.get(), kSlotBytes * n, t);
    RegisteredMemory flagMem = comm.registerMemory(flags.get(), 8 * n, Transport::CudaIpc);
    RegisteredMemory srcMem = comm.registerMemory(src.get(), kSlotBytes, Transport::CudaIpc);
    EXPECT_EQ(bufMem.kind(), kind == Kind::HostAlloc ? MemoryKind::Host : MemoryKind::Device);

    std::vector<std::shared_future<std::shared_ptr<Connection>>> connF(n);
    std::vector<std::shared_future<RegisteredMemory>> bufF(n), flagF(n);
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      connF[p] = comm.connect(p, Transport::CudaIpc);
      comm.sendMemory(bufMem, p, 0);
      comm.sendMemory(flagMem, p, 1);
      bufF[p] = comm.recvMemory(p, 0);
      flagF[p] = comm.recvMemory(p, 1);
    }
    std::vector<std::shared_ptr<Connection>> conns(n);
    std::vector<RegisteredMemory> bufs(n), peerFlags(n);
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      conns[p] = connF[p].get();
      bufs[p] = bufF[p].get();
      peerFlags[p] = flagF[p].get();
      ASSERT_NE(bufs[p].data(), nullptr) << "rank " << p << "'s buffer is not mapped";
      ASSERT_EQ(bufs[p].size(), kSlotBytes * n);
      ASSERT_EQ(bufs[p].device(), kind == Kind::HostAlloc ? -1 : p);
    }

    // A: a kernel writes my slot of every peer's buffer through the mapped pointer.
    if (kind != Kind::HostAlloc) {
      for (int p = 0; p < n; ++p)
        if (p != rank)
          CUDA_OK(launchFill(static_cast<std::uint32_t*>(bufs[p].data()) + rank * kSlotElems, kSlotElems,
                             rank, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      boot->barrier();
      auto mine = readBack(kind, buf.get(), kSlotElems * n);
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < kSlotElems; ++i)
          ASSERT_EQ(mine[p * kSlotElems + i], p == rank ? 0u : sharingValue(p, i))
              << "kernel write: slot of rank " << p << ", element " << i;
      boot->barrier();
    }

    // B: CudaIpcConnection copies my src into my slot of every peer, then signals its flag word.
    std::vector<std::uint64_t> outbound(n);
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      conns[p]->write(bufs[p], rank * kSlotBytes, srcMem, 0, kSlotBytes);
      conns[p]->updateAndSync(peerFlags[p], rank * 8, &outbound[p], 7 + rank);
      conns[p]->flush(30s);
    }
    boot->barrier();
    auto mine = readBack(kind, buf.get(), kSlotElems * n);
    std::vector<std::uint64_t> flagsHere(n);
    CUDA_OK(cudaMemcpy(flagsHere.data(), flags.get(), 8 * n, cudaMemcpyDeviceToHost));
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      EXPECT_EQ(flagsHere[p], static_cast<std::uint64_t>(7 + p)) << "flag of rank " << p;
      for (std::size_t i = 0; i < kSlotElems; ++i)
        ASSERT_EQ(mine[p * kSlotElems + i], sharingValue(1000 + p, i))
            << "connection write: slot of rank " << p << ", element " << i;
    }
    boot->barrier();

    // C: random byte ranges (1 byte, unaligned offsets and sizes), each checked against a shadow.
    std::vector<std::vector<std::uint32_t>> srcOf(n), shadow(n);
    for (int p = 0; p < n; ++p) {
      srcOf[p].resize(kSlotElems);
      for (std::size_t i = 0; i < kSlotElems; ++i) srcOf[p][i] = sharingValue(1000 + p, i);
      shadow[p] = srcOf[p];
    }
    for (int round = 0; round < 8; ++round) {
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        ByteOp op = byteOp(rank, round, kSlotBytes);
        conns[p]->write(bufs[p], rank * kSlotBytes + op.dstOff, srcMem, op.srcOff, op.bytes);
        conns[p]->flush(30s);
      }
      boot->barrier();
      auto now = readBack(kind, buf.get(), kSlotElems * n);
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        ByteOp op = byteOp(p, round, kSlotBytes);
        std::memcpy(reinterpret_cast<char*>(shadow[p].data()) + op.dstOff,
                    reinterpret_cast<const char*>(srcOf[p].data()) + op.srcOff, op.bytes);
        ASSERT_EQ(std::memcmp(now.data() + p * kSlotElems, shadow[p].data(), kSlotBytes), 0)
            << "round " << round << ": slot of rank " << p << " after " << op.bytes << " bytes at "
            << op.dstOff;
      }
      boot->barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Kinds, MemorySharing,
                         ::testing::Values(Kind::GpuAlloc, Kind::CudaMalloc, Kind::HostAlloc), kindName);

}  // namespace
}  // namespace ferry::test
