// The partners' allreduce (comm/host_partners.hpp): 2 and 3 partners, one process each, over
// Ethernet connections on loopback (nothing of a partner is mapped, so ranks may share a GPU), every
// data type x reduce op, at sizes of one round, of a partial round and of many rounds through a
// small scratch, and calls back to back on one stream. Every element against the host reference in
// rank order (common/collective_data.hpp), on random data.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/host_partners.hpp"
#include "common/collective_data.hpp"
#include "ferry/errors.hpp"
#include "gpu_ranks.hpp"
#include "gpu_test_process.hpp"

namespace ferry::test {
namespace {

using tools::CallShape;

// A buffer on the current device holding rank `host`'s input of `s`.
struct Input {
  explicit Input(const CallShape& s) : bytes(s.count * sizeOf(s.type)) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes), cudaSuccess);
    std::vector<unsigned char> host(bytes);
    tools::fillSend(s.type, host.data(), s.count, s.rank, s.seed);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    // A copy from pageable memory may return before its DMA has landed, and it is ordered only
    // with the legacy stream: the partners' non-blocking stream and their proxy's copies are not.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~Input() { cudaFree(ptr); }
  std::size_t wrong(const CallShape& s) const {
    std::vector<unsigned char> got(bytes), want(bytes);
    EXPECT_EQ(cudaMemcpy(got.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    tools::expectedRecv(s, want.data());
    const std::size_t n = tools::countWrong(s.type, got.data(), want.data(), s.count);
    if (n != 0) where(s, got, want);
    return n;
  }
  // Where the wrong elements lie, by the bytes of each element: the first, and how many in each
  // slot-sized run of elements (a round of the exchange), to tell a stale slot from a torn one.
  void where(const CallShape& s, const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) const {
    const std::size_t es = sizeOf(s.type), perRound = slotBytes / es;
    std::vector<std::size_t> rounds((s.count + perRound - 1) / perRound);
    std::size_t first = s.count;
    for (std::size_t i = 0; i < s.count; ++i)
      if (std::memcmp(&got[i * es], &want[i * es], es) != 0) {
        first = std::min(first, i);
        ++rounds[i / perRound];
      }
    std::string text = "rank " + std::to_string(s.rank) + ": first different element " + std::to_string(first) +
                       "; different elements by round of " + std::to_string(perRound) + ":";
    for (std::size_t r = 0; r < rounds.size(); ++r) text += " " + std::to_string(rounds[r]);
    std::printf("%s\n", text.c_str());
  }
  std::uint64_t slotBytes = 0;  // (of the partners' scratch, for where())
  void* ptr = nullptr;
  std::size_t bytes;
};

class PartnerAllReduce : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (std::string why = whyCannotRun(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

// 48 KiB of scratch: a slot of 16 KiB (3 hosts) or 24 KiB (2), so 70,001 floats take 18 or 12 rounds,
// the last one short.
constexpr std::uint64_t kScratch = 48 << 10;

TEST_P(PartnerAllReduce, EveryTypeOpAndSizeMatchesTheReference) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int host, const std::shared_ptr<TcpBootstrap>& boot) {
    HostPartners partners(boot, kScratch);
    ASSERT_EQ(partners.host(), host);
    ASSERT_EQ(partners.hosts(), n);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::uint64_t seed = 100;
    std::size_t calls = 0;
    for (int t = 0; t < kDataTypeCount; ++t) {
      for (int o = 0; o < kReduceOpCount; ++o) {
        const auto type = static_cast<DataType>(t);
        const auto op = static_cast<ReduceOp>(o);
        for (std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{70001}}) {
          const CallShape s{Collective::AllReduce, type, op, count, host, n, 0, ++seed};
          Input buf(s);
          buf.slotBytes = kScratch / static_cast<std::uint64_t>(n) / 16 * 16;
          partners.allReduce(buf.ptr, count, type, op, n, stream);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          EXPECT_EQ(buf.wrong(s), 0u) << "host " << host << ": " << toString(type) << " " << toString(op) << " x "
                                      << count;
          ++calls;
          if (anyRankFailed(*boot)) return;
        }
      }
    }
    cudaStreamDestroy(stream);
    if (host == 0) std::printf("%zu calls checked\n", calls);
  });
}

// Calls queued back to back, with no wait between them: each round's acks keep a call's puts out of
// slots the previous one still reads.
TEST_P(PartnerAllReduce, CallsBackToBackOnOneStream) {
  const int n = GetParam();
  runGpuRanksOk(n, [&](int host, const std::shared_ptr<TcpBootstrap>& boot) {
    HostPartners partners(boot, kScratch);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::vector<CallShape> shapes;
    for (int i = 0; i < 12; ++i)
      shapes.push_back({Collective::AllReduce, i % 2 ? DataType::BFloat16 : DataType::Float32, ReduceOp::Sum,
                        std::size_t{1000} * static_cast<std::size_t>(i * i + 1) + 3, host, n, 0,
                        std::uint64_t(500 + i)});
    std::vector<std::unique_ptr<Input>> bufs;
    for (const CallShape& s : shapes) bufs.push_back(std::make_unique<Input>(s));
    for (std::size_t i = 0; i < shapes.size(); ++i)
      partners.allReduce(bufs[i]->ptr, shapes[i].count, shapes[i].type, shapes[i].op, n, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (std::size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(bufs[i]->wrong(shapes[i]), 0u) << "call " << i;
    cudaStreamDestroy(stream);
  });
}

TEST(HostPartnersErrors, TooLittleScratchIsAnErrorNamingTheHost) {
  runGpuRanksOk(2, [&](int host, const std::shared_ptr<TcpBootstrap>& boot) {
    try {
      HostPartners partners(boot, 16);
      ADD_FAILURE() << "16 bytes of scratch for 2 hosts were taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find("(host " + std::to_string(host) + ")"), std::string::npos) << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Hosts, PartnerAllReduce, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "hosts"; });

}  // namespace
}  // namespace ferry::test
