// Where a call's unregistered buffers go in the Comm's staging buffer (staging.hpp): the staged call
// must be in place exactly when the call is, by the same rule, and copy in and back exactly the
// bytes the rank reads and writes.
#include <gtest/gtest.h>

#include "comm/staging.hpp"

namespace ferry {
namespace {

// Rank 1 of 4, 10 floats per the API's count, buffers far apart.
CollectiveCall callOf(Collective c, int root = 0) {
  CollectiveCall call;
  call.collective = c;
  call.count = 10;
  call.type = DataType::Float32;
  call.rank = 1;
  call.worldSize = 4;
  call.root = root;
  call.send = reinterpret_cast<const void*>(0x100000);
  call.recv = reinterpret_cast<void*>(0x200000);
  return call;
}

TEST(StagedLayout, OutOfPlaceStagesSendThenRecvOnAnAlignedBoundary) {
  const CollectiveCall call = callOf(Collective::ReduceScatter);  // send 160 bytes, recv 40
  const StagedLayout l = stagedLayout(call);
  EXPECT_EQ(l.sendOffset, 0u);
  EXPECT_EQ(l.recvOffset, 256u);
  EXPECT_EQ(l.bytes, 256u + 40u);
  EXPECT_EQ(l.inFrom, call.send);
  EXPECT_EQ(l.inBytes, 160u);
  EXPECT_EQ(l.outBytes, 40u);
}

TEST(StagedLayout, InPlaceAllGatherStagesTheWholeOutputWithTheInputAtTheRanksBlock) {
  CollectiveCall call = callOf(Collective::AllGather);
  call.send = static_cast<const char*>(call.recv) + 40;  // rank 1's block
  ASSERT_TRUE(call.inPlace());
  const StagedLayout l = stagedLayout(call);
  EXPECT_EQ(l.bytes, 160u);
  EXPECT_EQ(l.recvOffset, 0u);
  EXPECT_EQ(l.sendOffset, 40u);
  EXPECT_EQ(l.inFrom, call.recv);
  EXPECT_EQ(l.inBytes, 160u);
  EXPECT_EQ(l.outBytes, 160u);
}

TEST(StagedLayout, InPlaceReduceScatterStagesTheWholeInputAndCopiesBackTheOutputBlock) {
  CollectiveCall call = callOf(Collective::ReduceScatter);
  call.recv = const_cast<char*>(static_cast<const char*>(call.send)) + 40;
  ASSERT_TRUE(call.inPlace());
  const StagedLayout l = stagedLayout(call);
  EXPECT_EQ(l.bytes, 160u);
  EXPECT_EQ(l.sendOffset, 0u);
  EXPECT_EQ(l.recvOffset, 40u);
  EXPECT_EQ(l.inFrom, call.send);
  EXPECT_EQ(l.outBytes, 40u);
}

TEST(StagedLayout, InPlaceAllReduceIsOneBuffer) {
  CollectiveCall call = callOf(Collective::AllReduce);
  call.send = call.recv;
  const StagedLayout l = stagedLayout(call);
  EXPECT_EQ(l.bytes, 40u);
  EXPECT_EQ(l.sendOffset, l.recvOffset);
  EXPECT_EQ(l.inBytes, 40u);
  EXPECT_EQ(l.outBytes, 40u);
}

TEST(StagedLayout, RanksThatReadOrWriteNothingCopyNothing) {
  const StagedLayout offRootBroadcast = stagedLayout(callOf(Collective::Broadcast, 0));
  EXPECT_EQ(offRootBroadcast.inBytes, 0u);
  EXPECT_EQ(offRootBroadcast.inFrom, nullptr);
  EXPECT_EQ(offRootBroadcast.outBytes, 40u);
  const StagedLayout offRootReduce = stagedLayout(callOf(Collective::Reduce, 0));
  EXPECT_EQ(offRootReduce.inBytes, 40u);
  EXPECT_EQ(offRootReduce.outBytes, 0u);
}

}  // namespace
}  // namespace ferry
