#pragma once
// The bootstrap's wire format. Every decoder here takes untrusted bytes: it either returns a
// well-formed value or throws Error(ProtocolError); it never reads out of bounds and never
// allocates more than its input (or a stated bound) justifies. tests/fuzz feeds it random input.
//
// A connection starts with an authenticated handshake of fixed-size messages (so a stranger cannot
// make us wait for or allocate a length of its choosing before it has proven the job's secret):
//   connecting side -> accepting side: Hello     (who it is, whom it means to reach, a fresh nonce)
//   accepting side -> connecting side: Challenge (its rank, a fresh nonce, an HMAC over both)
//   connecting side -> accepting side: Proof     (an HMAC over the hello and the challenge)
// The secret itself never travels (core/handshake.hpp says what each HMAC covers). Then the
// connection carries frames: a fixed-size FrameHeader, `length` payload bytes and a FrameTag, an
// HMAC of the frame under the connection's own session key and sequence number.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/socket.hpp"

namespace ferry::wire {

inline constexpr std::uint32_t kMagic = 0x59525246;  // "FRRY"
inline constexpr std::uint16_t kVersion = 2;
using Secret = std::array<std::uint8_t, 16>;
using Nonce = std::array<std::uint8_t, 16>;
using Tag = std::array<std::uint8_t, 32>;  // an HMAC-SHA256

enum class HelloKind : std::uint16_t {
  Join = 1,     // a rank joining through the root during init
  Connect = 2,  // a rank opening a connection to a peer it knows from the peer table
};

struct Hello {
  HelloKind kind = HelloKind::Connect;
  std::int32_t rank = -1;
  std::int32_t worldSize = 0;
  std::int32_t target = -1;  // the rank it means to reach
  SocketAddress listen;      // where this rank accepts connections
  std::uint64_t hostHash = 0;
  Nonce nonce{};
};
inline constexpr std::size_t kHelloBytes = 4 + 2 + 2 + 4 + 4 + 4 + SocketAddress::kWireBytes + 8 + 16;

std::vector<std::byte> encodeHello(const Hello& h);
// Checks magic, version and kind, and that rank, target and worldSize are in range
// (1..kMaxWorldSize).
Hello decodeHello(std::span<const std::byte> bytes);
inline constexpr std::int32_t kMaxWorldSize = 1 << 20;

struct Challenge {
  std::int32_t rank = -1;  // the accepting side's
  Nonce nonce{};
  Tag tag{};
};
inline constexpr std::size_t kChallengeBytes = 4 + 2 + 2 + 4 + 16 + 32;
std::vector<std::byte> encodeChallenge(const Challenge& c);
// Checks magic and version, and that rank is in 0..worldSize-1.
Challenge decodeChallenge(std::span<const std::byte> bytes, int worldSize);

inline constexpr std::size_t kProofBytes = sizeof(Tag);
inline constexpr std::size_t kFrameTagBytes = sizeof(Tag);

enum class FrameKind : std::uint16_t {
  User = 1,       // Bootstrap::send/recv; tag is the user's tag
  AllGather = 2,  // tag is the collective's sequence number
  Barrier = 3,    // tag is the collective's sequence number
  Table = 4,      // root -> rank during init: the peer table
  Abort = 5,      // root -> rank during init: the job cannot start (AbortNotice)
};

struct FrameHeader {
  FrameKind kind = FrameKind::User;
  std::int64_t tag = 0;
  std::uint64_t length = 0;
};
inline constexpr std::size_t kFrameHeaderBytes = 4 + 2 + 2 + 8 + 8;

std::array<std::byte, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& h);
// Throws ProtocolError for a bad magic or kind, or a length above maxLength.
FrameHeader decodeFrameHeader(std::span<const std::byte> bytes, std::uint64_t maxLength);

struct PeerEntry {
  SocketAddress listen;
  std::uint64_t hostHash = 0;
};
std::vector<std::byte> encodeTable(const std::vector<PeerEntry>& table);
// The table must have exactly worldSize entries.
std::vector<PeerEntry> decodeTable(std::span<const std::byte> bytes, int worldSize);

struct AbortNotice {
  std::string reason;
  std::vector<std::int32_t> missingRanks;
};
inline constexpr std::size_t kMaxAbortReason = 4096;
std::vector<std::byte> encodeAbort(const AbortNotice& a);
AbortNotice decodeAbort(std::span<const std::byte> bytes, int worldSize);

}  // namespace ferry::wire
