// How a group of sends and recvs becomes one send/recv kernel's work (p2p_group.hpp): one stream
// per (peer, direction) in issue order plus one of copies to self, and the GPU's resident blocks
// shared so that every stream runs and none gets blocks it cannot use.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/p2p_group.hpp"
#include "kernels/ranges.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

char buffers[16][64];  // distinct addresses: the plan never touches them

PeerCall call(bool send, int peer, std::size_t bytes, int rank = 0, int world = 2, int buffer = 0) {
  PeerCall c;
  c.isSend = send;
  c.buffer = buffers[buffer];
  c.count = bytes;
  c.type = DataType::Uint8;
  c.peer = peer;
  c.rank = rank;
  c.worldSize = world;
  return c;
}

std::string refusal(const std::vector<PeerCall>& calls, int resident) {
  try {
    planP2PGroup(calls, resident);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    return e.what();
  }
  return "";
}

TEST(P2PGroup, LanesFollowTheSizeAlone) {
  EXPECT_EQ(p2pLanes(1), 1);
  EXPECT_EQ(p2pLanes(kP2PPacketLaneGrain), 1);
  EXPECT_EQ(p2pLanes(kP2PPacketLaneGrain + 1), 2);
  EXPECT_EQ(p2pLanes(kP2PPacketBytes), kP2PPacketLanes);
  EXPECT_EQ(p2pLanes(kP2PPacketBytes + 1), static_cast<int>(kP2PPacketBytes / kP2PLaneGrain) + 1);
  EXPECT_EQ(p2pLanes(1ull << 30), kP2PLanes);
}

// A lane's chunks: a quarter of its part in whole 16 bytes, never smaller than kP2PMinChunkBytes nor
// larger than a slot.
TEST(P2PGroup, ChunksAreAQuarterOfAPartWithinTheirBounds) {
  EXPECT_EQ(p2pChunkBytes(1), kP2PMinChunkBytes);
  EXPECT_EQ(p2pChunkBytes(4 * kP2PMinChunkBytes), kP2PMinChunkBytes);
  EXPECT_EQ(p2pChunkBytes(4 * kP2PMinChunkBytes + 4 * 16), kP2PMinChunkBytes + 16);
  EXPECT_EQ(p2pChunkBytes(512 << 10), 128u << 10);
  EXPECT_EQ(p2pChunkBytes(1ull << 30), kP2PChunkBytes);
  for (std::uint64_t part : {1ull, 4099ull, 300001ull, 1ull << 20, (16ull << 20) / 64 + 16, (1ull << 20) + 3}) {
    EXPECT_EQ(p2pChunkBytes(part) % 16, 0u) << part;
    if (part >= 4 * kP2PMinChunkBytes && part <= 4 * kP2PChunkBytes) {
      EXPECT_LE((part + p2pChunkBytes(part) - 1) / p2pChunkBytes(part), 4u) << part;  // no short fifth chunk
    }
  }
}

// Every lane of a message sent as packets fits its packet slot (the size packet and one packet per
// word), and the packet slots of every sender fit behind the raw ones.
TEST(P2PGroup, PacketLanesFitTheirSlots) {
  for (std::uint64_t bytes = 1; bytes <= kP2PPacketBytes; bytes += bytes < 4096 ? 1 : 4093) {
    ASSERT_TRUE(p2pPackets(bytes));
    const int lanes = p2pLanes(bytes);
    ASSERT_LE(lanes, kP2PPacketLanes) << bytes;
    for (int lane = 0; lane < lanes; ++lane) {
      const Range part = splitRange(bytes, lanes, lane, 16);
      EXPECT_LE(16 * (1 + (part.size() + 7) / 8), kP2PPacketSlotBytes) << bytes << " lane " << lane;
    }
  }
  EXPECT_FALSE(p2pPackets(kP2PPacketBytes + 1));
  EXPECT_EQ(p2pPacketSlotOffset(2, 1, kP2PPacketLanes - 1, kP2PPacketSlots - 1) + kP2PPacketSlotBytes,
            p2pPacketSlotOffset(2, 2, 0, 0));
  EXPECT_EQ(p2pPacketSlotOffset(2, 0, 0, 0), p2pSlotOffset(2, 0, 0));
}

// A two-rank all-to-all through send/recv: the transfer each way and the copy to self, in one
// kernel, each with all the blocks its message has lanes for.
TEST(P2PGroup, TwoRankAllToAllRunsItsCopyBesideTheTransfers) {
  const std::size_t big = 512ull << 20;
  std::vector<PeerCall> calls = {call(true, 0, big, 0, 2, 0), call(false, 0, big, 0, 2, 1),
                                 call(true, 1, big, 0, 2, 2), call(false, 1, big, 0, 2, 3)};
  const P2PBatch b = planP2PGroup(calls, 264);
  ASSERT_EQ(b.streams, 3);
  ASSERT_EQ(b.messages, 3);
  int blocks = 0;
  for (int s = 0; s < b.streams; ++s) {
    EXPECT_EQ(b.stream[s].firstBlock, blocks);
    EXPECT_EQ(b.stream[s].blocks, kP2PLanes);
    blocks += b.stream[s].blocks;
  }
  EXPECT_EQ(b.blocks, blocks);
  EXPECT_EQ(b.stream[0].kind, P2PKind::Recv);
  EXPECT_EQ(b.stream[1].kind, P2PKind::Send);
  const P2PStream& copy = b.stream[2];
  EXPECT_EQ(copy.kind, P2PKind::Copy);
  EXPECT_EQ(b.message[copy.firstMessage].buffer, buffers[1]);
  EXPECT_EQ(b.message[copy.firstMessage].source, buffers[0]);
  EXPECT_EQ(b.message[copy.firstMessage].bytes, big);
}

// Eight ranks, everything large: 15 streams share what fits, and all of them run.
TEST(P2PGroup, ManyWideStreamsShareTheResidentBlocks) {
  std::vector<PeerCall> calls;
  for (int p = 0; p < 8; ++p) {
    calls.push_back(call(true, p, 64ull << 20, 3, 8));
    calls.push_back(call(false, p, 64ull << 20, 3, 8));
  }
  for (int resident : {15, 16, 100, 264}) {
    const P2PBatch b = planP2PGroup(calls, resident);
    ASSERT_EQ(b.streams, 15);
    EXPECT_LE(b.blocks, resident);
    for (int s = 0; s < b.streams; ++s) {
      EXPECT_GE(b.stream[s].blocks, 1);
      EXPECT_LE(b.stream[s].blocks, kP2PLanes);
    }
    if (resident == 264) {
      EXPECT_EQ(b.blocks, 264);  // 17 or 18 each: every resident block has work
    }
  }
}

// Narrow streams take only what they can use; the wide one gets the rest.
TEST(P2PGroup, NarrowStreamsLeaveTheirBlocksToWideOnes) {
  std::vector<PeerCall> calls = {call(true, 1, 100, 0, 4), call(false, 2, 100, 0, 4),
                                 call(true, 3, 1ull << 30, 0, 4)};
  const P2PBatch b = planP2PGroup(calls, kP2PLanes + 10);
  ASSERT_EQ(b.streams, 3);
  EXPECT_EQ(b.stream[0].blocks, 1);  // send to 1
  EXPECT_EQ(b.stream[1].blocks, 1);  // recv from 2
  EXPECT_EQ(b.stream[2].blocks, kP2PLanes);
  const P2PBatch tight = planP2PGroup(calls, 10);
  EXPECT_EQ(tight.stream[2].blocks, 8);
}

// CommOptions::maxBlocks bounds the group's kernel, down to one block per stream.
TEST(P2PGroup, MaxBlocksBoundsTheKernel) {
  std::vector<PeerCall> calls = {call(true, 1, 100, 0, 4), call(false, 2, 100, 0, 4),
                                 call(true, 3, 1ull << 30, 0, 4)};
  EXPECT_EQ(planP2PGroup(calls, 264, 4).stream[2].blocks, 2);
  EXPECT_EQ(planP2PGroup(calls, 264, 4).blocks, 4);
  EXPECT_EQ(planP2PGroup(calls, 264, 1).blocks, 3);
  EXPECT_EQ(planP2PGroup(calls, 264, 500).blocks, 2 + kP2PLanes);
  EXPECT_EQ(planP2PGroup(calls, 264, 0).blocks, 2 + kP2PLanes);
}

// Messages with one peer stay in issue order, however they interleave with other peers'.
TEST(P2PGroup, MessagesOfAStreamKeepTheirIssueOrder) {
  std::vector<PeerCall> calls = {call(true, 1, 10, 0, 3, 0), call(true, 2, 20, 0, 3, 1),
                                 call(true, 1, 30, 0, 3, 2), call(false, 1, 40, 0, 3, 3),
                                 call(true, 1, 50, 0, 3, 4)};
  const P2PBatch b = planP2PGroup(calls, 100);
  ASSERT_EQ(b.streams, 3);  // recv from 1, send to 1, send to 2
  const P2PStream& to1 = b.stream[1];
  ASSERT_EQ(to1.kind, P2PKind::Send);
  ASSERT_EQ(to1.peer, 1);
  ASSERT_EQ(to1.messages, 3);
  EXPECT_EQ(b.message[to1.firstMessage].bytes, 10u);
  EXPECT_EQ(b.message[to1.firstMessage + 1].bytes, 30u);
  EXPECT_EQ(b.message[to1.firstMessage + 2].bytes, 50u);
}

TEST(P2PGroup, BadGroupsAreRefusedNamingTheCall) {
  std::vector<PeerCall> twoStreams = {call(true, 1, 8), call(false, 1, 8)};
  twoStreams[1].stream = reinterpret_cast<cudaStream_t>(0x1);
  EXPECT_NE(refusal(twoStreams, 100).find("rank 0: recv from rank 1: is on another stream"),
            std::string::npos);

  EXPECT_NE(refusal({call(true, 0, 8)}, 100).find("has no matching recv from this rank"), std::string::npos);
  EXPECT_NE(refusal({call(false, 0, 8)}, 100).find("has no matching send from this rank"), std::string::npos);
  EXPECT_NE(refusal({call(true, 0, 8), call(false, 0, 9)}, 100)
                .find("receives 9 bytes but the matching send has 8"),
            std::string::npos);

  std::vector<PeerCall> many(kP2PMaxOps + 1, call(true, 1, 8));
  EXPECT_NE(refusal(many, 1000).find("at most 64"), std::string::npos);
  std::vector<PeerCall> full(kP2PMaxOps, call(true, 1, 8));
  full.push_back(call(true, 0, 8));
  full.push_back(call(false, 0, 8));
  EXPECT_NE(refusal(full, 1000).find("pairs to itself"), std::string::npos);

  std::vector<PeerCall> wide = {call(true, 1, 8, 0, 3), call(true, 2, 8, 0, 3), call(false, 1, 8, 0, 3)};
  EXPECT_NE(refusal(wide, 2).find("split it into smaller groups"), std::string::npos);
}

}  // namespace
}  // namespace ferry
