// PairBootstrap (comm/pair_bootstrap.hpp): two ranks of a larger bootstrap as a bootstrap of their
// own, for the links of send/recv across hosts: the lower world rank is its rank 0, messages go
// through the world's with their tags moved into a range of their own, without overflow, and a
// message to anyone but the pair's other rank is refused.
#include "comm/pair_bootstrap.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <tuple>

#include "fake_bootstrap.hpp"

namespace ferry {
namespace {

using test::FakeBootstrap;

TEST(PairBootstrap, TheLowerWorldRankIsRankZeroEachAHostOfItsOwn) {
  auto hub = std::make_shared<FakeBootstrap::Hub>();
  auto w0 = std::make_shared<FakeBootstrap>(hub, 0, 3), w2 = std::make_shared<FakeBootstrap>(hub, 2, 3);
  PairBootstrap a(w0, 2), b(w2, 0);
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(b.rank(), 1);
  EXPECT_EQ(a.size(), 2);
  EXPECT_EQ(a.numNodes(), 2);
  EXPECT_EQ(b.node(), 1);
  EXPECT_EQ(b.hostRanks(), std::vector<int>{1});
  EXPECT_EQ(a.worldRank(0), 0);
  EXPECT_EQ(a.worldRank(1), 2);
  EXPECT_EQ(b.worldRank(0), 0);
  EXPECT_EQ(b.worldRank(1), 2);
}

TEST(PairBootstrap, MessagesGoThroughTheWorldWithTagsOfTheirOwn) {
  auto hub = std::make_shared<FakeBootstrap::Hub>();
  auto w1 = std::make_shared<FakeBootstrap>(hub, 1, 4), w3 = std::make_shared<FakeBootstrap>(hub, 3, 4);
  PairBootstrap a(w1, 3), b(w3, 1);
  // A tag as large as a Communicator's (2^30 + channel << 27 + tag) and the largest int: moved
  // modulo 2^31, never past it.
  for (const int tag : {7, 0x48007061, std::numeric_limits<int>::max()}) {
    const int sent = tag;
    a.send(&sent, sizeof sent, 1, tag);
    int got = 0;
    b.recv(&got, sizeof got, 0, tag);
    EXPECT_EQ(got, sent);
    // The world's own tag is free: a message with it does not reach the pair.
    w1->send(&sent, sizeof sent, 3, tag);
    EXPECT_THROW(b.recv(&got, sizeof got, 0, tag), TimeoutError);
    int direct = 0;
    w3->recv(&direct, sizeof direct, 1, tag);
    EXPECT_EQ(direct, sent);
  }
  EXPECT_EQ(w1->pending(), 0u);
}

TEST(PairBootstrap, OnlyTheOtherRankOfThePairIsAPeer) {
  auto hub = std::make_shared<FakeBootstrap::Hub>();
  auto w0 = std::make_shared<FakeBootstrap>(hub, 0, 2);
  PairBootstrap a(w0, 1);
  const int x = 1;
  EXPECT_THROW(a.send(&x, sizeof x, 0, 5), Error);  // itself
  EXPECT_THROW(a.send(&x, sizeof x, 2, 5), Error);
  EXPECT_THROW(PairBootstrap(w0, 0), Error);  // a pair of one rank
  EXPECT_THROW(PairBootstrap(w0, 2), Error);  // past the world
}

}  // namespace
}  // namespace ferry
