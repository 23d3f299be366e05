// The data plane across processes, one per GPU, on 2 and 4 GPUs: memory from gpuAlloc registered,
// sent and mapped through the Communicator; MemoryChannel puts and LL16 packets from every rank to
// every other rank at once; PortChannel puts, signals and flushes through the proxy and copy engine
// (their latency and bandwidth are ferry-perf's to measure: tools/ferry-perf). Every byte is checked
// against each sender's seeded pattern; receive buffers are poisoned first.
// Then, on a smaller setup with random data checked on the host (Mesh, channel_mesh.hpp): several
// MemoryChannels and PortChannels per pair all at once; PortChannel put() then signal(), and flush()
// before the sources are overwritten; MemoryChannel get() after a signal; LL16/LL8 packets of odd
// sizes; and a relaxedSignal() ping-pong. Last, PortChannels over HostMemory connections between
// hostAlloc buffers (the proxy's memcpy path). With GPU_TESTS_SHARE_GPUS=1 the ranks share one GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "channel_mesh.hpp"
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

// ---- Several channels per pair, PortChannel put/signal/flush, get, odd packets, relaxed ping-pong ----
// On the Mesh (channel_mesh.hpp): every buffer poisoned, random data, every byte checked on the host.

constexpr unsigned kThreads = 256;  // small grids: the ranks' kernels must fit on one GPU together

// Copies this rank's dst region (sender, slot) to the same place in snapshot: taken right after the
// wait() for that sender, it holds what the wait let through, not what arrived by the kernel's end.
__device__ void snapshotRegion(const unsigned char* dst, unsigned char* snapshot, int sender, int slot) {
  const std::size_t off = regionOffset(sender, slot);
  copy(snapshot + off, dst + off, kRegion, threadIdx.x, blockDim.x);
}

// One block per channel, all at once: blocks [0, channels) drive the MemoryChannels, [channels,
// 2 channels) the PortChannels (each peer-major). Each puts its kSegments segments (a MemoryChannel's
// with the whole block), signals, waits for the peer's signal on the same channel, and snapshots the
// region the peer filled over it.
__global__ void manyChannelsAtOnce(MemoryChannelDeviceHandle* mem, PortChannelDeviceHandle* port,
                                   const int* peers, int channels, const Segment* out,
                                   const unsigned char* dst, unsigned char* snapshot) {
  const bool isPort = static_cast<int>(blockIdx.x) >= channels;
  const int c = blockIdx.x % channels;
  const Segment* s = out + blockIdx.x * kSegments;
  if (!isPort) {
    MemoryChannelDeviceHandle& ch = mem[c];
    for (int j = 0; j < kSegments; ++j) ch.put(s[j].dst, s[j].src, s[j].bytes, threadIdx.x, blockDim.x);
    __syncthreads();  // every thread's puts before thread 0's signal
    if (threadIdx.x == 0) {
      ch.signal();
      ch.wait();
    }
  } else if (threadIdx.x == 0) {
    PortChannelDeviceHandle& ch = port[c];
    for (int j = 0; j < kSegments; ++j) ch.put(s[j].dst, s[j].src, s[j].bytes);
    ch.signal();
    ch.wait();
  }
  __syncthreads();
  snapshotRegion(dst, snapshot, peers[c / kChannels], (isPort ? kChannels : 0) + c % kChannels);
}

// Thread 0 of block c drives PortChannel c: standalone put()s, then (flush) flush(), after which the
// block overwrites every byte of the channel's source partition (flush promises the sources may be
// reused, so the peer must still get the old bytes), then a separate signal(); it waits for the peer's
// signal and the block snapshots what the peer put here.
__global__ void portPutsThenSignal(PortChannelDeviceHandle* port, const int* peers, const Segment* out,
                                   unsigned char* src, const unsigned char* dst, unsigned char* snapshot,
                                   bool flush) {
  const int c = blockIdx.x, receiver = c / kChannels, slot = kChannels + c % kChannels;
  PortChannelDeviceHandle& ch = port[c];
  const Segment* s = out + c * kSegments;
  if (threadIdx.x == 0)
    for (int j = 0; j < kSegments; ++j) ch.put(s[j].dst, s[j].src, s[j].bytes);
  if (flush) {
    if (threadIdx.x == 0) ch.flush();
    __syncthreads();
    unsigned char* mine = src + partitionOffset(receiver, slot);
    for (std::size_t i = threadIdx.x; i < kRegion; i += blockDim.x)
      mine[i] = static_cast<unsigned char>(~mine[i]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ch.signal();
    ch.wait();
  }
  __syncthreads();
  snapshotRegion(dst, snapshot, peers[receiver], slot);
}

// Block c serves get channel c (peer c / kChannels, region c % kChannels): it publishes the partition
// of src that peer reads over this channel (written by this kernel, so only the signal can make it
// visible there), signals, waits for the peer's signal, then gets its kSegments segments from the
// peer's src into this rank's dst with the whole block.
__global__ void getAfterSignal(MemoryChannelDeviceHandle* gets, const Segment* in,
                               const unsigned char* staging, unsigned char* src) {
  const int c = blockIdx.x;
  MemoryChannelDeviceHandle& ch = gets[c];
  const std::size_t mine = partitionOffset(c / kChannels, c % kChannels);
  copy(src + mine, staging + mine, kRegion, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    ch.signal();
    ch.wait();
  }
  __syncthreads();
  const Segment* s = in + c * kSegments;
  // get(offset in the peer's buffer, offset in ours, bytes)
  for (int j = 0; j < kSegments; ++j) ch.get(s[j].src, s[j].dst, s[j].bytes, threadIdx.x, blockDim.x);
}

// Blocks [0, peers) send kMessages packet messages each to their peer; blocks [peers, 2 peers)
// unpack the messages from theirs into dst, at once.
template <class Packet>
__global__ void exchangeMessages(MemoryChannelDeviceHandle* send, MemoryChannelDeviceHandle* unpack,
                                 int npeers, const Segment* out, const Segment* in, std::uint32_t flag) {
  const bool sending = static_cast<int>(blockIdx.x) < npeers;
  const int b = sending ? blockIdx.x : blockIdx.x - npeers;
  for (int j = 0; j < kMessages; ++j) {
    if (sending) {
      const Segment& s = out[b * kMessages + j];
      send[b].putPackets<Packet>(s.packet, s.src, s.bytes, flag, threadIdx.x, blockDim.x);
    } else {
      const Segment& s = in[b * kMessages + j];
      unpack[b].unpackPackets<Packet>(s.packet, s.dst, s.bytes, flag, threadIdx.x, blockDim.x);
    }
  }
}

// relaxedSignal() orders nothing: the semaphore header prescribes one release fence after the writes
// (and __syncthreads() for the other threads' writes) before it.
__device__ void sendRelaxed(MemoryChannelDeviceHandle& ch, const Segment& s) {
  ch.put(s.dst, s.src, s.bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicFence(memory_order_release);
    ch.relaxedSignal();
  }
}
__device__ void receiveAndLog(MemoryChannelDeviceHandle& ch, const Segment& s, const unsigned char* dst,
                              unsigned char* log) {
  if (threadIdx.x == 0) ch.wait();
  __syncthreads();
  copy(log, dst + s.dst, s.bytes, threadIdx.x, blockDim.x);
}

// Block b plays kPingPongTurns turns each way with peer b over its first put channel, the lower rank
// first; every turn carries new data to where the last turn's lay, and the receiver logs it at
// once, so a receiver that ran ahead of the data logs stale bytes. The peer writes here again only
// after this rank's next signal, which follows the log copy (__syncthreads in sendRelaxed).
__global__ void relaxedPingPong(MemoryChannelDeviceHandle* puts, const int* peers, int self,
                                const Segment* out, const Segment* in, const unsigned char* dst,
                                unsigned char* log) {
  MemoryChannelDeviceHandle& ch = puts[blockIdx.x * kChannels];
  const int peer = peers[blockIdx.x];
  const Segment* o = out + blockIdx.x * kPingPongTurns;
  const Segment* i = in + blockIdx.x * kPingPongTurns;
  unsigned char* myLog = log + regionOffset(peer, 0);
  for (int t = 0; t < kPingPongTurns; ++t) {
    if (self < peer) sendRelaxed(ch, o[t]);
    receiveAndLog(ch, i[t], dst, myLog + t * kTurnStride);
    if (self > peer) sendRelaxed(ch, o[t]);
  }
}

TEST_P(GpuChannels, SeveralChannelsPerPairAllAtOnce) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Mesh m(id, rank, n);
    const int channels = (n - 1) * kChannels;
    for (int round = 1; round <= 6; ++round) {
      auto out = m.outbound(round, 0), viaPort = m.outbound(round, kChannels);
      out.insert(out.end(), viaPort.begin(), viaPort.end());
      DeviceArray<Segment> segs(out);
      m.prepare(round);
      manyChannelsAtOnce<<<2 * channels, kThreads>>>(m.puts.ptr, m.ports.ptr, m.peersDev.ptr, channels,
                                                     segs.ptr, m.dst.get(), m.scratch.get());
      GPU_CHECK(cudaDeviceSynchronize());
      // This rank waited on every channel, so everything sent to it has landed.
      auto want = m.expected(round, [&](int p) { return Mesh::segments(round, p, rank, 0, kSlots); });
      const std::string where = "round " + std::to_string(round);
      expectSame(download(m.dst.get(), m.dstBytes), want, where + ", dst");
      expectSame(download(m.scratch.get(), m.dstBytes), want, where + ", snapshots after wait()");
      m.boot->barrier();
    }
  });
}

TEST_P(GpuChannels, PortChannelPutsThenSignalAndFlush) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Mesh m(id, rank, n);
    for (int round = 1; round <= 6; ++round) {  // every size class with and without flush
      const bool flush = round % 2 == 0;
      DeviceArray<Segment> segs(m.outbound(round, kChannels));
      m.prepare(round);
      portPutsThenSignal<<<(n - 1) * kChannels, kThreads>>>(m.ports.ptr, m.peersDev.ptr, segs.ptr,
                                                            m.src.get(), m.dst.get(), m.scratch.get(), flush);
      GPU_CHECK(cudaDeviceSynchronize());
      auto want =
          m.expected(round, [&](int p) { return Mesh::segments(round, p, rank, kChannels, kChannels); });
      const std::string where = "round " + std::to_string(round) + (flush ? " (flush)" : "");
      expectSame(download(m.dst.get(), m.dstBytes), want, where + ", dst");
      expectSame(download(m.scratch.get(), m.dstBytes), want, where + ", snapshots after wait()");
      if (flush) {  // the sources really were overwritten, or the check above proves nothing
        auto src = roundData(round, rank);
        for (int i = 0; i < n - 1; ++i)
          for (int slot = kChannels; slot < kSlots; ++slot)
            for (std::size_t b = 0; b < kRegion; ++b) src[partitionOffset(i, slot) + b] ^= 0xFF;
        expectSame(download(m.src.get(), kSrcBytes), src, where + ", sources overwritten after flush()");
      }
      m.boot->barrier();
    }
  });
}

TEST_P(GpuChannels, MemoryChannelGetAfterSignal) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Mesh m(id, rank, n);
    for (int round = 1; round <= 6; ++round) {
      DeviceArray<Segment> segs(m.inbound(round, 0));
      m.prepare(round, /*staged=*/true);
      getAfterSignal<<<(n - 1) * kChannels, kThreads>>>(m.gets.ptr, segs.ptr, m.scratch.get(), m.src.get());
      GPU_CHECK(cudaDeviceSynchronize());
      auto want = m.expected(round, [&](int p) { return Mesh::segments(round, p, rank, 0, kChannels); });
      expectSame(download(m.dst.get(), m.dstBytes), want, "round " + std::to_string(round) + ", dst");
      m.boot->barrier();  // peers are done reading this rank's src before the next round poisons it
    }
  });
}

template <class Packet>
void packetRound(Mesh& m, int round, std::uint32_t flag) {
  std::vector<Segment> out, in;
  for (int p : m.peers) {
    for (const Segment& s : packetMessages<Packet>(round, m.rank, p)) out.push_back(s);
    for (const Segment& s : packetMessages<Packet>(round, p, m.rank)) in.push_back(s);
  }
  DeviceArray<Segment> outDev(out), inDev(in);
  m.prepare(round);
  const int npeers = m.n - 1;
  exchangeMessages<Packet>
      <<<2 * npeers, kThreads>>>(m.packetSend.ptr, m.packetUnpack.ptr, npeers, outDev.ptr, inDev.ptr, flag);
  GPU_CHECK(cudaDeviceSynchronize());
  // Also catches an unpack that writes a partial word's padding past the message.
  auto want = m.expected(round, [&](int p) { return packetMessages<Packet>(round, p, m.rank); });
  expectSame(download(m.dst.get(), m.dstBytes), want,
             "round " + std::to_string(round) + (sizeof(Packet) == 16 ? " (LL16)" : " (LL8)"));
  m.boot->barrier();
}

TEST_P(GpuChannels, PacketsOfOddSizesAndOffsets) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Mesh m(id, rank, n);
    // The flag is the round: packet buffers start zeroed and are never cleared, so every stale packet
    // (of either format: flags sit at the same 8-byte positions) carries a smaller one.
    for (int round = 1; round <= 6; ++round) {
      if (round <= 3)
        packetRound<LL16Packet>(m, round, round);
      else
        packetRound<LL8Packet>(m, round, round);
    }
  });
}

TEST_P(GpuChannels, RelaxedSignalPingPong) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Mesh m(id, rank, n);
    std::vector<Segment> out, in;
    for (int p : m.peers)
      for (int t = 0; t < kPingPongTurns; ++t) {
        out.push_back(pingPongTurn(t, rank, p));
        in.push_back(pingPongTurn(t, p, rank));
      }
    DeviceArray<Segment> outDev(out), inDev(in);
    m.prepare(1);
    relaxedPingPong<<<n - 1, kThreads>>>(m.puts.ptr, m.peersDev.ptr, rank, outDev.ptr, inDev.ptr, m.dst.get(),
                                         m.scratch.get());
    GPU_CHECK(cudaDeviceSynchronize());
    // The log: turn t from p at (p, 0) + t * kTurnStride.
    auto want = m.expected(1, [&](int p) {
      std::vector<Segment> log;
      for (int t = 0; t < kPingPongTurns; ++t) {
        Segment s = pingPongTurn(t, p, rank);
        s.dst = regionOffset(p, 0) + t * kTurnStride;
        log.push_back(s);
      }
      return log;
    });
    expectSame(download(m.scratch.get(), m.dstBytes), want, "ping-pong log");
  });
}

// ---- PortChannel over a HostMemory connection ----

constexpr std::size_t kHostSlot = (1 << 20) + 64;  // what each peer may put into this rank's host buffer

// Thread 0 of block b puts this rank's bytes into its slot of peer b's host buffer through the
// proxy (memcpy), signals (flushing too when asked) and waits for the peer's signal; then the whole
// block copies the slot that peer filled here into `snapshot`: what this GPU reads right after the
// wait, through the mapping of its own host buffer.
__global__ void portPutIntoHostMemory(PortChannelDeviceHandle* chans, const int* peers, int self,
                                      std::size_t off, std::size_t n, bool flush, const unsigned char* dst,
                                      unsigned char* snapshot) {
  PortChannelDeviceHandle& ch = chans[blockIdx.x];
  if (threadIdx.x == 0) {
    if (flush)
      ch.putWithSignalAndFlush(self * kHostSlot + off, off, n);
    else
      ch.putWithSignal(self * kHostSlot + off, off, n);
    ch.wait();
  }
  __syncthreads();
  const std::size_t slot = static_cast<std::size_t>(peers[blockIdx.x]) * kHostSlot;
  copy(snapshot + slot, dst + slot, kHostSlot, threadIdx.x, blockDim.x);
}

// The proxy's memcpy path: src and dst are hostAlloc memory and the channels run over HostMemory
// connections; random bytes at odd sizes and offsets, every byte of every slot checked on the host
// (the rest must stay poison), in the buffer and in what the GPU read after its wait.
TEST_P(GpuChannels, PortChannelIntoHostMemory) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    cudaSetDevice(rankDevice(rank));
    auto boot = TcpBootstrap::create(id, rank, n);
    Communicator comm(boot);
    auto src = hostCallocShared<unsigned char>(kHostSlot);
    auto dst = hostCallocShared<unsigned char>(kHostSlot * n);
    auto srcMem = comm.registerMemory(src.get(), kHostSlot, Transport::HostMemory);
    auto dstMem = comm.registerMemory(dst.get(), kHostSlot * n, Transport::HostMemory);
    std::vector<int> peers;
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns;
    std::vector<std::shared_future<RegisteredMemory>> theirDst;
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      peers.push_back(p);
      conns.push_back(comm.connect(p, Transport::HostMemory));
      comm.sendMemory(dstMem, p, 1);
      theirDst.push_back(comm.recvMemory(p, 1));
    }
    std::vector<std::shared_ptr<Host2DeviceSemaphore>> sems;
    for (auto& c : conns) sems.push_back(std::make_shared<Host2DeviceSemaphore>(comm, c.get(), 2));
    PortChannelService service;
    std::vector<PortChannelDeviceHandle> handles;
    for (std::size_t i = 0; i < peers.size(); ++i)
      handles.push_back(service.addChannel(sems[i], theirDst[i].get(), srcMem).deviceHandle());
    service.start();
    DeviceArray<PortChannelDeviceHandle> chans(handles);
    DeviceArray<int> peersDev(peers);
    DeviceArray<unsigned char> snapshot(std::vector<unsigned char>(kHostSlot * n));
    unsigned char* dstDev = nullptr;
    GPU_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dstDev), dst.get(), 0));

    const std::pair<std::size_t, std::size_t> sizes[] = {
        {0, 1}, {3, 17}, {1, 4095}, {7, (1 << 20) + 5}, {0, kHostSlot}};
    int round = 0;
    for (auto [off, bytes] : sizes) {
      for (bool flush : {false, true}) {
        ++round;
        std::mt19937 rng(static_cast<unsigned>(round * 64 + rank));
        std::generate(src.get(), src.get() + kHostSlot, [&] { return static_cast<unsigned char>(rng()); });
        std::memset(dst.get(), kPoison, kHostSlot * n);
        GPU_CHECK(cudaMemset(snapshot.ptr, kPoison, kHostSlot * n));
        GPU_CHECK(cudaDeviceSynchronize());
        boot->barrier();  // every dst is poisoned before anyone puts
        portPutIntoHostMemory<<<n - 1, kThreads>>>(chans.ptr, peersDev.ptr, rank, off, bytes, flush, dstDev,
                                                   snapshot.ptr);
        GPU_CHECK(cudaDeviceSynchronize());
        std::vector<unsigned char> want(kHostSlot * n, kPoison);
        for (int p : peers) {
          std::mt19937 peerRng(static_cast<unsigned>(round * 64 + p));
          std::vector<unsigned char> theirs(kHostSlot);
          std::generate(theirs.begin(), theirs.end(), [&] { return static_cast<unsigned char>(peerRng()); });
          std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(off), bytes,
                      want.begin() + static_cast<std::ptrdiff_t>(p * kHostSlot + off));
        }
        const std::string where = "round " + std::to_string(round) + ": " + std::to_string(bytes) +
                                  " bytes at " + std::to_string(off) + (flush ? " (flush)" : "");
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < want.size(); ++i) wrong += dst.get()[i] != want[i];
        EXPECT_EQ(wrong, 0u) << where << ": bytes of the host buffer";
        auto seen = download(snapshot.ptr, kHostSlot * n);
        wrong = 0;
        for (std::size_t i = 0; i < want.size(); ++i)
          wrong += seen[i] != want[i] && (i / kHostSlot) != static_cast<std::size_t>(rank);
        EXPECT_EQ(wrong, 0u) << where << ": bytes this GPU read after its wait";
        boot->barrier();  // nobody poisons a dst before every rank has checked its own
        if (::testing::Test::HasFailure()) break;
      }
    }
    boot->barrier();
    service.stop();
  });
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuChannels, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "gpus"; });

}  // namespace
}  // namespace ferry::test
