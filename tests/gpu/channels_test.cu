// The data plane across processes, one per GPU, on 2 and 4 GPUs: memory from gpuAlloc registered,
// sent and mapped through the Communicator; MemoryChannel puts and LL16 packets from every rank to
// every other rank at once; PortChannel puts, signals and flushes through the proxy and copy engine
// (their latency and bandwidth are ferry-perf's to measure: tools/ferry-perf). Every byte is checked against each sender's seeded pattern; receive buffers are poisoned first.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "ferry/bootstrap.hpp"
#include "ferry/communicator.hpp"
#include "ferry/memory.hpp"
#include "ferry/memory_channel.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/semaphore.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

constexpr std::size_t kSlot = 64 << 20;  // what each peer may put into this rank's receive buffer
constexpr unsigned char kPoison = 0x5A;

// The byte `i` of what rank `r` sends in round `round`.
__host__ __device__ inline unsigned char pattern(int r, int round, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(r) << 48) ^ (static_cast<std::uint64_t>(round) << 40) ^ i;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return static_cast<unsigned char>(x >> 56);
}

__global__ void fillPattern(unsigned char* out, std::size_t n, int r, int round) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = pattern(r, round, i);
}

// Counts bytes of recv[slot p] that differ from rank p's pattern (within [off, off+n)) or are not
// poison (outside it).
__global__ void countWrong(const unsigned char* recv, int nranks, int self, std::size_t off, std::size_t n,
                           int round, unsigned long long* wrong) {
  for (int p = 0; p < nranks; ++p) {
    if (p == self) continue;
    const unsigned char* slot = recv + p * kSlot;
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kSlot; i += gridDim.x * blockDim.x) {
      bool inside = i >= off && i < off + n;
      unsigned char want = inside ? pattern(p, round, i - off) : kPoison;
      if (slot[i] != want) atomicAdd(wrong, 1ull);
    }
  }
}

// Block b talks to peer peers[b]: put into its slot for us, signal, then wait for its signal.
__global__ void allPairsPut(MemoryChannelDeviceHandle* chans, int self, std::size_t off, std::size_t n) {
  MemoryChannelDeviceHandle& ch = chans[blockIdx.x];
  ch.put(self * kSlot + off, 0, n, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    ch.signal();
    ch.wait();
  }
}

// One kernel, so that sending and receiving run at once: blocks [0, peers) write LL16 packets into
// each peer's packet buffer at this rank's slot, all peers at once; blocks [peers, 2 peers) each
// unpack one peer's packets into that peer's receive slot.
__global__ void exchangePackets(MemoryChannelDeviceHandle* chans, const int* peers, int npeers, int self,
                                unsigned char* recv, std::size_t n, std::uint32_t flag) {
  const std::uint64_t packetSlot = packetBufferBytes<LL16Packet>(kSlot);
  if (static_cast<int>(blockIdx.x) < npeers) {
    chans[blockIdx.x].putPackets<LL16Packet>(self * packetSlot, 0, n, flag, threadIdx.x, blockDim.x);
    return;
  }
  const int i = blockIdx.x - npeers;
  MemoryChannelDeviceHandle ch = chans[i];
  ch.src = recv;  // unpack into our receive buffer, slot p
  ch.unpackPackets<LL16Packet>(peers[i] * packetSlot, peers[i] * kSlot, n, flag, threadIdx.x, blockDim.x);
}

// Thread 0 of block b drives the PortChannel to peer b.
__global__ void allPairsPortPut(PortChannelDeviceHandle* chans, int self, std::size_t off, std::size_t n,
                                bool flush) {
  if (threadIdx.x != 0) return;
  PortChannelDeviceHandle& ch = chans[blockIdx.x];
  if (flush)
    ch.putWithSignalAndFlush(self * kSlot + off, 0, n);
  else
    ch.putWithSignal(self * kSlot + off, 0, n);
  ch.wait();
}

// Everything one rank sets up: buffers, connections, semaphores, channels to every peer.
struct RankSetup {
  int rank, n;
  std::shared_ptr<TcpBootstrap> boot;
  std::unique_ptr<Communicator> comm;
  std::shared_ptr<unsigned char> send, recv, packets;
  std::vector<int> peers;
  std::vector<std::shared_ptr<MemoryDevice2DeviceSemaphore>> memSems, packetSems;
  std::vector<std::shared_ptr<Host2DeviceSemaphore>> portSems;
  std::vector<MemoryChannel> memory, packetChannels;
  std::unique_ptr<PortChannelService> service;
  std::vector<PortChannel> port;
  MemoryChannelDeviceHandle* memoryDev = nullptr;  // device copies, one per peer
  MemoryChannelDeviceHandle* packetDev = nullptr;  // dst = the peer's packet buffer
  PortChannelDeviceHandle* portDev = nullptr;
  int* peersDev = nullptr;
  unsigned long long* wrongDev = nullptr;

  RankSetup(const UniqueId& id, int r, int size) : rank(r), n(size) {
    cudaSetDevice(rankDevice(rank));
    boot = TcpBootstrap::create(id, rank, n);
    comm = std::make_unique<Communicator>(boot);
    send = gpuCallocShared<unsigned char>(kSlot);
    recv = gpuCallocShared<unsigned char>(kSlot * n);
    packets = gpuCallocShared<unsigned char>(packetBufferBytes<LL16Packet>(kSlot) * n);
    for (int p = 0; p < n; ++p)
      if (p != rank) peers.push_back(p);
    // Post everything first, then resolve: one round of bootstrap traffic for all peers.
    auto recvMem = comm->registerMemory(recv.get(), kSlot * n, Transport::CudaIpc);
    auto sendMem = comm->registerMemory(send.get(), kSlot, Transport::CudaIpc);
    auto packetMem =
        comm->registerMemory(packets.get(), packetBufferBytes<LL16Packet>(kSlot) * n, Transport::CudaIpc);
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns;
    std::vector<std::shared_future<RegisteredMemory>> theirRecv, theirPackets;
    for (int p : peers) {
      conns.push_back(comm->connect(p, Transport::CudaIpc));
      comm->sendMemory(recvMem, p, 1);
      comm->sendMemory(packetMem, p, 2);
      theirRecv.push_back(comm->recvMemory(p, 1));
      theirPackets.push_back(comm->recvMemory(p, 2));
    }
    for (std::size_t i = 0; i < peers.size(); ++i) {
      auto c = conns[i].get();
      memSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 3));
      packetSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 4));
      portSems.push_back(std::make_shared<Host2DeviceSemaphore>(*comm, c, 5));
    }
    service = std::make_unique<PortChannelService>();
    std::vector<MemoryChannelDeviceHandle> mh, ph;
    std::vector<PortChannelDeviceHandle> qh;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      memory.emplace_back(memSems[i], theirRecv[i].get(), send.get(), packets.get());
      mh.push_back(memory.back().deviceHandle());
      packetChannels.emplace_back(packetSems[i], theirPackets[i].get(), send.get(), packets.get());
      ph.push_back(packetChannels.back().deviceHandle());
      port.push_back(service->addChannel(portSems[i], theirRecv[i].get(), sendMem));
      qh.push_back(port.back().deviceHandle());
    }
    service->start();
    auto upload = [](auto*& dev, const auto& host) {
      cudaMalloc(&dev, host.size() * sizeof(host[0]));
      cudaMemcpy(dev, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice);
    };
    upload(memoryDev, mh);
    upload(packetDev, ph);
    upload(portDev, qh);
    upload(peersDev, peers);
    cudaMalloc(&wrongDev, sizeof(unsigned long long));
    boot->barrier();
  }
  ~RankSetup() {
    cudaDeviceSynchronize();
    boot->barrier();  // nobody unmaps memory a peer may still write
    service->stop();
    for (void* p : {static_cast<void*>(memoryDev), static_cast<void*>(packetDev), static_cast<void*>(portDev),
                    static_cast<void*>(peersDev), static_cast<void*>(wrongDev)})
      cudaFree(p);
  }

  void prepare(int round, std::size_t n) {
    fillPattern<<<132, 512>>>(send.get(), n, rank, round);
    cudaMemset(recv.get(), kPoison, kSlot * this->n);
    cudaMemset(wrongDev, 0, sizeof(unsigned long long));
    cudaDeviceSynchronize();
    boot->barrier();  // every receive buffer is poisoned before anyone writes
  }
  unsigned long long wrong(int round, std::size_t off, std::size_t n) {
    countWrong<<<132, 512>>>(recv.get(), this->n, rank, off, n, round, wrongDev);
    unsigned long long host = ~0ull;
    cudaMemcpy(&host, wrongDev, sizeof(host), cudaMemcpyDeviceToHost);
    return host;
  }
};

std::vector<std::pair<std::size_t, std::size_t>> roundsOfSizes() {  // (offset, bytes), same on all ranks
  std::mt19937 rng(2024);
  std::vector<std::pair<std::size_t, std::size_t>> out = {
      {0, 1}, {3, 17}, {1, 4095}, {0, (8 << 20) - 64}, {5, 1 << 20}};
  for (int i = 0; i < 3; ++i) out.push_back({rng() % 64, 1 + rng() % ((8 << 20) - 64)});
  return out;
}

class GpuChannels : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(GpuChannels, MemoryChannelPutsFromEveryRankAtOnce) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    RankSetup s(id, rank, n);
    int round = 0;
    for (auto [off, bytes] : roundsOfSizes()) {
      s.prepare(++round, bytes);
      allPairsPut<<<n - 1, 512>>>(s.memoryDev, rank, off, bytes);
      GPU_CHECK(cudaDeviceSynchronize());
      s.boot->barrier();
      EXPECT_EQ(s.wrong(round, off, bytes), 0u) << "round " << round << " off " << off << " bytes " << bytes;
    }
  });
}

TEST_P(GpuChannels, PacketsUnderContention) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    RankSetup s(id, rank, n);
    int round = 0;
    for (std::size_t bytes : {8ul, 24ul, 1000ul, 65536ul, 1ul << 20}) {
      s.prepare(++round, bytes);
      exchangePackets<<<2 * (n - 1), 512>>>(s.packetDev, s.peersDev, n - 1, rank, s.recv.get(), bytes, round);
      GPU_CHECK(cudaDeviceSynchronize());
      s.boot->barrier();
      EXPECT_EQ(s.wrong(round, 0, bytes), 0u) << "round " << round << " bytes " << bytes;
    }
  });
}

TEST_P(GpuChannels, PortChannelPutSignalFlush) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    RankSetup s(id, rank, n);
    int round = 0;
    for (auto [off, bytes] : roundsOfSizes()) {
      for (bool flush : {false, true}) {
        s.prepare(++round, bytes);
        allPairsPortPut<<<n - 1, 32>>>(s.portDev, rank, off, bytes, flush);
        GPU_CHECK(cudaDeviceSynchronize());
        // wait() returned on every rank: the peer's signal came after its data, so no barrier is
        // needed before checking; a barrier still keeps the next round's poisoning apart.
        EXPECT_EQ(s.wrong(round, off, bytes), 0u)
            << "round " << round << " off " << off << " bytes " << bytes;
        s.boot->barrier();
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuChannels, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "gpus"; });

}  // namespace
}  // namespace ferry::test
