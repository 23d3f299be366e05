#include "ferry-perf/primitives.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/cuda_check.hpp"
#include "ferry/communicator.hpp"
#include "ferry/device/memory_channel.hpp"
#include "ferry/device/port_channel.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "ferry/memory_channel.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/proxy.hpp"
#include "ferry/semaphore.hpp"

namespace ferry::tools {
namespace {

constexpr unsigned char kPoison = 0x5A;

// Byte i of what rank r sends.
__host__ __device__ inline unsigned char pattern(int r, std::uint64_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(r) << 48) ^ i;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return static_cast<unsigned char>(x >> 56);
}

__global__ void fillPattern(unsigned char* out, std::uint64_t n, int r) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = pattern(r, i);
}

// Bytes of slot p (p != self) of recv that are not rank p's first n pattern bytes.
__global__ void countWrong(const unsigned char* recv, std::uint64_t slot, int nranks, int self, std::uint64_t n,
                           unsigned long long* wrong) {
  for (int p = 0; p < nranks; ++p) {
    if (p == self) continue;
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
      if (recv[p * slot + i] != pattern(p, i)) atomicAdd(wrong, 1ull);
  }
}

// relaxed: relaxedSignal() (no fence before the flag's store, what the hardware's flag latency
// measures) instead of signal() (a system-scope release, which orders data before the flag).
template <class Handle, bool relaxed = false>
__global__ void signalRoundTrip(Handle ch, bool first, int rounds) {
  auto signal = [&] {
    if constexpr (relaxed)
      ch.relaxedSignal();
    else
      ch.signal();
  };
  for (int i = 0; i < rounds; ++i) {
    if (first) {
      signal();
      ch.wait();
    } else {
      ch.wait();
      signal();
    }
  }
}

// Grid (blocks per peer, peers): row y puts n bytes into peer y's slot for this rank, then (one
// thread) signals it and waits for its signal, so the kernel ends when every peer has its bytes.
__global__ void memoryPut(MemoryChannelDeviceHandle* chans, int self, std::uint64_t slot, std::uint64_t n) {
  MemoryChannelDeviceHandle ch = chans[blockIdx.y];
  ch.put(self * slot, 0, n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}
__global__ void memorySignalAll(MemoryChannelDeviceHandle* chans, int peers) {
  if (threadIdx.x < peers) {
    chans[threadIdx.x].signal();
    chans[threadIdx.x].wait();
  }
}
// Thread 0 of block b drives the port channel to peer b: put, signal, flush, then wait for the
// peer's bytes.
__global__ void portPut(PortChannelDeviceHandle* chans, int self, std::uint64_t slot, std::uint64_t n) {
  if (threadIdx.x != 0) return;
  chans[blockIdx.x].putWithSignalAndFlush(self * slot, 0, n);
  chans[blockIdx.x].wait();
}

// FIFO round trip: push, wait until the proxy handled it, `rounds` times.
__global__ void fifoRoundTrip(FifoDeviceHandle fifo, int rounds) {
  for (int i = 0; i < rounds; ++i) fifo.sync(fifo.push({1, static_cast<std::uint64_t>(i)}));
}
// For the pickup estimate: when the host sets go to i, push trigger i (rounds times)...
__global__ void pushOnGo(FifoDeviceHandle fifo, const volatile std::uint64_t* go, int rounds) {
  for (int i = 1; i <= rounds; ++i) {
    while (*go < static_cast<std::uint64_t>(i)) {
    }
    fifo.push({2, static_cast<std::uint64_t>(i)});
  }
}
// ...and, for calibration, echo go back through host memory instead.
__global__ void echoOnGo(const volatile std::uint64_t* go, volatile std::uint64_t* echo, int rounds) {
  for (int i = 1; i <= rounds; ++i) {
    while (*go < static_cast<std::uint64_t>(i)) {
    }
    *echo = static_cast<std::uint64_t>(i);
    __threadfence_system();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Everything one rank sets up: a send buffer, a receive buffer with one slot per rank, and a
// MemoryChannel and a PortChannel to every peer over CUDA IPC.
struct Setup {
  int rank, n;
  std::uint64_t slot;
  std::shared_ptr<Bootstrap> boot;
  std::unique_ptr<Communicator> comm;
  std::shared_ptr<unsigned char> send, recv;
  std::vector<std::shared_ptr<MemoryDevice2DeviceSemaphore>> memSems;
  std::vector<std::shared_ptr<Host2DeviceSemaphore>> portSems;
  std::vector<MemoryChannel> memory;
  std::unique_ptr<PortChannelService> service;
  std::vector<PortChannel> port;
  MemoryChannelDeviceHandle* memoryDev = nullptr;  // one per peer, in peer order (self skipped)
  PortChannelDeviceHandle* portDev = nullptr;
  unsigned long long* wrongDev = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;

  Setup(const RankInfo& info, std::uint64_t slotBytes) : rank(info.rank), n(info.worldSize), slot(slotBytes), boot(info.bootstrap) {
    comm = std::make_unique<Communicator>(boot);
    send = gpuCallocShared<unsigned char>(slot);
    recv = gpuCallocShared<unsigned char>(slot * n);
    auto recvMem = comm->registerMemory(recv.get(), slot * n, Transport::CudaIpc);
    auto sendMem = comm->registerMemory(send.get(), slot, Transport::CudaIpc);
    std::vector<int> peers;
    std::vector<std::shared_future<std::shared_ptr<Connection>>> conns;
    std::vector<std::shared_future<RegisteredMemory>> theirRecv;
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      peers.push_back(p);
      conns.push_back(comm->connect(p, Transport::CudaIpc));
      comm->sendMemory(recvMem, p, 1);
      theirRecv.push_back(comm->recvMemory(p, 1));
    }
    service = std::make_unique<PortChannelService>();
    std::vector<MemoryChannelDeviceHandle> mh;
    std::vector<PortChannelDeviceHandle> ph;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      auto c = conns[i].get();
      memSems.push_back(std::make_shared<MemoryDevice2DeviceSemaphore>(*comm, c, 2));
      portSems.push_back(std::make_shared<Host2DeviceSemaphore>(*comm, c, 3));
      memory.emplace_back(memSems.back(), theirRecv[i].get(), send.get());
      mh.push_back(memory.back().deviceHandle());
      port.push_back(service->addChannel(portSems.back(), theirRecv[i].get(), sendMem));
      ph.push_back(port.back().deviceHandle());
    }
    service->start();
    FERRY_TOOL_CUDA(cudaMalloc(&memoryDev, sizeof(MemoryChannelDeviceHandle) * std::max<std::size_t>(1, mh.size())));
    FERRY_TOOL_CUDA(cudaMalloc(&portDev, sizeof(PortChannelDeviceHandle) * std::max<std::size_t>(1, ph.size())));
    FERRY_TOOL_CUDA(cudaMemcpy(memoryDev, mh.data(), sizeof(mh[0]) * mh.size(), cudaMemcpyHostToDevice));
    FERRY_TOOL_CUDA(cudaMemcpy(portDev, ph.data(), sizeof(ph[0]) * ph.size(), cudaMemcpyHostToDevice));
    FERRY_TOOL_CUDA(cudaMalloc(&wrongDev, sizeof(unsigned long long)));
    FERRY_TOOL_CUDA(cudaEventCreate(&e0));
    FERRY_TOOL_CUDA(cudaEventCreate(&e1));
    boot->barrier();
  }
  ~Setup() {
    (void)cudaDeviceSynchronize();
    boot->barrier();  // nobody unmaps memory a peer may still write
    service->stop();
    (void)cudaFree(memoryDev);
    (void)cudaFree(portDev);
    (void)cudaFree(wrongDev);
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
  }

  // Median over samples of the GPU time of launch() on this rank, every rank taking part in the
  // barriers (ranks with nothing to do launch nothing).
  double timeMs(int samples, const std::function<void()>& launch) {
    std::vector<double> t;
    for (int i = 0; i < samples + 2; ++i) {
      boot->barrier();
      FERRY_TOOL_CUDA(cudaEventRecord(e0));
      launch();
      FERRY_TOOL_CUDA(cudaEventRecord(e1));
      FERRY_TOOL_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      FERRY_TOOL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 2) t.push_back(ms);
    }
    return median(t);
  }

  // Fills send, poisons recv, runs put (which must deliver bytes to every peer's slot for this
  // rank), and returns the wrong bytes in this rank's slots, added over all ranks (same on all).
  std::uint64_t check(std::uint64_t bytes, const std::function<void()>& put) {
    fillPattern<<<132, 512>>>(send.get(), bytes, rank);
    FERRY_TOOL_CUDA(cudaMemset(recv.get(), kPoison, slot * n));
    FERRY_TOOL_CUDA(cudaMemset(wrongDev, 0, sizeof(unsigned long long)));
    FERRY_TOOL_CUDA(cudaDeviceSynchronize());
    boot->barrier();
    put();
    FERRY_TOOL_CUDA(cudaDeviceSynchronize());
    boot->barrier();
    countWrong<<<132, 512>>>(recv.get(), slot, n, rank, bytes, wrongDev);
    unsigned long long mine = 0;
    FERRY_TOOL_CUDA(cudaMemcpy(&mine, wrongDev, sizeof(mine), cudaMemcpyDeviceToHost));
    std::vector<unsigned long long> all(n);
    all[rank] = mine;
    boot->allGather(all.data(), sizeof(mine));
    std::uint64_t sum = 0;
    for (auto w : all) sum += w;
    return sum;
  }
};

// Estimates push -> handler start with host clocks: the host raises `go` and notes the time; the
// kernel, spinning on `go`, pushes; the handler notes when it starts. That span also holds the
// host write reaching the GPU, which the echo kernel measures (host -> GPU -> host, halved).
void fifoLatencies(const PerfOptions& o, std::vector<PerfRow>& rows) {
  using Clock = std::chrono::steady_clock;
  const int rounds = std::max(10, o.roundTrips / 10);
  std::atomic<std::uint64_t> handled{0};
  std::vector<Clock::time_point> pickedAt(rounds + 1);
  Proxy proxy([&](ProxyTrigger t) {
    if (t.fst == 2) pickedAt[t.snd] = Clock::now();
    handled.store(t.snd, std::memory_order_release);
    return ProxyHandlerResult::Continue;
  });
  proxy.start();
  std::uint64_t* flags = nullptr;  // [0] go, [1] echo: mapped pinned memory
  FERRY_TOOL_CUDA(cudaHostAlloc(&flags, 2 * sizeof(std::uint64_t), cudaHostAllocMapped));
  std::uint64_t* flagsDev = nullptr;
  FERRY_TOOL_CUDA(cudaHostGetDevicePointer(&flagsDev, flags, 0));
  auto* go = reinterpret_cast<volatile std::uint64_t*>(flags);
  auto* echo = reinterpret_cast<volatile std::uint64_t*>(flags + 1);

  cudaEvent_t e0, e1;
  FERRY_TOOL_CUDA(cudaEventCreate(&e0));
  FERRY_TOOL_CUDA(cudaEventCreate(&e1));
  std::vector<double> trips;
  for (int s = 0; s < o.samples + 2; ++s) {
    FERRY_TOOL_CUDA(cudaEventRecord(e0));
    fifoRoundTrip<<<1, 1>>>(proxy.fifo().deviceHandle(), rounds);
    FERRY_TOOL_CUDA(cudaEventRecord(e1));
    FERRY_TOOL_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    FERRY_TOOL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (s >= 2) trips.push_back(ms * 1e3 / rounds);
  }
  rows.push_back({"fifo_round_trip", 0, median(trips), "us"});

  // Each round: let the kernel reach its spin, note the time, raise go; the span ends when the
  // echo is back (calibration) or when the handler started (pickup).
  const auto raise = [&](int i) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    const auto t0 = Clock::now();
    *go = static_cast<std::uint64_t>(i);
    return t0;
  };
  *go = 0;
  *echo = 0;
  echoOnGo<<<1, 1>>>(flagsDev, flagsDev + 1, rounds);
  std::vector<double> echoes, pickups;
  for (int i = 1; i <= rounds; ++i) {
    const auto t0 = raise(i);
    while (*echo < static_cast<std::uint64_t>(i)) {
    }
    echoes.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  FERRY_TOOL_CUDA(cudaDeviceSynchronize());
  *go = 0;
  handled.store(0);  // the round trips above counted too
  pushOnGo<<<1, 1>>>(proxy.fifo().deviceHandle(), flagsDev, rounds);
  for (int i = 1; i <= rounds; ++i) {
    const auto t0 = raise(i);
    while (handled.load(std::memory_order_acquire) < static_cast<std::uint64_t>(i)) {
    }
    pickups.push_back(std::chrono::duration<double, std::micro>(pickedAt[i] - t0).count());
  }
  FERRY_TOOL_CUDA(cudaDeviceSynchronize());
  const double echoUs = median(echoes), pickupUs = median(pickups);
  rows.push_back({"host_gpu_flag_round_trip", 0, echoUs, "us"});
  rows.push_back({"fifo_pickup_estimate", 0, std::max(0.0, pickupUs - echoUs / 2), "us"});
  proxy.stop();
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaFreeHost(flags);
}

}  // namespace

int runPrimitives(const PerfOptions& o, const RankInfo& info, int devices) {
  const int rank = info.rank, n = info.worldSize, peers = n - 1;
  const std::uint64_t maxBytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  Setup s(info, maxBytes);
  cudaDeviceProp prop{};
  int device = 0;
  FERRY_TOOL_CUDA(cudaGetDevice(&device));
  FERRY_TOOL_CUDA(cudaGetDeviceProperties(&prop, device));
  std::vector<PerfRow> rows;

  // Round trips between ranks 0 and 1 (peer index 0 of each is the other).
  const MemoryChannelDeviceHandle mc = s.memory[0].deviceHandle();
  const PortChannelDeviceHandle pc = s.port[0].deviceHandle();
  double ms = s.timeMs(o.samples, [&] {
    if (rank < 2) signalRoundTrip<<<1, 1>>>(mc, rank == 0, o.roundTrips);
  });
  rows.push_back({"memory_channel_round_trip", 0, ms * 1e3 / o.roundTrips, "us"});
  ms = s.timeMs(o.samples, [&] {
    if (rank < 2) signalRoundTrip<MemoryChannelDeviceHandle, true><<<1, 1>>>(mc, rank == 0, o.roundTrips);
  });
  rows.push_back({"memory_channel_relaxed_round_trip", 0, ms * 1e3 / o.roundTrips, "us"});
  const int portTrips = std::max(10, o.roundTrips / 10);
  ms = s.timeMs(o.samples, [&] {
    if (rank < 2) signalRoundTrip<<<1, 1>>>(pc, rank == 0, portTrips);
  });
  rows.push_back({"port_channel_round_trip", 0, ms * 1e3 / portTrips, "us"});
  if (rank == 0) fifoLatencies(o, rows);
  s.boot->barrier();

  int status = 0;
  for (std::uint64_t bytes : o.sizes) {
    const dim3 allPairs(std::max(1, prop.multiProcessorCount / peers), peers), pair(prop.multiProcessorCount, 1);
    const auto memoryAll = [&] {
      memoryPut<<<allPairs, 1024>>>(s.memoryDev, rank, s.slot, bytes);
      memorySignalAll<<<1, 32>>>(s.memoryDev, peers);
    };
    const auto portAll = [&] { portPut<<<peers, 32>>>(s.portDev, rank, s.slot, bytes); };
    const std::uint64_t memoryWrong = s.check(bytes, memoryAll), portWrong = s.check(bytes, portAll);
    if (memoryWrong + portWrong != 0) status = 1;
    ms = s.timeMs(o.samples, memoryAll);
    rows.push_back({"memory_channel_put_all_pairs", bytes, bytes * peers / (ms * 1e6), "GB/s per GPU", memoryWrong});
    ms = s.timeMs(o.samples, portAll);
    rows.push_back({"port_channel_put_all_pairs", bytes, bytes * peers / (ms * 1e6), "GB/s per GPU", portWrong});
    // Rank 0 -> rank 1 alone (rank 1 is memory[0]'s and port[0]'s peer of rank 0).
    ms = s.timeMs(o.samples, [&] {
      if (rank == 0) memoryPut<<<pair, 1024>>>(s.memoryDev, rank, s.slot, bytes);
    });
    rows.push_back({"memory_channel_put_pair", bytes, bytes / (ms * 1e6), "GB/s", memoryWrong});
    ms = s.timeMs(o.samples, [&] {
      if (rank == 0) portPut<<<1, 32>>>(s.portDev, rank, s.slot, bytes);
      if (rank == 1) portPut<<<1, 32>>>(s.portDev, rank, s.slot, 0);  // the signal rank 0 waits for
    });
    rows.push_back({"port_channel_put_pair", bytes, bytes / (ms * 1e6), "GB/s", portWrong});
  }
  FERRY_TOOL_CUDA(cudaDeviceSynchronize());

  if (rank == 0) {
    std::printf("# ferry-perf: %d ranks on %d GPU(s) (%s)%s\n", n, devices, prop.name,
                devices < n ? "; ranks share GPUs, so the times say nothing about the hardware" : "");
    std::printf("%-30s %12s %14s %-13s %7s\n", "what", "bytes", "value", "unit", "#wrong");
    for (const auto& r : rows)
      std::printf("%-30s %12llu %14.3f %-13s %7llu\n", r.what.c_str(), static_cast<unsigned long long>(r.bytes),
                  r.value, r.unit.c_str(), static_cast<unsigned long long>(r.wrong));
    if (!o.jsonPath.empty()) {
      nlohmann::json j = {{"ranks", n}, {"gpus", devices}, {"gpu", prop.name}, {"rows", nlohmann::json::array()}};
      for (const auto& r : rows)
        j["rows"].push_back({{"what", r.what}, {"bytes", r.bytes}, {"value", r.value}, {"unit", r.unit}, {"wrong", r.wrong}});
      std::ofstream(o.jsonPath) << j.dump(2) << "\n";
    }
  }
  return status;
}

}  // namespace ferry::tools
