// The bootstrap's wire format: round trips, and rejection of every kind of malformed input without
// reading out of bounds or allocating what a length field claims.
#include "core/bootstrap_wire.hpp"

#include <gtest/gtest.h>

#include "core/host_id.hpp"
#include "core/serializer.hpp"
#include "ferry/errors.hpp"

namespace ferry::wire {
namespace {

template <class F>
void expectProtocolError(F&& f, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "expected ProtocolError containing '" << words << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ProtocolError) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

Hello sampleHello() {
  Hello h;
  h.kind = HelloKind::Join;
  h.rank = 3;
  h.worldSize = 8;
  h.target = 0;
  h.listen = SocketAddress::resolve("::1", 4242);
  h.hostHash = 0x1234567890abcdefull;
  h.nonce = randomSecret();
  return h;
}

TEST(BootstrapWire, HelloRoundTrip) {
  Hello h = sampleHello();
  auto bytes = encodeHello(h);
  ASSERT_EQ(bytes.size(), kHelloBytes);
  Hello back = decodeHello(bytes);
  EXPECT_EQ(back.kind, h.kind);
  EXPECT_EQ(back.nonce, h.nonce);
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.worldSize, 8);
  EXPECT_EQ(back.target, 0);
  EXPECT_EQ(back.listen.toString(), "[::1]:4242");
  EXPECT_EQ(back.hostHash, h.hostHash);
}

TEST(BootstrapWire, HelloRejectsMalformedInput) {
  auto good = encodeHello(sampleHello());
  expectProtocolError([&] { decodeHello(std::span(good).first(good.size() - 1)); }, "expected");
  auto bad = good;
  bad[0] ^= std::byte{1};
  expectProtocolError([&] { decodeHello(bad); }, "bad magic");
  bad = good;
  bad[4] = std::byte{9};  // version
  expectProtocolError([&] { decodeHello(bad); }, "wire version");
  bad = good;
  bad[6] = std::byte{7};  // kind
  expectProtocolError([&] { decodeHello(bad); }, "unknown kind");
  Hello h = sampleHello();
  h.rank = 8;  // == world size
  expectProtocolError([&] { decodeHello(encodeHello(h)); }, "rank 8 out of range");
  h.rank = 0;
  h.target = 9;
  expectProtocolError([&] { decodeHello(encodeHello(h)); }, "target rank 9 out of range");
  h.target = 0;
  h.worldSize = -1;
  expectProtocolError([&] { decodeHello(encodeHello(h)); }, "world size -1");
}

TEST(BootstrapWire, ChallengeRoundTripAndChecks) {
  Challenge c;
  c.rank = 2;
  c.nonce = randomSecret();
  c.tag.fill(0xAB);
  auto bytes = encodeChallenge(c);
  ASSERT_EQ(bytes.size(), kChallengeBytes);
  Challenge back = decodeChallenge(bytes, 4);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.nonce, c.nonce);
  EXPECT_EQ(back.tag, c.tag);
  expectProtocolError([&] { decodeChallenge(bytes, 2); }, "rank 2 out of range");
  expectProtocolError([&] { decodeChallenge(std::span(bytes).first(bytes.size() - 1), 4); }, "expected");
  auto bad = bytes;
  bad[0] ^= std::byte{1};
  expectProtocolError([&] { decodeChallenge(bad, 4); }, "bad magic");
}

TEST(BootstrapWire, FrameHeaderRejectsHugeLengthWithoutAllocating) {
  auto header = encodeFrameHeader({FrameKind::User, 5, 1ull << 62});
  expectProtocolError([&] { decodeFrameHeader(header, 1ull << 30); }, "exceeds the limit");
  auto ok = decodeFrameHeader(encodeFrameHeader({FrameKind::AllGather, -3, 1024}), 1024);
  EXPECT_EQ(ok.kind, FrameKind::AllGather);
  EXPECT_EQ(ok.tag, -3);
  EXPECT_EQ(ok.length, 1024u);
  auto badKind = encodeFrameHeader({FrameKind::User, 0, 0});
  badKind[6] = std::byte{99};
  expectProtocolError([&] { decodeFrameHeader(badKind, 10); }, "unknown kind");
}

TEST(BootstrapWire, TableRoundTripAndSizeChecks) {
  std::vector<PeerEntry> table = {{SocketAddress::resolve("127.0.0.1", 1), 11},
                                  {SocketAddress::resolve("::1", 2), 22}};
  auto bytes = encodeTable(table);
  auto back = decodeTable(bytes, 2);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].listen.toString(), "127.0.0.1:1");
  EXPECT_EQ(back[1].listen.toString(), "[::1]:2");
  EXPECT_EQ(back[1].hostHash, 22u);
  expectProtocolError([&] { decodeTable(bytes, 3); }, "expected 3");
  bytes.pop_back();
  expectProtocolError([&] { decodeTable(bytes, 2); }, "wrong size");
}

TEST(BootstrapWire, AbortRoundTripAndBounds) {
  AbortNotice a{"ranks 3 never joined", {3}};
  auto back = decodeAbort(encodeAbort(a), 4);
  EXPECT_EQ(back.reason, a.reason);
  EXPECT_EQ(back.missingRanks, a.missingRanks);
  expectProtocolError([&] { decodeAbort(encodeAbort(a), 3); }, "bad rank");
  // A reason whose length field claims 4 GiB: rejected as truncated, not allocated.
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<std::uint16_t>(FrameKind::Abort));
  w.put(std::uint32_t{0xFFFFFFFF});
  expectProtocolError([&] { decodeAbort(w.bytes(), 4); }, "truncated");
}

TEST(HostId, SecretsAndHashes) {
  EXPECT_NE(randomSecret(), randomSecret());
  EXPECT_EQ(derivedSecret("a:1"), derivedSecret("a:1"));
  EXPECT_NE(derivedSecret("a:1"), derivedSecret("a:2"));
  auto s = randomSecret();
  auto t = s;
  EXPECT_TRUE(secretsEqual(s, t));
  t[15] ^= 1;
  EXPECT_FALSE(secretsEqual(s, t));
  EXPECT_EQ(fnv1a(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);  // published FNV-1a test vector
}

}  // namespace
}  // namespace ferry::wire
