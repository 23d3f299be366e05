// AllGather, AllToAll and Broadcast as groups of sends and recvs (p2p_collectives.hpp): the calls
// each rank makes, and that the group planner takes them as one kernel's work.
#include <gtest/gtest.h>

#include <vector>

#include "collectives/p2p_collectives.hpp"
#include "collectives/p2p_group.hpp"

namespace ferry {
namespace {

alignas(16) char send[8 << 10], recv[8 << 10];

CollectiveCall callOf(Collective c, int rank, int world, std::size_t count, bool inPlace = false, int root = 0) {
  CollectiveCall call;
  call.collective = c;
  call.count = count;
  call.type = DataType::Float32;
  call.rank = rank;
  call.worldSize = world;
  call.root = root;
  call.recv = recv;
  const std::size_t bytes = count * 4;
  call.send = !inPlace ? static_cast<const void*>(send)
              : c == Collective::AllGather ? static_cast<const void*>(recv + rank * bytes)
                                           : static_cast<const void*>(recv);
  return call;
}

const PeerCall* find(const std::vector<PeerCall>& calls, bool isSend, int peer) {
  for (const PeerCall& c : calls)
    if (c.isSend == isSend && c.peer == peer) return &c;
  return nullptr;
}

TEST(P2PCollectives, AllToAllSendsEachPeerItsBlockAndReceivesIntoTheSendersSlot) {
  const std::size_t count = 100, bytes = count * 4;
  for (int rank = 0; rank < 4; ++rank) {
    const auto calls = p2pCallsOf(callOf(Collective::AllToAll, rank, 4, count));
    ASSERT_EQ(calls.size(), 8u) << rank;  // three peers each way, and the own block
    for (int p = 0; p < 4; ++p) {
      const PeerCall* s = find(calls, true, p);
      const PeerCall* r = find(calls, false, p);
      ASSERT_TRUE(s && r) << rank << " peer " << p;
      EXPECT_EQ(s->buffer, send + p * bytes);
      EXPECT_EQ(r->buffer, recv + p * bytes);
      EXPECT_EQ(s->bytes(), bytes);
      EXPECT_EQ(r->rank, rank);
    }
    const P2PBatch b = planP2PGroup(calls, 264);
    EXPECT_EQ(b.streams, 7);  // (peer, direction) for three peers, and the copies to self
  }
  EXPECT_TRUE(p2pCallsOf(callOf(Collective::AllToAll, 1, 4, count, true)).empty());
}

TEST(P2PCollectives, AllGatherSendsTheSameInputToEveryPeer) {
  const std::size_t count = 64, bytes = count * 4;
  const auto calls = p2pCallsOf(callOf(Collective::AllGather, 2, 3, count));
  ASSERT_EQ(calls.size(), 6u);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(find(calls, true, p)->buffer, send);
    EXPECT_EQ(find(calls, false, p)->buffer, recv + p * bytes);
  }
  // In place, the own block is already where it belongs: no copy to self.
  const auto inPlace = p2pCallsOf(callOf(Collective::AllGather, 2, 3, count, true));
  ASSERT_EQ(inPlace.size(), 4u);
  EXPECT_EQ(find(inPlace, true, 2), nullptr);
  EXPECT_EQ(find(inPlace, true, 0)->buffer, recv + 2 * bytes);
  EXPECT_EQ(planP2PGroup(inPlace, 264).streams, 4);
}

TEST(P2PCollectives, BroadcastRootSendsAndTheOthersOnlyReceiveFromIt) {
  const std::size_t count = 1000;
  const auto root = p2pCallsOf(callOf(Collective::Broadcast, 1, 4, count, false, 1));
  ASSERT_EQ(root.size(), 5u);  // three sends, and the copy to its own output
  for (int p : {0, 2, 3}) {
    EXPECT_EQ(find(root, true, p)->buffer, send);
    EXPECT_EQ(find(root, false, p), nullptr);
  }
  EXPECT_EQ(find(root, false, 1)->buffer, recv);
  EXPECT_EQ(p2pCallsOf(callOf(Collective::Broadcast, 1, 4, count, true, 1)).size(), 3u);
  for (int rank : {0, 2, 3}) {
    const auto other = p2pCallsOf(callOf(Collective::Broadcast, rank, 4, count, false, 1));
    ASSERT_EQ(other.size(), 1u) << rank;
    EXPECT_FALSE(other[0].isSend);
    EXPECT_EQ(other[0].peer, 1);
    EXPECT_EQ(other[0].buffer, recv);
    EXPECT_EQ(planP2PGroup(other, 264).streams, 1);
  }
}

TEST(P2PCollectives, OneAlgorithmPerFamilyAndAnInPlaceAllToAllIsRefused) {
  const auto algorithms = p2pCollectiveAlgorithms();
  ASSERT_EQ(algorithms.size(), 3u);
  EXPECT_STREQ(algorithms[0]->name(), "allgather_p2p");
  EXPECT_STREQ(algorithms[1]->name(), "alltoall_p2p");
  EXPECT_STREQ(algorithms[2]->name(), "broadcast_p2p");
  const CommLimits limits;
  EXPECT_NE(algorithms[1]->whyNot(callOf(Collective::AllToAll, 0, 2, 10, true), limits), "");
  EXPECT_EQ(algorithms[1]->whyNot(callOf(Collective::AllToAll, 0, 2, 10), limits), "");
  EXPECT_EQ(algorithms[0]->whyNot(callOf(Collective::AllGather, 1, 2, 10, true), limits), "");
}

}  // namespace
}  // namespace ferry
