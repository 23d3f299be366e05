#include "core/bootstrap_wire.hpp"

#include "core/serializer.hpp"
#include "ferry/errors.hpp"

namespace ferry::wire {
namespace {

void putPrelude(Writer& w, std::uint16_t kind) {
  w.put(kMagic);
  w.put(kVersion);
  w.put(kind);
}

// Returns the kind field after checking magic and version.
std::uint16_t getPrelude(Reader& r, const char* what) {
  auto magic = r.get<std::uint32_t>();
  if (magic != kMagic) throw Error(ErrorCode::ProtocolError, std::string(what) + " has a bad magic number");
  auto version = r.get<std::uint16_t>();
  if (version != kVersion)
    throw Error(ErrorCode::ProtocolError, std::string(what) + " has wire version " + std::to_string(version) +
                                              ", this build speaks " + std::to_string(kVersion) +
                                              " (mixed ferry versions?)");
  return r.get<std::uint16_t>();
}

void checkWorldSize(int worldSize, const char* what) {
  if (worldSize < 1 || worldSize > kMaxWorldSize)
    throw Error(ErrorCode::ProtocolError,
                std::string(what) + ": world size " + std::to_string(worldSize) + " out of range");
}

}  // namespace

std::vector<std::byte> encodeHello(const Hello& h) {
  Writer w;
  putPrelude(w, static_cast<std::uint16_t>(h.kind));
  w.put(h.rank);
  w.put(h.worldSize);
  w.put(h.target);
  h.listen.serialize(w);
  w.put(h.hostHash);
  w.put(h.nonce);
  return std::move(w).bytes();
}

Hello decodeHello(std::span<const std::byte> bytes) {
  if (bytes.size() != kHelloBytes)
    throw Error(ErrorCode::ProtocolError, "hello has " + std::to_string(bytes.size()) + " bytes, expected " +
                                              std::to_string(kHelloBytes));
  Reader r(bytes, "hello");
  Hello h;
  auto kind = getPrelude(r, "hello");
  if (kind != static_cast<std::uint16_t>(HelloKind::Join) &&
      kind != static_cast<std::uint16_t>(HelloKind::Connect))
    throw Error(ErrorCode::ProtocolError, "hello has unknown kind " + std::to_string(kind));
  h.kind = static_cast<HelloKind>(kind);
  h.rank = r.get<std::int32_t>();
  h.worldSize = r.get<std::int32_t>();
  h.target = r.get<std::int32_t>();
  checkWorldSize(h.worldSize, "hello");
  for (auto [name, value] : {std::pair{"rank", h.rank}, std::pair{"target rank", h.target}})
    if (value < 0 || value >= h.worldSize)
      throw Error(ErrorCode::ProtocolError, std::string("hello: ") + name + " " + std::to_string(value) +
                                                " out of range for world size " + std::to_string(h.worldSize));
  h.listen = SocketAddress::deserialize(r);
  h.hostHash = r.get<std::uint64_t>();
  h.nonce = r.get<Nonce>();
  r.expectEnd();
  return h;
}

std::vector<std::byte> encodeChallenge(const Challenge& c) {
  Writer w;
  putPrelude(w, 0);
  w.put(c.rank);
  w.put(c.nonce);
  w.put(c.tag);
  return std::move(w).bytes();
}

Challenge decodeChallenge(std::span<const std::byte> bytes, int worldSize) {
  if (bytes.size() != kChallengeBytes)
    throw Error(ErrorCode::ProtocolError, "challenge has " + std::to_string(bytes.size()) +
                                              " bytes, expected " + std::to_string(kChallengeBytes));
  checkWorldSize(worldSize, "challenge");
  Reader r(bytes, "challenge");
  if (getPrelude(r, "challenge") != 0) throw Error(ErrorCode::ProtocolError, "challenge has the wrong kind");
  Challenge c;
  c.rank = r.get<std::int32_t>();
  if (c.rank < 0 || c.rank >= worldSize)
    throw Error(ErrorCode::ProtocolError, "challenge: rank " + std::to_string(c.rank) +
                                              " out of range for world size " + std::to_string(worldSize));
  c.nonce = r.get<Nonce>();
  c.tag = r.get<Tag>();
  r.expectEnd();
  return c;
}

std::array<std::byte, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& h) {
  Writer w;
  putPrelude(w, static_cast<std::uint16_t>(h.kind));
  w.put(h.tag);
  w.put(h.length);
  std::array<std::byte, kFrameHeaderBytes> out{};
  std::copy(w.bytes().begin(), w.bytes().end(), out.begin());
  return out;
}

FrameHeader decodeFrameHeader(std::span<const std::byte> bytes, std::uint64_t maxLength) {
  Reader r(bytes, "frame header");
  FrameHeader h;
  auto kind = getPrelude(r, "frame header");
  if (kind < static_cast<std::uint16_t>(FrameKind::User) ||
      kind > static_cast<std::uint16_t>(FrameKind::Abort))
    throw Error(ErrorCode::ProtocolError, "frame header has unknown kind " + std::to_string(kind));
  h.kind = static_cast<FrameKind>(kind);
  h.tag = r.get<std::int64_t>();
  h.length = r.get<std::uint64_t>();
  r.expectEnd();
  if (h.length > maxLength)
    throw Error(ErrorCode::ProtocolError, "frame of " + std::to_string(h.length) +
                                              " bytes exceeds the limit of " + std::to_string(maxLength) +
                                              " (FERRY_BOOTSTRAP_MAX_MESSAGE)");
  return h;
}

std::vector<std::byte> encodeTable(const std::vector<PeerEntry>& table) {
  Writer w;
  putPrelude(w, static_cast<std::uint16_t>(FrameKind::Table));
  w.put(static_cast<std::int32_t>(table.size()));
  for (const auto& e : table) {
    e.listen.serialize(w);
    w.put(e.hostHash);
  }
  return std::move(w).bytes();
}

std::vector<PeerEntry> decodeTable(std::span<const std::byte> bytes, int worldSize) {
  Reader r(bytes, "peer table");
  if (getPrelude(r, "peer table") != static_cast<std::uint16_t>(FrameKind::Table))
    throw Error(ErrorCode::ProtocolError, "peer table has the wrong kind");
  auto n = r.get<std::int32_t>();
  if (n != worldSize)
    throw Error(ErrorCode::ProtocolError,
                "peer table has " + std::to_string(n) + " entries, expected " + std::to_string(worldSize));
  if (r.remaining() != static_cast<std::size_t>(n) * (SocketAddress::kWireBytes + 8))
    throw Error(ErrorCode::ProtocolError,
                "peer table has the wrong size for " + std::to_string(n) + " entries");
  std::vector<PeerEntry> out(static_cast<std::size_t>(n));
  for (auto& e : out) {
    e.listen = SocketAddress::deserialize(r);
    e.hostHash = r.get<std::uint64_t>();
  }
  r.expectEnd();
  return out;
}

std::vector<std::byte> encodeAbort(const AbortNotice& a) {
  Writer w;
  putPrelude(w, static_cast<std::uint16_t>(FrameKind::Abort));
  w.putString(a.reason.substr(0, kMaxAbortReason));
  w.put(static_cast<std::int32_t>(a.missingRanks.size()));
  for (auto rank : a.missingRanks) w.put(rank);
  return std::move(w).bytes();
}

AbortNotice decodeAbort(std::span<const std::byte> bytes, int worldSize) {
  checkWorldSize(worldSize, "abort notice");
  Reader r(bytes, "abort notice");
  if (getPrelude(r, "abort notice") != static_cast<std::uint16_t>(FrameKind::Abort))
    throw Error(ErrorCode::ProtocolError, "abort notice has the wrong kind");
  AbortNotice a;
  a.reason = r.getString();
  if (a.reason.size() > kMaxAbortReason)
    throw Error(ErrorCode::ProtocolError, "abort notice reason too long");
  auto n = r.get<std::int32_t>();
  if (n < 0 || n > worldSize || r.remaining() != static_cast<std::size_t>(n) * 4)
    throw Error(ErrorCode::ProtocolError, "abort notice lists a bad number of ranks");
  for (int i = 0; i < n; ++i) {
    auto rank = r.get<std::int32_t>();
    if (rank < 0 || rank >= worldSize) throw Error(ErrorCode::ProtocolError, "abort notice lists a bad rank");
    a.missingRanks.push_back(rank);
  }
  return a;
}

}  // namespace ferry::wire
