// The device primitives on real GPUs, two of them in one process with peer access (NVLink): put
// and get of any size and alignment, LL16/LL8 packets, semaphore ordering over many rounds, the
// bounded wait, and microbenchmarks of signal round trip and put bandwidth. Every byte is checked
// against a host reference; destinations are poisoned first. With one GPU and
// GPU_TESTS_SHARE_GPUS=1, the tests whose kernels never wait for each other (TwoSides) put both
// sides on it; the others skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/device/memory_channel.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"

namespace ferry::test {
namespace {

constexpr std::size_t kBytes = 64 << 20;
constexpr std::uint64_t kTimeoutNs = 10'000'000'000ull;
constexpr unsigned char kPoison = 0xA5;

// Per GPU: a data buffer, a packet buffer and the semaphore words (inbound, expected, outbound).
struct Side {
  int device;
  DeviceBuffer data, packets, tokens;
  explicit Side(int dev) : device(dev), data(dev, kBytes), packets(dev, 2 * kBytes + 4096), tokens(dev, 64) {}
};

MemoryChannelDeviceHandle channel(Side& self, Side& peer, int rank, int peerRank) {
  MemoryChannelDeviceHandle ch;
  ch.dst = peer.data.ptr;
  ch.src = self.data.ptr;
  ch.packets = self.packets.ptr;
  auto* t = self.tokens.as<std::uint64_t>();
  ch.semaphore.inbound = t;
  ch.semaphore.expectedInbound = t + 1;
  ch.semaphore.outbound = t + 2;
  ch.semaphore.remoteInbound = peer.tokens.as<std::uint64_t>();
  ch.semaphore.wait_ = {rank, peerRank, kTimeoutNs};
  return ch;
}

__global__ void putKernel(MemoryChannelDeviceHandle ch, std::uint64_t dstOff, std::uint64_t srcOff,
                          std::uint64_t n) {
  ch.put(dstOff, srcOff, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
__global__ void getKernel(MemoryChannelDeviceHandle ch, std::uint64_t dstOff, std::uint64_t srcOff,
                          std::uint64_t n) {
  ch.get(dstOff, srcOff, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
// One block: put, then signal (ordered by the barrier).
__global__ void putSignalKernel(MemoryChannelDeviceHandle ch, std::uint64_t n) {
  ch.put(0, 0, n, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) ch.signal();
}
// One block: wait, then copy what arrived in our data buffer to `out` (local): if the signal did not
// order the data, `out` holds stale bytes.
__global__ void waitCopyKernel(MemoryChannelDeviceHandle ch, void* out, std::uint64_t n) {
  if (threadIdx.x == 0) ch.wait();
  __syncthreads();
  copy(out, ch.src, n, threadIdx.x, blockDim.x);
}
template <class Packet>
__global__ void putPacketsKernel(MemoryChannelDeviceHandle ch, std::uint64_t n, std::uint32_t flag) {
  ch.putPackets<Packet>(0, 0, n, flag, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
template <class Packet>
__global__ void unpackPacketsKernel(MemoryChannelDeviceHandle ch, std::uint64_t n, std::uint32_t flag) {
  ch.unpackPackets<Packet>(0, 0, n, flag, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
// Ping-pong: each round, side 0 writes the round number into side 1's buffer and signals; side 1
// waits, checks, answers the same way. Errors are counted in *errors.
__global__ void pingPongKernel(MemoryChannelDeviceHandle ch, int role, int rounds, unsigned* errors) {
  auto* mine = static_cast<volatile std::uint64_t*>(ch.src);
  auto* theirs = static_cast<std::uint64_t*>(ch.dst);
  for (int r = 1; r <= rounds; ++r) {
    if (role == 0) {
      theirs[threadIdx.x] = r;
      __syncthreads();
      if (threadIdx.x == 0) ch.signal();
      if (threadIdx.x == 0) ch.wait();
      __syncthreads();
      if (mine[threadIdx.x] != static_cast<std::uint64_t>(r)) atomicAdd(errors, 1);
    } else {
      if (threadIdx.x == 0) ch.wait();
      __syncthreads();
      if (mine[threadIdx.x] != static_cast<std::uint64_t>(r)) atomicAdd(errors, 1);
      theirs[threadIdx.x] = r;
      __syncthreads();
      if (threadIdx.x == 0) ch.signal();
    }
  }
}
// Signal-only round trips between one thread on each GPU: the latency floor of a MemoryChannel.
__global__ void signalRoundTripKernel(MemoryChannelDeviceHandle ch, int role, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (role == 0) {
      ch.signal();
      ch.wait();
    } else {
      ch.wait();
      ch.signal();
    }
  }
}

class TwoGpus : public ::testing::Test {
 public:
  void SetUp() override {
    int second = 1;  // side b's GPU
    if (gpuCount() < 2) {
      if (!sidesMayShareAGpu() || !shareGpus()) GTEST_SKIP() << "needs 2 GPUs";
      second = 0;
    }
    for (int d : {0, second}) {
      if (second == 0) break;
      int can = 0;
      cudaDeviceCanAccessPeer(&can, d, 1 - d);
      if (!can) GTEST_SKIP() << "GPUs 0 and 1 cannot access each other";
      cudaSetDevice(d);
      cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    }
    a = std::make_unique<Side>(0);
    b = std::make_unique<Side>(second);
    ab = channel(*a, *b, 0, 1);
    ba = channel(*b, *a, 1, 0);
  }
  void poison(Side& s) {
    cudaSetDevice(s.device);
    cudaMemset(s.data.ptr, kPoison, kBytes);
    cudaDeviceSynchronize();
  }
  void upload(Side& s, const std::vector<unsigned char>& v) {
    cudaSetDevice(s.device);
    cudaMemcpy(s.data.ptr, v.data(), v.size(), cudaMemcpyHostToDevice);
  }
  std::vector<unsigned char> download(Side& s, void* ptr = nullptr) {
    std::vector<unsigned char> v(kBytes);
    cudaSetDevice(s.device);
    cudaMemcpy(v.data(), ptr ? ptr : s.data.ptr, kBytes, cudaMemcpyDeviceToHost);
    return v;
  }
  std::unique_ptr<Side> a, b;
  MemoryChannelDeviceHandle ab, ba;

 protected:
  // The test's kernels never wait for each other, so both sides may be on one GPU (where two
  // kernels of the legacy stream run one after the other).
  virtual bool sidesMayShareAGpu() const { return false; }
};

class TwoSides : public TwoGpus {
 protected:
  bool sidesMayShareAGpu() const override { return true; }
};

// Expect dst[dOff, +n) == src[sOff, +n) and every other byte still poison.
void expectCopied(const std::vector<unsigned char>& dst, const std::vector<unsigned char>& src,
                  std::size_t dOff, std::size_t sOff, std::size_t n) {
  for (std::size_t i = 0; i < dst.size(); ++i) {
    unsigned char want = (i >= dOff && i < dOff + n) ? src[sOff + i - dOff] : kPoison;
    if (dst[i] != want) {
      ADD_FAILURE() << "byte " << i << " is " << int(dst[i]) << ", want " << int(want) << " (dOff " << dOff
                    << ", sOff " << sOff << ", n " << n << ")";
      return;
    }
  }
}

TEST_F(TwoSides, PutAndGetAnySizeAndAlignment) {
  std::mt19937 rng(42);
  std::vector<std::size_t> sizes = {1, 3, 15, 16, 17, 4095, 65537, 1 << 20, (16 << 20) + 5};
  for (int i = 0; i < 6; ++i) sizes.push_back(std::uniform_int_distribution<std::size_t>(1, 8 << 20)(rng));
  for (std::size_t n : sizes) {
    std::size_t dOff = rng() % 64, sOff = rng() % 64;
    auto src = randomBytes(kBytes, static_cast<std::uint32_t>(n));
    upload(*a, src);
    poison(*b);
    cudaSetDevice(0);
    putKernel<<<8, 256>>>(ab, dOff, sOff, n);
    GPU_CHECK(cudaDeviceSynchronize());
    expectCopied(download(*b), src, dOff, sOff, n);
    // get: a reads b's bytes back into its own buffer.
    poison(*a);
    cudaSetDevice(0);
    getKernel<<<8, 256>>>(ab, dOff, sOff, n);
    GPU_CHECK(cudaDeviceSynchronize());
    expectCopied(download(*a), src, sOff, sOff, n);
  }
}

TEST_F(TwoGpus, SignalOrdersThePutBeforeIt) {
  DeviceBuffer out(1, kBytes);
  for (std::size_t n : {1ul, 4097ul, 1ul << 20}) {
    auto src = randomBytes(kBytes, static_cast<std::uint32_t>(n) + 7);
    upload(*a, src);
    poison(*b);
    cudaSetDevice(1);
    cudaMemset(out.ptr, kPoison, kBytes);
    waitCopyKernel<<<1, 512>>>(ba, out.ptr, n);  // spins until a's signal
    cudaSetDevice(0);
    putSignalKernel<<<1, 512>>>(ab, n);
    GPU_CHECK(cudaDeviceSynchronize());
    cudaSetDevice(1);
    GPU_CHECK(cudaDeviceSynchronize());
    expectCopied(download(*b, out.ptr), src, 0, 0, n);
  }
}

template <class Packet>
void packetsRoundTrip(TwoGpus& t, Side& a, Side& b, MemoryChannelDeviceHandle& ab,
                      MemoryChannelDeviceHandle& ba) {
  std::mt19937 rng(3);
  std::uint32_t flag = 0;
  for (std::size_t n : {4ul, 12ul, 1000ul, 65536ul, (4ul << 20) + 4}) {
    n = n / Packet::kDataBytes * Packet::kDataBytes +
        (rng() % 2 ? 0 : Packet::kDataBytes - 1);  // odd tails too
    auto src = randomBytes(kBytes, static_cast<std::uint32_t>(n));
    t.upload(a, src);
    t.poison(b);
    ++flag;
    // Redirect the packets into b's packet buffer: ab.dst is b's data buffer, so use a copy.
    MemoryChannelDeviceHandle toPackets = ab;
    toPackets.dst = b.packets.ptr;
    cudaSetDevice(1);
    unpackPacketsKernel<Packet><<<16, 256>>>(ba, n, flag);
    cudaSetDevice(0);
    putPacketsKernel<Packet><<<16, 256>>>(toPackets, n, flag);
    GPU_CHECK(cudaDeviceSynchronize());
    cudaSetDevice(1);
    GPU_CHECK(cudaDeviceSynchronize());
    expectCopied(t.download(b), src, 0, 0, n);
  }
}
TEST_F(TwoGpus, LL16Packets) { packetsRoundTrip<LL16Packet>(*this, *a, *b, ab, ba); }
TEST_F(TwoGpus, LL8Packets) { packetsRoundTrip<LL8Packet>(*this, *a, *b, ab, ba); }

TEST_F(TwoGpus, PingPongOrdersEveryRound) {
  DeviceBuffer errors(0, sizeof(unsigned));
  constexpr int kRounds = 10000;
  cudaSetDevice(1);
  pingPongKernel<<<1, 128>>>(ba, 1, kRounds, errors.as<unsigned>());
  cudaSetDevice(0);
  pingPongKernel<<<1, 128>>>(ab, 0, kRounds, errors.as<unsigned>());
  GPU_CHECK(cudaDeviceSynchronize());
  cudaSetDevice(1);
  GPU_CHECK(cudaDeviceSynchronize());
  unsigned host = 1;
  cudaSetDevice(0);
  cudaMemcpy(&host, errors.ptr, sizeof(host), cudaMemcpyDeviceToHost);
  EXPECT_EQ(host, 0u);
}

TEST_F(TwoGpus, BenchSignalRoundTripAndPutBandwidth) {
  constexpr int kRounds = 20000;
  for (int rep = 0; rep < 2; ++rep) {  // first is warm-up
    auto start = std::chrono::steady_clock::now();
    cudaSetDevice(1);
    signalRoundTripKernel<<<1, 1>>>(ba, 1, kRounds);
    cudaSetDevice(0);
    signalRoundTripKernel<<<1, 1>>>(ab, 0, kRounds);
    GPU_CHECK(cudaDeviceSynchronize());
    cudaSetDevice(1);
    GPU_CHECK(cudaDeviceSynchronize());
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (rep) std::printf("BENCH memory_channel_signal_round_trip_us %.3f\n", us / kRounds);
  }
  cudaSetDevice(0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  for (std::size_t n : {1ul << 20, 16ul << 20, 64ul << 20}) {
    std::vector<float> times;
    for (int i = 0; i < 7; ++i) {
      cudaEventRecord(e0);
      putKernel<<<prop.multiProcessorCount, 1024>>>(ab, 0, 0, n);
      cudaEventRecord(e1);
      GPU_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    std::printf("BENCH memory_channel_put_GBps bytes=%zu %.1f\n", n, n / (times[3] * 1e6));
  }
}

// A wait that is never signalled must end the kernel with a report, not hang. The trap breaks the
// CUDA context, so it runs in a fresh process (threadsafe death test re-executes the binary).
TEST_F(TwoGpus, WaitWithoutSignalTimesOut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [&] {
    dup2(2, 1);  // device printf goes to stdout; the death test reads stderr
    MemoryChannelDeviceHandle ch = ab;
    ch.semaphore.wait_.timeoutNs = 200'000'000ull;
    cudaSetDevice(0);
    DeviceBuffer out(0, 64);
    waitCopyKernel<<<1, 32>>>(ch, out.ptr, 1);
    cudaError_t e = cudaDeviceSynchronize();
    std::fflush(stdout);
    std::fprintf(stderr, "sync returned %s\n", cudaGetErrorName(e));
    std::exit(e == cudaSuccess ? 1 : 42);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(42), "rank 0: semaphore wait waiting for rank 1 timed out");
}

}  // namespace
}  // namespace ferry::test
