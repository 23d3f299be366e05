#pragma once
// The bootstrap's wire format. Every decoder here takes untrusted bytes: it either returns a
// well-formed value or throws Error(ProtocolError); it never reads out of bounds and never
// allocates more than its input (or a stated bound) justifies. tests/fuzz feeds it random input.
//
// A connection starts with one fixed-size Hello (so a stranger cannot make us wait for or allocate
// a length of its choosing before it has proven the secret), then carries frames: a fixed-size
// FrameHeader and `length` payload bytes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/socket.hpp"

namespace ferry::wire {

inline constexpr std::uint32_t kMagic = 0x59525246;  // "FRRY"
inline constexpr std::uint16_t kVersion = 1;
using Secret = std::array<std::uint8_t, 16>;

enum class HelloKind : std::uint16_t {
  Join = 1,     // a rank joining through the root during init
  Connect = 2,  // a rank opening a connection to a peer it knows from the peer table
};

struct Hello {
  HelloKind kind = HelloKind::Connect;
  Secret secret{};
  std::int32_t rank = -1;
  std::int32_t worldSize = 0;
  SocketAddress listen;  // where this rank accepts connections
  std::uint64_t hostHash = 0;
};
inline constexpr std::size_t kHelloBytes = 4 + 2 + 2 + 16 + 4 + 4 + SocketAddress::kWireBytes + 8;

std::vector<std::byte> encodeHello(const Hello& h);
// Checks magic, version and kind, and that rank and worldSize are in range (1..kMaxWorldSize).
Hello decodeHello(std::span<const std::byte> bytes);
inline constexpr std::int32_t kMaxWorldSize = 1 << 20;

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
