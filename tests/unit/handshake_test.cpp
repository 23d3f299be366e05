// The bootstrap's challenge-response (core/handshake.hpp) over real loopback sockets: both sides
// end with matching sessions; a wrong secret fails on whichever side holds it; a recorded hello and
// proof are worth nothing against a fresh challenge, from the same rank later or another rank; a
// frame's tag catches a changed, replayed or reordered frame.
#include "core/handshake.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "expect_contains.hpp"
#include "ferry/errors.hpp"

namespace ferry::handshake {
namespace {

using namespace std::chrono_literals;

std::span<const std::byte> text(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

std::string hex(const wire::Tag& t) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : t) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

TEST(Handshake, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2.
  const std::uint8_t key[] = {'J', 'e', 'f', 'e'};
  const auto tag = mac(key, {text("what do ya want "), text("for nothing?")});
  EXPECT_EQ(hex(tag), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

wire::Hello helloFrom(int rank, int target) {
  wire::Hello h;
  h.kind = wire::HelloKind::Connect;
  h.rank = rank;
  h.worldSize = 4;
  h.target = target;
  h.listen = SocketAddress::resolve("127.0.0.1", 1);
  return h;
}

// What the accepting side receives and answers, recorded; `proofOverride` replaces the proof it
// reads (a replay).
struct Accepted {
  std::vector<std::byte> hello, challenge, proof;
  std::optional<Session> session;
};

// One connection: the accepting side (this thread's helper) as rank `acceptorRank` with
// `acceptorSecret`, the connecting side with `connectorSecret`. Returns what the acceptor saw; the
// connector's result or error comes back through `connector`.
Accepted runOnce(int acceptorRank, const wire::Secret& acceptorSecret, const wire::Secret& connectorSecret,
                 wire::Hello hello, std::optional<Session>* connectorSession, std::string* connectorError) {
  Socket listener = Socket::listen(SocketAddress::resolve("127.0.0.1", 0), false);
  const SocketAddress at = listener.localAddress();
  auto connector = std::async(std::launch::async, [&] {
    try {
      Socket s = Socket::connect(at, Clock::now() + 5s);
      *connectorSession = connectHandshake(s, hello, connectorSecret, Clock::now() + 5s, "rank 1: test");
      std::this_thread::sleep_for(50ms);
    } catch (const Error& e) {
      *connectorError = e.what();
    }
  });
  Accepted a;
  int fd = ::accept(listener.fd(), nullptr, nullptr);
  Socket s(fd);
  a.hello.resize(wire::kHelloBytes);
  s.recvAll(a.hello, Clock::now() + 5s);
  wire::Nonce nonce;
  a.challenge = challengeFor(acceptorSecret, a.hello, acceptorRank, nonce);
  s.sendAll(a.challenge, Clock::now() + 5s);
  a.proof.resize(wire::kProofBytes);
  try {
    s.recvAll(a.proof, Clock::now() + 5s);
    a.session = acceptProof(acceptorSecret, a.hello, a.challenge, a.proof);
  } catch (const Error&) {  // the connector gave up: no proof
    a.proof.clear();
  }
  connector.get();
  return a;
}

TEST(Handshake, BothSidesEndWithOneSessionAndFramesCheck) {
  const wire::Secret secret{9, 8, 7};
  std::optional<Session> connector;
  std::string error;
  Accepted a = runOnce(0, secret, secret, helloFrom(1, 0), &connector, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_TRUE(a.session && connector);
  const auto header = text("header-bytes"), payload = text("payload-bytes");
  // Connector to acceptor, and back.
  wire::Tag t1 = connector->sendTag(header, payload);
  EXPECT_TRUE(a.session->receiveTagValid(header, payload, t1));
  wire::Tag t2 = a.session->sendTag(header, payload);
  EXPECT_TRUE(connector->receiveTagValid(header, payload, t2));
  // The same frame again (a replay) is the next sequence number's: refused.
  EXPECT_FALSE(a.session->receiveTagValid(header, payload, t1));
  // A changed payload is refused.
  Session fresh1 = *connector;
  wire::Tag t3 = fresh1.sendTag(header, payload);
  Session fresh2 = *a.session;
  EXPECT_FALSE(fresh2.receiveTagValid(header, text("payload-bytez"), t3));
  // Tags of one direction do not verify in the other.
  EXPECT_NE(t1, t2);
}

TEST(Handshake, AWrongSecretFailsOnTheSideThatHoldsIt) {
  const wire::Secret job{1}, other{2};
  // The connector holds the wrong one: the acceptor's challenge does not check out for it.
  std::optional<Session> connector;
  std::string error;
  Accepted a = runOnce(0, job, other, helloFrom(1, 0), &connector, &error);
  EXPECT_FALSE(connector);
  EXPECT_CONTAINS(error, "does not know this job's secret");
  EXPECT_FALSE(a.session);
  // An impostor that skips the check and sends a proof under its own secret: refused.
  wire::Nonce nonce;
  auto hello = wire::encodeHello(helloFrom(1, 0));
  auto challenge = challengeFor(job, hello, 0, nonce);
  const auto forged = mac(other, {text("ferry/2/proof"), hello, challenge});
  EXPECT_FALSE(acceptProof(job, hello, challenge, std::as_bytes(std::span(forged))));
}

TEST(Handshake, ARecordedHelloAndProofAreRefusedLaterAndElsewhere) {
  const wire::Secret secret{5, 5, 5};
  std::optional<Session> connector;
  std::string error;
  Accepted recorded = runOnce(0, secret, secret, helloFrom(1, 0), &connector, &error);
  ASSERT_TRUE(recorded.session) << error;
  // The same rank later: its new challenge has a new nonce, the recorded proof covers the old one.
  wire::Nonce nonce;
  auto later = challengeFor(secret, recorded.hello, 0, nonce);
  EXPECT_FALSE(acceptProof(secret, recorded.hello, later, recorded.proof));
  // Another rank: the recorded hello names rank 0 as its target (the bootstrap refuses it before
  // any challenge); one changed to name rank 2 no longer matches the proof.
  auto retargeted = wire::decodeHello(recorded.hello);
  retargeted.target = 2;
  auto retargetedBytes = wire::encodeHello(retargeted);
  auto elsewhere = challengeFor(secret, retargetedBytes, 2, nonce);
  EXPECT_FALSE(acceptProof(secret, retargetedBytes, elsewhere, recorded.proof));
  EXPECT_FALSE(acceptProof(secret, recorded.hello, recorded.challenge, std::span(recorded.proof).first(8)));
}

TEST(Handshake, TheConnectorChecksWhomItReached) {
  const wire::Secret secret{3};
  std::optional<Session> connector;
  std::string error;
  runOnce(/*acceptorRank=*/2, secret, secret, helloFrom(1, 0), &connector, &error);
  EXPECT_FALSE(connector);
  EXPECT_CONTAINS(error, "says it is rank 2, not rank 0");
}

TEST(Handshake, SecretsFromTextDifferAndRepeat) {
  EXPECT_EQ(secretFromText("a:1"), secretFromText("a:1"));
  EXPECT_NE(secretFromText("a:1"), secretFromText("a:2"));
}

}  // namespace
}  // namespace ferry::handshake
