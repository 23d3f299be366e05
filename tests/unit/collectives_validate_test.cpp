// The argument checks of every collective call (validateCall) and the buffer sizes a call implies,
// without a GPU: device -1 skips asking CUDA where a pointer lives, so fake addresses do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/collective_call.hpp"
#include "expect_contains.hpp"
#include "fake_bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

constexpr int kNoDevice = -1;

const void* fakeConst(std::uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

struct CollectiveCase {
  Collective collective;
  const char* api;  // the Comm method, as messages name it
};

// Rank 2 of 4 (broadcast root 0, reduce root 2: the ranks that read send and write recv), 16 floats,
// buffers far apart: valid for every collective.
CollectiveCall validCall(Collective c) {
  CollectiveCall call;
  call.collective = c;
  call.count = 16;
  call.type = DataType::Float32;
  call.op = ReduceOp::Sum;
  call.root = c == Collective::Reduce ? 2 : 0;
  call.rank = 2;
  call.worldSize = 4;
  call.send = fakeConst(0x100000);
  call.recv = fake(0x200000);
  return call;
}

// validateCall's InvalidUsage message; a test failure (and "") when it accepts or throws another code.
std::string rejection(const CollectiveCall& call) {
  try {
    validateCall(call, kNoDevice);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "validateCall accepted the call";
  return {};
}

class ValidateCall : public ::testing::TestWithParam<CollectiveCase> {
 protected:
  CollectiveCall call_ = validCall(GetParam().collective);
  // "rank 2: allReduce": every message starts with who and what.
  std::string prefix() const { return "rank 2: " + std::string(GetParam().api); }
  bool isBroadcast() const { return GetParam().collective == Collective::Broadcast; }
};

TEST_P(ValidateCall, ValidCallIsAccepted) { EXPECT_NO_THROW(validateCall(call_, kNoDevice)); }

TEST_P(ValidateCall, NullRecvIsRejected) {
  call_.recv = nullptr;
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "recv buffer is null");
}

TEST_P(ValidateCall, NullSendIsRejectedWhereSendIsRead) {
  call_.send = nullptr;
  if (isBroadcast()) {
    // Only the root reads send.
    EXPECT_NO_THROW(validateCall(call_, kNoDevice));
    call_.root = call_.rank;
  }
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "send buffer is null");
}

TEST_P(ValidateCall, InvalidDataTypeIsRejected) {
  for (int value : {-1, kDataTypeCount, 99}) {
    call_.type = static_cast<DataType>(value);
    const std::string msg = rejection(call_);
    EXPECT_CONTAINS(msg, prefix());
    EXPECT_CONTAINS(msg, "datatype " + std::to_string(value));
  }
}

TEST_P(ValidateCall, InvalidOpIsRejectedOnlyWhereItIsUsed) {
  call_.op = static_cast<ReduceOp>(kReduceOpCount);
  if (!call_.reduces()) {
    EXPECT_NO_THROW(validateCall(call_, kNoDevice));
    return;
  }
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "reduce op 5");
}

TEST_P(ValidateCall, RootOutOfRangeIsRejectedWhereThereIsARoot) {
  for (int root : {-1, 4}) {
    call_.root = root;
    if (!call_.rooted()) {
      EXPECT_NO_THROW(validateCall(call_, kNoDevice)) << "root " << root << " is not used";
      continue;
    }
    const std::string msg = rejection(call_);
    EXPECT_CONTAINS(msg, prefix());
    EXPECT_CONTAINS(msg, "root " + std::to_string(root) + " is out of range [0, 4)");
  }
}

TEST_P(ValidateCall, MisalignedRecvIsRejected) {
  call_.recv = fake(0x200001);
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "recv buffer");
  EXPECT_CONTAINS(msg, "not aligned to the element size 4");
}

TEST_P(ValidateCall, MisalignedSendIsRejectedWhereSendIsRead) {
  call_.send = fakeConst(0x100002);
  if (isBroadcast()) {
    EXPECT_NO_THROW(validateCall(call_, kNoDevice));
    call_.root = call_.rank;
  }
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "send buffer");
  EXPECT_CONTAINS(msg, "not aligned to the element size 4");
}

TEST_P(ValidateCall, AlignmentFollowsTheElementSize) {
  for (int t = 0; t < kDataTypeCount; ++t) {
    call_.type = static_cast<DataType>(t);
    const std::size_t size = sizeOf(call_.type);
    call_.recv = fake(0x200000 + size);
    EXPECT_NO_THROW(validateCall(call_, kNoDevice)) << toString(call_.type);
    if (size == 1) continue;
    call_.recv = fake(0x200000 + size / 2);
    EXPECT_CONTAINS(rejection(call_), "not aligned") << toString(call_.type);
  }
}

TEST_P(ValidateCall, CountZeroIsAcceptedEvenWithoutBuffers) {
  call_.count = 0;
  call_.send = nullptr;
  call_.recv = nullptr;
  EXPECT_NO_THROW(validateCall(call_, kNoDevice));
}

TEST_P(ValidateCall, CountWhoseByteSizeOverflowsIsRejected) {
  call_.count = std::numeric_limits<std::size_t>::max() / 4 + 1;
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "count " + std::to_string(call_.count) + " is too large");
}

// Where each collective's send sits relative to recv when the call is in place (comm.hpp).
std::uintptr_t inPlaceSend(const CollectiveCall& call) {
  const auto recv = reinterpret_cast<std::uintptr_t>(call.recv);
  const std::uintptr_t ownBlock = static_cast<std::uintptr_t>(call.rank) * call.count * call.elementBytes();
  switch (call.collective) {
    case Collective::AllGather: return recv + ownBlock;
    case Collective::ReduceScatter: return recv - ownBlock;
    default: return recv;
  }
}

TEST_P(ValidateCall, InPlaceIsAccepted) {
  call_.root = call_.rank;  // a broadcast root reads send
  call_.send = fakeConst(inPlaceSend(call_));
  EXPECT_TRUE(call_.inPlace());
  EXPECT_NO_THROW(validateCall(call_, kNoDevice));
}

TEST_P(ValidateCall, OverlapOtherThanInPlaceIsRejected) {
  call_.root = call_.rank;
  // One element off the in-place position: the buffers still overlap.
  call_.send = fakeConst(inPlaceSend(call_) + 4);
  EXPECT_FALSE(call_.inPlace());
  const std::string msg = rejection(call_);
  EXPECT_CONTAINS(msg, prefix());
  EXPECT_CONTAINS(msg, "overlap but the call is not in place");
}

// recv right after the end of send, and send right after the end of recv, touch but do not overlap.
TEST_P(ValidateCall, AdjacentBuffersAreAccepted) {
  call_.root = call_.rank;
  const std::uintptr_t base = 0x100000;
  const std::size_t sendBytes = call_.sendElements() * 4, recvBytes = call_.recvElements() * 4;
  call_.send = fakeConst(base);
  call_.recv = fake(base + sendBytes);
  EXPECT_NO_THROW(validateCall(call_, kNoDevice));
  call_.recv = fake(base + sendBytes - 4);
  EXPECT_CONTAINS(rejection(call_), "overlap");
  call_.recv = fake(base);
  call_.send = fakeConst(base + recvBytes);
  EXPECT_NO_THROW(validateCall(call_, kNoDevice));
  call_.send = fakeConst(base + recvBytes - 4);
  EXPECT_CONTAINS(rejection(call_), "overlap");
}

// A non-root broadcast rank never reads send, so where it points does not matter.
TEST(ValidateBroadcast, NonRootSendIsIgnored) {
  CollectiveCall call = validCall(Collective::Broadcast);
  for (std::uintptr_t send : {std::uintptr_t{0}, std::uintptr_t{0x200004}, std::uintptr_t{0x100001}}) {
    call.send = fakeConst(send);
    EXPECT_NO_THROW(validateCall(call, kNoDevice)) << send;
  }
}

// A non-root reduce rank never touches recv: null, misaligned or overlapping send, it is ignored.
TEST(ValidateReduce, NonRootRecvIsIgnored) {
  CollectiveCall call = validCall(Collective::Reduce);
  call.root = 0;
  for (std::uintptr_t recv : {std::uintptr_t{0}, std::uintptr_t{0x200002}, std::uintptr_t{0x100004}}) {
    call.recv = fake(recv);
    EXPECT_NO_THROW(validateCall(call, kNoDevice)) << recv;
  }
  call.send = nullptr;
  EXPECT_CONTAINS(rejection(call), "rank 2: reduce: send buffer is null");
}

// The in-place rule of one collective is an overlap for another: allGather's send must be the
// rank's own block of recv, not its start (rank 2 here).
TEST(ValidateAllGather, SendAtStartOfRecvIsNotInPlace) {
  CollectiveCall call = validCall(Collective::AllGather);
  call.send = call.recv;
  EXPECT_FALSE(call.inPlace());
  EXPECT_CONTAINS(rejection(call), "in place: send == recv + rank * sendCount");
}

TEST(ValidateReduceScatter, RecvAtStartOfSendIsNotInPlace) {
  CollectiveCall call = validCall(Collective::ReduceScatter);
  call.recv = const_cast<void*>(call.send);
  EXPECT_FALSE(call.inPlace());
  EXPECT_CONTAINS(rejection(call), "in place: recv == send + rank * recvCount");
}

TEST(Describe, NamesRankAndCall) {
  CollectiveCall call = validCall(Collective::ReduceScatter);
  call.rank = 7;
  EXPECT_EQ(describe(call), "rank 7: reduceScatter");
}

INSTANTIATE_TEST_SUITE_P(Collectives, ValidateCall,
                         ::testing::Values(CollectiveCase{Collective::AllReduce, "allReduce"},
                                           CollectiveCase{Collective::AllGather, "allGather"},
                                           CollectiveCase{Collective::ReduceScatter, "reduceScatter"},
                                           CollectiveCase{Collective::AllToAll, "allToAll"},
                                           CollectiveCase{Collective::Broadcast, "broadcast"},
                                           CollectiveCase{Collective::Reduce, "reduce"}),
                         [](const auto& info) { return std::string(info.param.api); });

// --- Sizes --------------------------------------------------------------------------------------

struct Sizes {
  Collective collective;
  std::size_t sendElements;
  std::size_t recvElements;
};

class CallSizes : public ::testing::TestWithParam<Sizes> {};

// count 10 of doubles on 4 ranks; bytes() is the larger buffer, what the selector goes by.
TEST_P(CallSizes, FollowTheCountConventionOfEachCollective) {
  const Sizes& p = GetParam();
  CollectiveCall call = validCall(p.collective);
  call.count = 10;
  call.type = DataType::Float64;
  EXPECT_EQ(call.elementBytes(), 8u);
  EXPECT_EQ(call.sendElements(), p.sendElements);
  EXPECT_EQ(call.recvElements(), p.recvElements);
  EXPECT_EQ(call.bytes(), std::max(p.sendElements, p.recvElements) * 8);
}

INSTANTIATE_TEST_SUITE_P(
    Collectives, CallSizes,
    ::testing::Values(Sizes{Collective::AllReduce, 10, 10}, Sizes{Collective::AllGather, 10, 40},
                      Sizes{Collective::ReduceScatter, 40, 10}, Sizes{Collective::AllToAll, 40, 40},
                      Sizes{Collective::Broadcast, 10, 10}, Sizes{Collective::Reduce, 10, 10}),
    [](const auto& info) { return std::string(toString(info.param.collective)); });

// send and recv (validatePeerCall): rank 1 of 4 sending 8 floats to rank 3.
PeerCall validPeerCall(bool isSend) {
  PeerCall call;
  call.isSend = isSend;
  call.buffer = fakeConst(0x300000);
  call.count = 8;
  call.type = DataType::Float32;
  call.peer = 3;
  call.rank = 1;
  call.worldSize = 4;
  return call;
}

std::string peerRejection(const PeerCall& call) {
  try {
    validatePeerCall(call, kNoDevice);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "validatePeerCall accepted the call";
  return {};
}

TEST(ValidatePeerCall, AcceptsAValidSendAndRecvAndZeroCountWithoutBuffer) {
  EXPECT_NO_THROW(validatePeerCall(validPeerCall(true), kNoDevice));
  EXPECT_NO_THROW(validatePeerCall(validPeerCall(false), kNoDevice));
  PeerCall empty = validPeerCall(true);
  empty.count = 0;
  empty.buffer = nullptr;
  EXPECT_NO_THROW(validatePeerCall(empty, kNoDevice));
  PeerCall self = validPeerCall(false);
  self.peer = 1;  // to itself: matched within a group by the Comm, not refused here
  EXPECT_NO_THROW(validatePeerCall(self, kNoDevice));
}

TEST(ValidatePeerCall, NamesRankOperationPeerAndArgument) {
  PeerCall c = validPeerCall(true);
  c.peer = 4;
  EXPECT_CONTAINS(peerRejection(c), "rank 1: send to rank 4: peer 4 is out of range [0, 4)");
  c.peer = -1;
  EXPECT_CONTAINS(peerRejection(c), "peer -1 is out of range");
  c = validPeerCall(false);
  c.buffer = nullptr;
  EXPECT_CONTAINS(peerRejection(c), "rank 1: recv from rank 3: buffer is null");
  c = validPeerCall(false);
  c.buffer = fakeConst(0x300002);
  EXPECT_CONTAINS(peerRejection(c), "is not aligned to the element size 4");
  c = validPeerCall(true);
  c.type = static_cast<DataType>(99);
  EXPECT_CONTAINS(peerRejection(c), "datatype 99 is not a ferry::DataType");
  c = validPeerCall(true);
  c.count = std::numeric_limits<std::size_t>::max() / 2;
  EXPECT_CONTAINS(peerRejection(c), "is too large");
}

TEST(ValidatePreMul, NamesTheCallAndTheFactor) {
  const CollectiveCall call = validCall(Collective::ReduceScatter);
  try {
    validatePreMul(call, PreMulSum{nullptr, false}, kNoDevice);
    ADD_FAILURE() << "a null factor was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_CONTAINS(e.what(), "rank 2: reduceScatter with a PreMulSum op: the factor is null");
  }
  const float two = 2;
  EXPECT_NO_THROW(validatePreMul(call, PreMulSum{&two, false}, kNoDevice));
  EXPECT_NO_THROW(validatePreMul(call, PreMulSum{fakeConst(0x300000), true}, kNoDevice));
}

// A bootstrap whose ranks sit one per host.
class OnePerHost : public test::FakeBootstrap {
 public:
  OnePerHost(int rank, int size) : FakeBootstrap(std::make_shared<Hub>(), rank, size), mine_{rank} {}
  const std::vector<int>& hostRanks() const override { return mine_; }
  int numNodes() const override { return size(); }

 private:
  std::vector<int> mine_;
};

TEST(CommWhyNot, RanksOnOneHostOnlyAndNotTooMany) {
  EXPECT_EQ(Comm::whyNot(test::FakeBootstrap(std::make_shared<test::FakeBootstrap::Hub>(), 1, 4)), "");
  EXPECT_CONTAINS(Comm::whyNot(OnePerHost(1, 2)),
                  "rank 1: Comm needs every rank on one host: 1 of 2 ranks are on this host");
  EXPECT_CONTAINS(Comm::whyNot(OnePerHost(1, 2)), "FERRY_MULTI_HOST=1");  // (unset here)
  EXPECT_CONTAINS(Comm::whyNot(test::FakeBootstrap(std::make_shared<test::FakeBootstrap::Hub>(), 0, 9)),
                  "rank 0: Comm supports up to 8 ranks, not 9");
}

}  // namespace
}  // namespace ferry
