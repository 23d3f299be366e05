// Point-to-point send and recv across processes, one per GPU (or sharing one: GPU_TESTS_SHARE_GPUS),
// on 2 and 4 ranks, every byte checked against what the sender wrote, receive buffers poisoned
// first: a group where every rank sends to and receives from every rank (itself included) with a
// different size per pair; several messages to one peer in one group; long ungrouped streams
// between two ranks that overrun what the inbox holds (two chunks a lane); odd sizes and unaligned
// buffers; a group captured in a CUDA graph and replayed; a recv whose sender never comes; and a
// send and recv of different sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/errors.hpp"
#include "gpu_test_process.hpp"
#include "gpu_test_util.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

constexpr unsigned char kPoison = 0xA5;

const bool kEnvironmentSet = [] {
  ::setenv("FERRY_DEVICE_TIMEOUT", "10", 1);
  ::setenv("FERRY_SCRATCH_BYTES", "1M", 1);  // the collectives' buffers are not used here
  return true;
}();

struct Rank {
  int rank, size, device;
  std::shared_ptr<TcpBootstrap> boot;
  std::unique_ptr<Comm> comm;
  cudaStream_t stream = nullptr;
  Rank(const UniqueId& id, int r, int n, const CommOptions& options = {})
      : rank(r), size(n), device(rankDevice(r)) {
    cudaSetDevice(device);
    boot = TcpBootstrap::create(id, r, n);
    comm = std::make_unique<Comm>(boot, options);
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  }
  ~Rank() { cudaStreamDestroy(stream); }
};

// The bytes rank `from` sends to rank `to` as its message number `k`.
std::vector<unsigned char> message(int from, int to, int k, std::size_t bytes) {
  return randomBytes(bytes, static_cast<std::uint32_t>(from * 7919 + to * 104729 + k * 31 + bytes));
}

std::size_t wrongBytes(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != want[i];
  return wrong;
}

class GpuP2P : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

// Every rank sends to every rank and receives from every rank in one group; pair (s, r) carries a
// size of its own, from 1 byte to more than the inbox holds at once (two chunks a lane). Then again
// on a Comm bounded to 3 blocks per group (CommOptions::maxBlocks, on one rank only): its streams'
// blocks each serve many lanes, while its peers' serve one each.
TEST_P(GpuP2P, GroupedAllToAllWithADifferentSizePerPair) {
  const int n = GetParam();
  const UniqueId ids[] = {UniqueId::create(), UniqueId::create()};
  runRanksOk(n,
             [&](int rank) {
               auto pairBytes = [&](int s, int d, int round) -> std::size_t {
                 const std::size_t sizes[] = {
                     1, 3, 1023, 40000, 70001, 3u << 20, 5 * 1024 * 1024 + 7, 20 * 1024 * 1024 + 9};
                 return sizes[(s * 3 + d * 5 + round) % std::size(sizes)];
               };
               auto rounds = [&](Rank& r, int first) {
                 for (int round = first; round < first + 4; ++round) {
                   std::vector<std::unique_ptr<DeviceBuffer>> sendBufs, recvBufs;
                   for (int p = 0; p < n; ++p) {
                     const auto out = message(rank, p, round, pairBytes(rank, p, round));
                     sendBufs.push_back(std::make_unique<DeviceBuffer>(r.device, out.size()));
                     cudaMemcpy(sendBufs.back()->ptr, out.data(), out.size(), cudaMemcpyHostToDevice);
                     recvBufs.push_back(std::make_unique<DeviceBuffer>(r.device, pairBytes(p, rank, round)));
                     cudaMemset(recvBufs.back()->ptr, kPoison, recvBufs.back()->bytes);
                   }
                   cudaDeviceSynchronize();
                   r.comm->groupStart();
                   for (int i = 0; i < n; ++i) {
                     // Each rank lists its peers in its own order: matching goes by pair, not by position.
                     const int p = (rank + i) % n;
                     r.comm->send(sendBufs[p]->ptr, sendBufs[p]->bytes, DataType::Uint8, p, r.stream);
                     r.comm->recv(recvBufs[(rank + n - i) % n]->ptr, recvBufs[(rank + n - i) % n]->bytes,
                                  DataType::Uint8, (rank + n - i) % n, r.stream);
                   }
                   r.comm->groupEnd();
                   ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
                   for (int p = 0; p < n; ++p) {
                     std::vector<unsigned char> got(recvBufs[p]->bytes);
                     cudaMemcpy(got.data(), recvBufs[p]->ptr, got.size(), cudaMemcpyDeviceToHost);
                     EXPECT_EQ(wrongBytes(got, message(p, rank, round, got.size())), 0u)
                         << "round " << round << ": from rank " << p << " to rank " << rank << ", "
                         << got.size() << " bytes";
                   }
                 }
               };
               {
                 Rank r(ids[0], rank, n);
                 rounds(r, 0);
               }
               if (::testing::Test::HasFailure()) return;
               Rank bounded(ids[1], rank, n, CommOptions{0, rank == 0 ? 3 : 0});
               rounds(bounded, 4);
             },
             {std::chrono::seconds(600)});
}

// Several messages to one peer in one group (as torch's batch_isend_irecv makes): they match the
// peer's recvs in issue order, whatever their sizes, and later messages still line up.
TEST_P(GpuP2P, SeveralMessagesToOnePeerInOneGroup) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const std::size_t sizes[] = {3u << 20, 1, 100000, 40000, 65536, 65537, 16385, 5u << 20};
    for (int round = 0; round < 3; ++round) {
      std::vector<std::unique_ptr<DeviceBuffer>> out, in;
      for (std::size_t k = 0; k < std::size(sizes); ++k) {
        const auto data = message(rank, next, round * 10 + static_cast<int>(k), sizes[k]);
        out.push_back(std::make_unique<DeviceBuffer>(r.device, sizes[k]));
        cudaMemcpy(out.back()->ptr, data.data(), sizes[k], cudaMemcpyHostToDevice);
        in.push_back(std::make_unique<DeviceBuffer>(r.device, sizes[k]));
        cudaMemset(in.back()->ptr, kPoison, sizes[k]);
      }
      cudaDeviceSynchronize();
      r.comm->groupStart();
      for (std::size_t k = 0; k < std::size(sizes); ++k) {  // sends and recvs interleaved
        r.comm->recv(in[k]->ptr, sizes[k], DataType::Uint8, prev, r.stream);
        r.comm->send(out[k]->ptr, sizes[k], DataType::Uint8, next, r.stream);
      }
      r.comm->groupEnd();
      ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
      for (std::size_t k = 0; k < std::size(sizes); ++k) {
        std::vector<unsigned char> got(sizes[k]);
        cudaMemcpy(got.data(), in[k]->ptr, got.size(), cudaMemcpyDeviceToHost);
        EXPECT_EQ(wrongBytes(got, message(prev, rank, round * 10 + static_cast<int>(k), sizes[k])), 0u)
            << "round " << round << " message " << k << " from rank " << prev;
      }
    }
  }, {std::chrono::seconds(600)});
}

// Rank 0 sends a stream of messages to rank 1 without groups, some larger than the inbox holds at
// once (two chunks a lane: the sender waits for the receiver), in several types, from unaligned
// addresses, into unaligned ones.
TEST_P(GpuP2P, UngroupedStreamOfOddSizesAndOffsets) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    struct Msg {
      DataType type;
      std::size_t count, offsetElems;
    };
    const Msg msgs[] = {{DataType::Uint8, 1, 1},       {DataType::Float32, 3, 1},
                        {DataType::BFloat16, 4099, 3}, {DataType::Int64, 1 << 20, 1},
                        {DataType::Uint8, 333333, 7},  {DataType::Float16, 3 << 20, 0},
                        {DataType::Float64, 17, 2},    {DataType::Int32, 5000000, 1}};
    const int from = 0, to = n - 1;
    if (rank != from && rank != to) return;
    int k = 0;
    for (const Msg& m : msgs) {
      const std::size_t es = sizeOf(m.type), bytes = m.count * es, off = m.offsetElems * es;
      DeviceBuffer buf(r.device, bytes + off);
      const auto data = message(from, to, k, bytes);
      if (rank == from)
        cudaMemcpy(buf.as<char>() + off, data.data(), bytes, cudaMemcpyHostToDevice);
      else
        cudaMemset(buf.ptr, kPoison, bytes + off);
      // The copy and the memset run on the legacy stream, which r.stream (non-blocking) does not
      // wait for; both may return before they are done.
      cudaDeviceSynchronize();
      if (rank == from)
        r.comm->send(buf.as<char>() + off, m.count, m.type, to, r.stream);
      else
        r.comm->recv(buf.as<char>() + off, m.count, m.type, from, r.stream);
      ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess) << "message " << k;
      if (rank == to) {
        std::vector<unsigned char> got(bytes + off), poison(off, kPoison);
        cudaMemcpy(got.data(), buf.ptr, got.size(), cudaMemcpyDeviceToHost);
        EXPECT_EQ(std::memcmp(got.data(), poison.data(), off), 0) << "message " << k << " wrote before its buffer";
        got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(off));
        EXPECT_EQ(wrongBytes(got, data), 0u) << "message " << k << ": " << bytes << " bytes";
      }
      ++k;
    }
    // Many small messages queued back to back, received in order without synchronizing between.
    const int kMany = 200;
    std::vector<std::unique_ptr<DeviceBuffer>> bufs;
    for (int i = 0; i < kMany; ++i) {
      const std::size_t bytes = 1 + (i * 7919) % 50000;
      bufs.push_back(std::make_unique<DeviceBuffer>(r.device, bytes));
      if (rank == from) {
        const auto data = message(from, to, 1000 + i, bytes);
        cudaMemcpy(bufs.back()->ptr, data.data(), bytes, cudaMemcpyHostToDevice);
      } else {
        cudaMemset(bufs.back()->ptr, kPoison, bytes);
      }
    }
    cudaDeviceSynchronize();
    for (int i = 0; i < kMany; ++i) {
      if (rank == from)
        r.comm->send(bufs[i]->ptr, bufs[i]->bytes, DataType::Uint8, to, r.stream);
      else
        r.comm->recv(bufs[i]->ptr, bufs[i]->bytes, DataType::Uint8, from, r.stream);
    }
    ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
    if (rank == to)
      for (int i = 0; i < kMany; ++i) {
        std::vector<unsigned char> got(bufs[i]->bytes);
        cudaMemcpy(got.data(), bufs[i]->ptr, got.size(), cudaMemcpyDeviceToHost);
        EXPECT_EQ(wrongBytes(got, message(from, to, 1000 + i, got.size())), 0u) << "small message " << i;
      }
  }, {std::chrono::seconds(600)});
}

// A ring exchange (send to the next rank, recv from the previous) captured once and replayed.
TEST_P(GpuP2P, GroupCapturedInAGraphAndReplayed) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    const std::size_t bytes = 24 << 20;  // 4 chunks a lane in 2 slots: the lanes wait on each other
    DeviceBuffer out(r.device, bytes), in(r.device, bytes);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    r.comm->groupStart();
    r.comm->send(out.ptr, bytes / 4, DataType::Float32, next, r.stream);
    r.comm->recv(in.ptr, bytes / 4, DataType::Float32, prev, r.stream);
    r.comm->groupEnd();
    ASSERT_EQ(cudaStreamEndCapture(r.stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 5; ++replay) {
      const auto data = message(rank, next, replay, bytes);
      cudaMemcpy(out.ptr, data.data(), bytes, cudaMemcpyHostToDevice);
      cudaMemset(in.ptr, kPoison, bytes);
      cudaDeviceSynchronize();
      r.boot->barrier();  // nobody overwrites a buffer a peer still reads
      ASSERT_EQ(cudaGraphLaunch(exec, r.stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
      std::vector<unsigned char> got(bytes);
      cudaMemcpy(got.data(), in.ptr, bytes, cudaMemcpyDeviceToHost);
      EXPECT_EQ(wrongBytes(got, message(prev, rank, replay, bytes)), 0u) << "replay " << replay;
      r.boot->barrier();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }, {std::chrono::seconds(300)});
}

// Bad calls are errors before anything is queued; a recv whose sender never sends times out.
TEST_P(GpuP2P, BadCallsAndAMissingSender) {
  const int n = GetParam();
  UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    Rank r(id, rank, n);
    DeviceBuffer buf(r.device, 4096);
    auto invalid = [](auto&& f, const char* phrase) {
      try {
        f();
        ADD_FAILURE() << "no error; expected one saying: " << phrase;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
        EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      }
    };
    invalid([&] { r.comm->send(buf.ptr, 4, DataType::Float32, n, r.stream); }, "out of range");
    invalid([&] { r.comm->recv(nullptr, 4, DataType::Float32, 0, r.stream); }, "null");
    invalid([&] { r.comm->send(buf.ptr, 4, DataType::Float32, rank, r.stream); }, "no matching recv");
    invalid([&] { r.comm->groupEnd(); }, "without a matching groupStart");
    std::vector<char> host(64);
    invalid([&] { r.comm->send(host.data(), 4, DataType::Float32, (rank + 1) % n, r.stream); }, "not device memory");
    r.boot->barrier();
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      r.comm->recv(buf.ptr, 1024, DataType::Float32, 1, r.stream);
      const cudaError_t err = cudaStreamSynchronize(r.stream);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_NE(err, cudaSuccess);
      EXPECT_LT(s, 25.0);  // FERRY_DEVICE_TIMEOUT is 10 s here
    }
    r.boot->barrier();
    std::fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);  // the trapped context cannot be torn down cleanly
  }, {std::chrono::seconds(120)});
}

// A recv whose send has another size stops with a report naming both sizes, at once (well inside
// FERRY_DEVICE_TIMEOUT), in either direction, also where one side's message goes as packets and
// the other's as raw chunks (p2p.hpp, kP2PPacketBytes); the sends are small enough to finish
// without the receiver, so only the receiver's kernel stops (ranks may share a GPU).
TEST_P(GpuP2P, SendAndRecvOfDifferentSizesAreAnError) {
  const int n = GetParam();
  struct Case {
    std::size_t sent, expected;  // bytes
    std::size_t then = 0;        // a second send of this many bytes, queued before the recv (0: none)
  };
  // The last: packets, then a raw message whose release the recv sees first; the size packet, not
  // the raw slot's stale size, says what was sent.
  for (const Case c : {Case{1000, 2000}, Case{40000, 4000}, Case{100000, 4000}, Case{4000, 100000},
                       Case{4000, 100000, 100000}}) {
    SCOPED_TRACE(std::to_string(c.sent) + " bytes sent, " + std::to_string(c.expected) + " expected");
    UniqueId id = UniqueId::create();
    runRanksOk(
        n,
        [&](int rank) {
          Rank r(id, rank, n);
          DeviceBuffer buf(r.device, std::max({c.sent, c.expected, c.then}));
          if (rank == 0) {
            r.comm->send(buf.ptr, c.sent, DataType::Uint8, 1, r.stream);
            if (c.then != 0) r.comm->send(buf.ptr, c.then, DataType::Uint8, 1, r.stream);
            EXPECT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
            if (c.then != 0) r.boot->barrier();  // (both sends are in the inbox before the recv)
          } else if (rank == 1) {
            if (c.then != 0) r.boot->barrier();
            cudaError_t err = cudaSuccess;
            const auto start = std::chrono::steady_clock::now();
            const std::string report = capturingStdout([&] {
              r.comm->recv(buf.ptr, c.expected, DataType::Uint8, 0, r.stream);
              err = cudaStreamSynchronize(r.stream);
            });
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            EXPECT_NE(err, cudaSuccess);
            EXPECT_LT(s, 5.0) << "found by the timeout (10 s here), not by the size check";
            const std::string want = "rank 1: recv from rank 0: this recv is " + std::to_string(c.expected) +
                                     " bytes, but rank 0 sent " + std::to_string(c.sent);
            EXPECT_NE(report.find(want), std::string::npos) << report;
          } else if (c.then != 0) {
            r.boot->barrier();  // (every rank takes part in the barrier between the sends and the recv)
          }
          r.boot->barrier();
          std::fflush(stdout);
          _exit(::testing::Test::HasFailure() ? 1 : 0);  // the trapped context cannot be torn down cleanly
        },
        {std::chrono::seconds(120)});
  }
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuP2P, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "gpus"; });

}  // namespace
}  // namespace ferry::test
