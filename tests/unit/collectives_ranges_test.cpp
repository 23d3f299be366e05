// How collective kernels share elements among their blocks (ranges.hpp). Calls larger than the
// scratch run in rounds, and a block waits only for the peers' blocks of its own index before it
// writes the next round into their slots. So no block may ever be given slot bytes that another
// block had in an earlier round: a short last round once split afresh broke that and summed stale
// bytes on two GPUs.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/ranges.hpp"

namespace ferry {
namespace {

bool overlap(Range a, Range b) { return a.size() > 0 && b.size() > 0 && a.begin < b.end && b.begin < a.end; }

// Rounds of `full` elements then the rest, as the kernels cut a chunk of `count` elements.
std::vector<std::uint64_t> roundChunks(std::uint64_t count, std::uint64_t full) {
  std::vector<std::uint64_t> chunks;
  for (std::uint64_t base = 0; base < count; base += full) chunks.push_back(std::min(full, count - base));
  return chunks;
}

TEST(CollectivesRanges, PartSizeRoundsUpToTheGrain) {
  EXPECT_EQ(partSize(10, 3, 1), 4u);
  EXPECT_EQ(partSize(10, 3, 4), 4u);
  EXPECT_EQ(partSize(13, 3, 4), 8u);
  EXPECT_EQ(partSize(0, 3, 4), 0u);
  EXPECT_EQ(partSize(1, 64, 16), 16u);
}

TEST(CollectivesRanges, SplitRangeCoversEveryUnitOnce) {
  for (std::uint64_t n : {0ul, 1ul, 15ul, 16ul, 17ul, 1000ul, 65536ul, 65541ul})
    for (std::uint64_t parts : {1ul, 3ul, 16ul, 64ul})
      for (std::uint64_t grain : {1ul, 4ul, 16ul}) {
        std::uint64_t next = 0;
        for (std::uint64_t i = 0; i < parts; ++i) {
          const Range r = splitRange(n, parts, i, grain);
          ASSERT_EQ(r.begin, next) << n << " " << parts << " " << i << " " << grain;
          ASSERT_LE(r.begin, r.end);
          if (r.end < n) {
            ASSERT_EQ(r.begin % grain, 0u);
          }
          next = r.end;
        }
        EXPECT_EQ(next, n);
      }
}

// Every round, short or not: the blocks' parts cover the round's chunk once, and each block stays
// inside the slot bytes it had in the first (full) round, so no two blocks ever share slot bytes.
TEST(CollectivesRanges, RoundPartsKeepTheirPlaceInTheSlot) {
  for (std::uint64_t full : {16ul, 4096ul, 32768ul, 32772ul})
    for (std::uint64_t count :
         {1ul, 15ul, 4096ul, 32768ul, 65536ul + 10176ul, 9 * 32768ul + 5088ul, 100003ul})
      for (std::uint64_t parts : {1ul, 3ul, 16ul, 64ul})
        for (std::uint64_t grain : {1ul, 4ul, 16ul}) {
          const std::vector<std::uint64_t> chunks = roundChunks(count, full);
          const std::uint64_t first = chunks.front();
          for (std::uint64_t chunk : chunks) {
            std::uint64_t covered = 0;
            for (std::uint64_t i = 0; i < parts; ++i) {
              const Range part = roundPart(chunk, first, parts, i, grain);
              const Range home = splitRange(first, parts, i, grain);
              ASSERT_LE(part.begin, part.end);
              ASSERT_TRUE(part.size() == 0 || (home.begin <= part.begin && part.end <= home.end))
                  << "full " << full << " count " << count << " parts " << parts << " block " << i;
              for (std::uint64_t j = 0; j < parts; ++j) {
                if (j != i) {
                  ASSERT_FALSE(overlap(part, splitRange(first, parts, j, grain)));
                }
              }
              covered += part.size();
            }
            EXPECT_EQ(covered, chunk);
          }
        }
}

// The case the rule exists for: 9 full rounds of 32768 elements then 5088, on 16 blocks. Split
// afresh, block 5's last part lands in the slot bytes block 0 reads in the round before.
TEST(CollectivesRanges, SplittingAShortRoundAfreshWouldMoveBlocks) {
  const std::uint64_t full = 32768, last = 5088, parts = 16, grain = 4;
  EXPECT_TRUE(overlap(splitRange(last, parts, 5, grain), splitRange(full, parts, 0, grain)));
  EXPECT_FALSE(overlap(roundPart(last, full, parts, 5, grain), splitRange(full, parts, 0, grain)));
}

}  // namespace
}  // namespace ferry
