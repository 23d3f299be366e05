#pragma once
// The setup of channels_test.cu's second half (Mesh): to every peer kChannels MemoryChannels for
// puts, kChannels for gets, one for packets, and kChannels PortChannels on one PortChannelService,
// each with its own semaphore; what every rank sends in each round (the same plan on every rank);
// and the host reference every received byte is compared with. Data is random bytes made on the
// host. Buffers per rank:
//   src      this rank's round data: one kRegion partition per (receiver, channel), so that a channel
//            may overwrite its own sources (after a flush) without touching another channel's
//   dst      what peers put here (or this rank gets): one kRegion region per (sender, channel)
//   scratch  snapshots taken right after a wait(), the ping-pong log, or data a get kernel publishes
//   packets  per sender, kPacketRegion of packet space
// For CUDA sources only (the offsets are __host__ __device__).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ferry/bootstrap.hpp"
#include "ferry/communicator.hpp"
#include "ferry/memory.hpp"
#include "ferry/memory_channel.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/semaphore.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"

namespace ferry::test {

constexpr int kChannels = 3;           // per peer, of each kind
constexpr int kSlots = 2 * kChannels;  // regions per sender: the MemoryChannels', then the PortChannels'
constexpr int kMaxPeers = 3;
constexpr std::size_t kRegion = 1 << 20;
constexpr std::size_t kSrcBytes = kMaxPeers * kSlots * kRegion;
constexpr std::size_t kPacketRegion = 2 * kRegion;
constexpr int kSegments = 3;  // puts per channel and round
constexpr int kMessages = 6;  // packet messages per peer and round
constexpr int kPingPongTurns = 256;
constexpr std::size_t kTurnStride = 2048;    // per turn in the ping-pong log
constexpr unsigned char kMeshPoison = 0x5A;  // every byte that nothing should have written
static_assert(kMessages <= kSlots && kPingPongTurns * kTurnStride + 64 + kTurnStride <= kRegion);

// One transfer: `bytes` from the sender's src at `src` to the receiver's dst at `dst` (for packets,
// through the receiver's packet buffer at `packet`).
struct Segment {
  std::uint64_t dst = 0, src = 0, bytes = 0, packet = 0;
};

__host__ __device__ constexpr std::size_t regionOffset(int sender, int slot) {
  return (static_cast<std::size_t>(sender) * kSlots + slot) * kRegion;
}
// The sender's partition of src for the peer at index `receiverIndex` of its peer list.
__host__ __device__ constexpr std::size_t partitionOffset(int receiverIndex, int slot) {
  return (static_cast<std::size_t>(receiverIndex) * kSlots + slot) * kRegion;
}
inline int peerIndex(int self, int peer) { return peer < self ? peer : peer - 1; }

inline std::uint32_t seedOf(int round, int from, int to, int slot) {
  return ((static_cast<std::uint32_t>(round) * 131u + from) * 131u + to) * 131u + slot;
}
// What rank `r` holds in src in `round` (every rank can make every other rank's).
inline std::vector<unsigned char> roundData(int round, int r) {
  return randomBytes(kSrcBytes, seedOf(round, r, 255, 255));
}

// The puts `from` makes to `to` over the channel of region `slot` in `round` (every rank derives the
// same): rounds cycle through a few bytes, up to 4 KiB and up to a third of the region (round 1 starts
// with a single byte), each in its own third of the destination region, anywhere in the sender's
// partition for the channel, so both offsets take every alignment.
inline std::vector<Segment> channelSegments(int round, int from, int to, int slot) {
  std::mt19937 rng(seedOf(round, from, to, slot));
  constexpr std::size_t third = kRegion / kSegments;
  const std::size_t maxBytes = round % 3 == 1 ? 16 : round % 3 == 2 ? 4096 : third - 64;
  std::vector<Segment> out(kSegments);
  for (int j = 0; j < kSegments; ++j) {
    Segment& s = out[j];
    s.bytes = round == 1 && j == 0 ? 1 : 1 + rng() % maxBytes;
    s.dst = regionOffset(from, slot) + j * third + rng() % 64;
    s.src = partitionOffset(peerIndex(from, to), slot) + rng() % (kRegion - s.bytes);
  }
  return out;
}

// The packet messages `from` sends `to` in `round`: 1, 3, 7, 13, 1023 bytes and one up to half a
// region. putPackets/unpackPackets require both data pointers aligned to Packet::kDataBytes and the
// packet offset to a whole packet, so offsets are random multiples of those, not arbitrary.
template <class Packet>
std::vector<Segment> packetMessages(int round, int from, int to) {
  constexpr std::uint64_t k = Packet::kDataBytes;
  std::mt19937 rng(seedOf(round, from, to, 99));
  const std::uint64_t sizes[kMessages] = {1, 3, 7, 13, 1023, 1 + rng() % (kRegion / 2)};
  std::uint64_t packet = from * kPacketRegion;
  std::vector<Segment> out(kMessages);
  for (int j = 0; j < kMessages; ++j) {
    Segment& s = out[j];
    s.bytes = sizes[j];
    s.dst = regionOffset(from, j) + rng() % 16 * k;
    s.src = partitionOffset(peerIndex(from, to), j) + rng() % 1024 * k;
    packet += rng() % 4 * sizeof(Packet);  // a gap of stale packets between messages
    s.packet = packet;
    packet += packetBufferBytes<Packet>(s.bytes);
  }
  return out;
}

// Turn `turn` of the ping-pong from `from` to `to`: 1 byte, then up to ~2 KiB, at unaligned offsets
// near the start of the receiver's region (so each turn overwrites the last one's bytes).
inline Segment pingPongTurn(int turn, int from, int to) {
  std::mt19937 rng(seedOf(turn, from, to, 77));
  Segment s;
  s.bytes = turn == 0 ? 1 : 1 + rng() % (kTurnStride - 64);
  s.dst = regionOffset(from, 0) + rng() % 64;
  s.src = partitionOffset(peerIndex(from, to), 0) + turn * kTurnStride + rng() % 64;
  return s;
}

// A device copy of a host vector, freed on destruction.
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<T>& host) { assign(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr); }
  void assign(const std::vector<T>& host) {
    cudaFree(ptr);
    ptr = nullptr;
    cudaMalloc(&ptr, std::max<std::size_t>(host.size(), 1) * sizeof(T));
    cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
};

inline std::vector<unsigned char> download(const void* p, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost);
  return v;
}

// Every byte of `got` against `want` (got may be longer); reports the first difference and how many.
inline void expectSame(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                       const std::string& what) {
  ASSERT_GE(got.size(), want.size()) << what;
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && wrong++ == 0) first = i;
  if (wrong != 0)
    ADD_FAILURE() << what << ": " << wrong << " wrong bytes; the first is byte " << first % kRegion
                  << " of region " << first / kRegion << " (sender " << first / kRegion / kSlots << ", slot "
                  << first / kRegion % kSlots << "): " << int(got[first]) << ", want " << int(want[first]);
}

// Everything one rank sets up: buffers, connections, semaphores and channels to every peer.
struct Mesh {
  int rank, n;
  std::size_t dstBytes, scratchBytes;
  std::shared_ptr<TcpBootstrap> boot;
  std::unique_ptr<Communicator> comm;
  std::shared_ptr<unsigned char> src, dst, scratch, packets;
  std::vector<int> peers;
  std::vector<std::shared_ptr<MemoryDevice2DeviceSemaphore>> putSems, getSems, packetSems;
  std::vector<std::shared_ptr<Host2DeviceSemaphore>> portSems;
  std::vector<MemoryChannel> memory;
  std::unique_ptr<PortChannelService> service;
  std::vector<PortChannel> port;
  // Device copies of the handles, peer-major: kChannels per peer (one per peer for packets).
  DeviceArray<MemoryChannelDeviceHandle> puts, gets, packetSend, packetUnpack;
  DeviceArray<PortChannelDeviceHandle> ports;
  DeviceArray<int> peersDev;

  Mesh(const UniqueId& id, int r, int size)
      : rank(r), n(size), dstBytes(regionOffset(size, 0)), scratchBytes(std::max(dstBytes, kSrcBytes)) {
    cudaSetDevice(rankDevice(rank));
    boot = TcpBootstrap::create(id, rank, n);
    comm = std::make_unique<Communicator>(boot);
    src = gpuCallocShared<unsigned char>(kSrcBytes);
    dst = gpuCallocShared<unsigned char>(dstBytes);
    scratch = gpuCallocShared<unsigned char>(scratchBytes);
    packets = gpuCallocShared<unsigned char>(kPacketRegion * n);  // zero: no packet carries a flag yet
    for (int p = 0; p < n; ++p)
      if (p != rank) peers.push_back(p);
    auto dstMem = comm->registerMemory(dst.get(), dstBytes, Transport::CudaIpc);
    auto srcMem = comm->registerMemory(src.get(), kSrcBytes, Transport::CudaIpc);
    auto packetMem = comm->registerMemory(packets.get(), kPacketRegion * n, Transport::CudaIpc);
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns;
    std::vector<std::shared_future<RegisteredMemory>> theirDst, theirSrc, theirPackets;
    for (int p : peers) {
      conns.push_back(comm->connect(p, Transport::CudaIpc));
      comm->sendMemory(dstMem, p, 1);
      comm->sendMemory(srcMem, p, 2);
      comm->sendMemory(packetMem, p, 3);
      theirDst.push_back(comm->recvMemory(p, 1));
      theirSrc.push_back(comm->recvMemory(p, 2));
      theirPackets.push_back(comm->recvMemory(p, 3));
    }
    // Both sides make a kind's semaphores in the same order on one tag, so that channel k here is
    // paired with channel k there.
    for (auto& f : conns) {
      auto c = f.get();
      for (int k = 0; k < kChannels; ++k) {
        putSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 4));
        getSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 5));
        portSems.push_back(std::make_shared<Host2DeviceSemaphore>(*comm, c, 6));
      }
      packetSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 7));
    }
    service = std::make_unique<PortChannelService>();
    std::vector<MemoryChannelDeviceHandle> hp, hg, hs, hu;
    std::vector<PortChannelDeviceHandle> hq;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      for (std::size_t k = i * kChannels; k < (i + 1) * kChannels; ++k) {
        memory.emplace_back(putSems[k], theirDst[i].get(), src.get());  // my src -> their dst
        hp.push_back(memory.back().deviceHandle());
        memory.emplace_back(getSems[k], theirSrc[i].get(), dst.get());  // their src -> my dst
        hg.push_back(memory.back().deviceHandle());
        port.push_back(service->addChannel(portSems[k], theirDst[i].get(), srcMem));
        hq.push_back(port.back().deviceHandle());
      }
      memory.emplace_back(packetSems[i], theirPackets[i].get(), src.get(), packets.get());
      hs.push_back(memory.back().deviceHandle());
      hu.push_back(hs.back());
      hu.back().src = dst.get();  // unpackPackets writes to the handle's src: here, dst
    }
    service->start();
    puts.assign(hp);
    gets.assign(hg);
    packetSend.assign(hs);
    packetUnpack.assign(hu);
    ports.assign(hq);
    peersDev.assign(peers);
    boot->barrier();
  }
  ~Mesh() {
    cudaDeviceSynchronize();
    boot->barrier();  // nobody unmaps memory a peer may still use
    service->stop();
  }

  // This rank's round data into src (staged: into scratch, for the kernel to publish, and src
  // poisoned); dst and scratch poisoned. Returns once every rank is ready.
  void prepare(int round, bool staged = false) {
    auto data = roundData(round, rank);
    cudaMemset(dst.get(), kMeshPoison, dstBytes);
    cudaMemset(scratch.get(), kMeshPoison, scratchBytes);
    if (staged) cudaMemset(src.get(), kMeshPoison, kSrcBytes);
    cudaMemcpy(staged ? scratch.get() : src.get(), data.data(), kSrcBytes, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    boot->barrier();
  }

  // The segments of `round` between `from` and `to` over the channels of regions [first, first+count).
  static std::vector<Segment> segments(int round, int from, int to, int first, int count) {
    std::vector<Segment> out;
    for (int slot = first; slot < first + count; ++slot)
      for (const Segment& s : channelSegments(round, from, to, slot)) out.push_back(s);
    return out;
  }
  // Those this rank sends (inbound: receives) over kChannels channels from region `first` on, in the
  // kernels' order: peer-major, kSegments per channel.
  std::vector<Segment> outbound(int round, int first) const {
    std::vector<Segment> out;
    for (int p : peers)
      for (const Segment& s : segments(round, rank, p, first, kChannels)) out.push_back(s);
    return out;
  }
  std::vector<Segment> inbound(int round, int first) const {
    std::vector<Segment> out;
    for (int p : peers)
      for (const Segment& s : segments(round, p, rank, first, kChannels)) out.push_back(s);
    return out;
  }

  // dst as it must be once the segments from each peer p (segmentsFrom(p), at their dst) have
  // landed: p's round data there, poison elsewhere.
  template <class F>
  std::vector<unsigned char> expected(int round, F segmentsFrom) const {
    std::vector<unsigned char> want(dstBytes, kMeshPoison);
    for (int p : peers) {
      const auto data = roundData(round, p);
      for (const Segment& s : segmentsFrom(p)) std::memcpy(want.data() + s.dst, data.data() + s.src, s.bytes);
    }
    return want;
  }
};

}  // namespace ferry::test
