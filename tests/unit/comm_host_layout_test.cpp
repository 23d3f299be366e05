// HostLayout (comm/host_layout.hpp): what a Comm across hosts decides from where its ranks live:
// hosts' sizes and first ranks, whether hosts are even and their ranks consecutive, and which
// local rank carries each column of the cross-host phase, and the rounds in which a host's phases
// take another host's ranks.
#include "comm/host_layout.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace ferry {
namespace {

TEST(HostLayout, TwoHostsOfTwoConsecutiveRanks) {
  const HostLayout l({0, 0, 1, 1}, {0, 1, 0, 1}, 2);
  EXPECT_TRUE(l.even);
  EXPECT_TRUE(l.contiguous);
  EXPECT_EQ(l.columns, 2);
  EXPECT_EQ(l.firstOf, (std::vector<int>{0, 2}));
  EXPECT_EQ(l.sizeOf, (std::vector<int>{2, 2}));
  EXPECT_EQ(l.worldRank(1, 1), 3);
  for (int c = 0; c < 2; ++c)
    for (int h = 0; h < 2; ++h) EXPECT_EQ(l.holder(h, c), c);  // rank l carries column l alone
}

TEST(HostLayout, InterleavedRanksAreEvenButNotConsecutive) {
  const HostLayout l({0, 1, 0, 1}, {0, 0, 1, 1}, 2);
  EXPECT_TRUE(l.even);
  EXPECT_FALSE(l.contiguous);
  EXPECT_EQ(l.firstOf, (std::vector<int>{0, 1}));
  EXPECT_EQ(l.worldRank(0, 1), 2);
  EXPECT_EQ(l.worldRank(1, 1), 3);
  EXPECT_EQ(l.mostCarried, 1);
  EXPECT_EQ(l.rounds(1, 2), 1);
  EXPECT_EQ(l.round(1, 0, 2), (std::vector<int>{1, 3}));  // not one block of a buffer
  EXPECT_EQ(l.mostRounds(), 2);
  EXPECT_EQ(l.mostRoundChunks(), 4);
}

TEST(HostLayout, ThreeAndOneRanks) {
  const HostLayout l({0, 0, 0, 1}, {0, 1, 2, 0}, 2);
  EXPECT_FALSE(l.even);
  EXPECT_TRUE(l.contiguous);
  EXPECT_EQ(l.columns, 3);
  EXPECT_EQ(l.sizeOf, (std::vector<int>{3, 1}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(l.holder(0, c), c);  // each rank of the larger host carries its own column
    EXPECT_EQ(l.holder(1, c), 0);  // the lone rank carries all three
  }
  EXPECT_EQ(l.mostCarried, 3);
  // Host 0 takes the lone rank in one round of three, its ranks 1 and 2 taking none.
  EXPECT_EQ(l.rounds(1, 3), 1);
  EXPECT_EQ(l.round(1, 0, 3), (std::vector<int>{3, -1, -1}));
  // The lone rank takes host 0's ranks in three rounds of one.
  EXPECT_EQ(l.rounds(0, 1), 3);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(l.round(0, j, 1), (std::vector<int>{j}));
  EXPECT_EQ(l.roundsBefore(1, 1), 3);
  EXPECT_EQ(l.mostRounds(), 4);       // the lone rank's: 3 + 1 rounds of one
  EXPECT_EQ(l.mostRoundChunks(), 6);  // host 0's: 1 + 1 rounds of three
}

TEST(HostLayout, HostsOfTwoThreeAndOneRanks) {
  // World ranks by host: 0-1 on host 0, 2-4 on host 1, 5 on host 2.
  const HostLayout l({0, 0, 1, 1, 1, 2}, {0, 1, 0, 1, 2, 0}, 3);
  EXPECT_FALSE(l.even);
  EXPECT_TRUE(l.contiguous);
  EXPECT_EQ(l.columns, 3);
  EXPECT_EQ(l.firstOf, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(l.holder(0, 2), 0);  // host 0's rank 0 carries columns 0 and 2
  EXPECT_EQ(l.holder(0, 1), 1);
  EXPECT_EQ(l.holder(1, 2), 2);
  EXPECT_EQ(l.holder(2, 1), 0);
  EXPECT_EQ(l.worldRank(1, 2), 4);
  EXPECT_EQ(l.worldRank(2, 0), 5);
  EXPECT_EQ(l.mostCarried, 3);  // host 2's lone rank
  // Host 0 (two ranks) takes host 1's three in two rounds, its rank 1 taking none in the second.
  EXPECT_EQ(l.rounds(1, 2), 2);
  EXPECT_EQ(l.round(1, 0, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(l.round(1, 1, 2), (std::vector<int>{4, -1}));
  EXPECT_EQ(l.roundsBefore(2, 2), 3);  // host 0: 1, host 1: 2
  EXPECT_EQ(l.mostRounds(), 6);        // host 2's lone rank: 2 + 3 + 1 rounds of one
  EXPECT_EQ(l.mostRoundChunks(), 9);   // host 1's: 1 + 1 + 1 rounds of three
}

}  // namespace
}  // namespace ferry
