#include "core/unique_id.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/host_id.hpp"
#include "core/interfaces.hpp"
#include "core/serializer.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

constexpr std::uint32_t kIdMagic = 0x44495246;  // "FRID"
constexpr std::uint16_t kIdVersion = 1;

struct Reserved {
  std::mutex mu;
  std::map<wire::Secret, Socket> sockets;
};
Reserved& reserved() {
  static Reserved* r = new Reserved();  // outlives static destruction order questions
  return *r;
}

}  // namespace

UniqueId UniqueId::create() {
  SocketAddress addr = chooseLocalAddress(std::nullopt);
  Socket listener = Socket::listen(addr, /*reuseAddr=*/false);
  UniqueIdContents c{randomSecret(), listener.localAddress()};
  Writer w;
  w.put(kIdMagic);
  w.put(kIdVersion);
  w.put(std::uint16_t{0});
  w.put(c.secret);
  c.root.serialize(w);
  UniqueId id;
  std::copy(w.bytes().begin(), w.bytes().end(), reinterpret_cast<std::byte*>(id.bytes.data()));
  std::lock_guard lock(reserved().mu);
  reserved().sockets[c.secret] = std::move(listener);
  return id;
}

UniqueIdContents decodeUniqueId(const UniqueId& id) {
  Reader r(std::as_bytes(std::span(id.bytes)), "UniqueId");
  if (r.get<std::uint32_t>() != kIdMagic || r.get<std::uint16_t>() != kIdVersion)
    throw Error(ErrorCode::InvalidUsage,
                "not a ferry UniqueId of this version (was all of its 128 bytes passed unchanged?)");
  r.get<std::uint16_t>();
  UniqueIdContents c;
  c.secret = r.get<wire::Secret>();
  c.root = SocketAddress::deserialize(r);
  if (!c.root.valid()) throw Error(ErrorCode::InvalidUsage, "UniqueId holds no root address");
  return c;
}

void UniqueId::releaseRootPort() const { dropReservedRootListener(decodeUniqueId(*this).secret); }

std::string UniqueId::rootAddress() const { return decodeUniqueId(*this).root.toString(); }

std::string UniqueId::toHex() const {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

UniqueId UniqueId::fromHex(const std::string& hex) {
  if (hex.size() != 2 * kBytes)
    throw Error(ErrorCode::InvalidUsage, "a UniqueId in hex has " + std::to_string(2 * kBytes) +
                                             " digits, this one has " + std::to_string(hex.size()));
  auto value = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(ErrorCode::InvalidUsage, std::string("UniqueId hex has a non-hex character '") + c + "'");
  };
  UniqueId id;
  for (std::size_t i = 0; i < kBytes; ++i)
    id.bytes[i] = static_cast<std::uint8_t>(value(hex[2 * i]) << 4 | value(hex[2 * i + 1]));
  return id;
}

std::optional<Socket> takeReservedRootListener(const wire::Secret& secret) {
  std::lock_guard lock(reserved().mu);
  auto it = reserved().sockets.find(secret);
  if (it == reserved().sockets.end()) return std::nullopt;
  Socket s = std::move(it->second);
  reserved().sockets.erase(it);
  return s;
}

void dropReservedRootListener(const wire::Secret& secret) {
  std::lock_guard lock(reserved().mu);
  reserved().sockets.erase(secret);
}

}  // namespace ferry
