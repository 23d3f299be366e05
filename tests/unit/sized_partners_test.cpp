// SizedPartners (comm/sized_partners.hpp): an exchange goes to NCCL's network when its parts are at
// most ncclBytes each, else to ferry's connections; abort reaches both, and a failure of either
// ends the calls with that network's error.
#include "comm/sized_partners.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/errors.hpp"

namespace ferry {
namespace {

// A network that records the parts' elements of every exchange it is given.
class FakePartners final : public Partners {
 public:
  FakePartners(const char* name, std::vector<std::string>& log) : name_(name), log_(log) {}
  int host() const override { return 1; }
  int hosts() const override { return 2; }
  void exchange(const PartnerExchange& exchange, DataType, ReduceOp, cudaStream_t) override {
    log_.push_back(std::string(name_) + ":" + std::to_string(exchange.count));
  }
  void abort() override { aborted = true; }
  bool failed() const override { return failedFlag || aborted; }
  [[noreturn]] void throwFailure() const override {
    throw Error(ErrorCode::RemoteError, std::string(name_) + " failed");
  }
  const char* network() const override { return name_; }
  bool aborted = false, failedFlag = false;

 private:
  const char* name_;
  std::vector<std::string>& log_;
};

struct Sized {
  std::vector<std::string> log;
  FakePartners* nccl = nullptr;
  FakePartners* ferry = nullptr;
  std::unique_ptr<SizedPartners> partners;
  explicit Sized(std::uint64_t ncclBytes) {
    auto small = std::make_unique<FakePartners>("nccl", log);
    auto large = std::make_unique<FakePartners>("ferry", log);
    nccl = small.get();
    ferry = large.get();
    partners = std::make_unique<SizedPartners>(std::move(small), std::move(large), ncclBytes);
  }
  void exchange(std::uint64_t count, DataType type) {
    PartnerExchange e;
    e.count = count;
    partners->exchange(e, type, ReduceOp::Sum, nullptr);
  }
};

TEST(SizedPartners, PartsUpToTheLineGoOnNcclAndLargerOnesOnFerry) {
  Sized s(128 << 10);
  s.exchange(1, DataType::Float32);
  s.exchange(32 << 10, DataType::Float32);        // 128 KiB: on the line
  s.exchange((32 << 10) + 1, DataType::Float32);  // 4 bytes more
  s.exchange(64 << 10, DataType::BFloat16);       // the bytes count, not the elements
  s.exchange(0, DataType::Float32);
  EXPECT_EQ(s.log, (std::vector<std::string>{"nccl:1", "nccl:32768", "ferry:32769", "nccl:65536", "nccl:0"}));
  EXPECT_EQ(std::string(s.partners->network()), "sized");
  EXPECT_EQ(s.partners->host(), 1);
  EXPECT_EQ(s.partners->hosts(), 2);
}

TEST(SizedPartners, AbortReachesBothNetworks) {
  Sized s(1024);
  EXPECT_FALSE(s.partners->failed());
  s.partners->abort();
  EXPECT_TRUE(s.nccl->aborted);
  EXPECT_TRUE(s.ferry->aborted);
  EXPECT_TRUE(s.partners->failed());
}

TEST(SizedPartners, EitherNetworksFailureEndsTheCallsWithItsError) {
  for (const char* which : {"nccl", "ferry"}) {
    Sized s(1024);
    (std::string(which) == "nccl" ? s.nccl : s.ferry)->failedFlag = true;
    EXPECT_TRUE(s.partners->failed()) << which;
    try {
      s.partners->throwFailure();
      ADD_FAILURE() << which << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::RemoteError);
      EXPECT_NE(std::string(e.what()).find(std::string(which) + " failed"), std::string::npos) << e.what();
    }
  }
}

TEST(SizedPartners, AnAbortAfterAFailureKeepsTheFailuresError) {
  Sized s(1024);
  s.ferry->failedFlag = true;
  EXPECT_TRUE(s.partners->failed());
  s.partners->abort();  // both networks now say they failed
  try {
    s.partners->throwFailure();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ferry failed"), std::string::npos) << e.what();
  }
}

TEST(SizedPartners, TwoNetworksOfDifferentPartnersAreRefused) {
  std::vector<std::string> log;
  EXPECT_THROW(SizedPartners(nullptr, std::make_unique<FakePartners>("ferry", log), 1), Error);
}

}  // namespace
}  // namespace ferry
