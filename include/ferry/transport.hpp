#pragma once
// Transports: the kinds of link a Connection can use, and TransportFlags, the set of transports a
// RegisteredMemory is registered for (what a peer may use to reach it).
//
//   ferry::TransportFlags flags = ferry::Transport::CudaIpc | ferry::Transport::HostMemory;
//   if (flags.has(ferry::Transport::CudaIpc)) { ... }
//   std::string text = ferry::toString(flags);  // "CudaIpc|HostMemory"
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/api.hpp"

namespace ferry {

enum class Transport : std::uint8_t {
  CudaIpc,     // same host: GPU memory mapped into the peer (cuMem file descriptors or legacy IPC)
  HostMemory,  // same host: shared host memory (memfd) mapped into the peer
  Ethernet,    // any host: TCP
  InfiniBand,  // any host: RDMA verbs
};
inline constexpr int kTransportCount = 4;

// A set of transports. Trivially copyable, constexpr; the wire form is bits() (one byte).
class TransportFlags {
 public:
  constexpr TransportFlags() = default;
  // Implicit, so that a single Transport can be passed where flags are expected.
  constexpr TransportFlags(Transport t) : bits_(bitOf(t)) {}  // NOLINT(google-explicit-constructor)

  constexpr bool has(Transport t) const { return (bits_ & bitOf(t)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr std::uint8_t bits() const { return bits_; }
  // @pre bits has no bit above kTransportCount (fromBitsChecked in the library validates input).
  static constexpr TransportFlags fromBits(std::uint8_t bits) {
    TransportFlags f;
    f.bits_ = static_cast<std::uint8_t>(bits & kAllBits);
    return f;
  }

  constexpr TransportFlags operator|(TransportFlags o) const { return fromBits(bits_ | o.bits_); }
  constexpr TransportFlags operator&(TransportFlags o) const { return fromBits(bits_ & o.bits_); }
  constexpr TransportFlags& operator|=(TransportFlags o) { return *this = *this | o; }
  constexpr bool operator==(const TransportFlags&) const = default;

  static constexpr std::uint8_t kAllBits = (1u << kTransportCount) - 1;

 private:
  static constexpr std::uint8_t bitOf(Transport t) {
    return static_cast<std::uint8_t>(1u << static_cast<unsigned>(t));
  }
  std::uint8_t bits_ = 0;
};

constexpr TransportFlags operator|(Transport a, Transport b) { return TransportFlags(a) | b; }

// Every transport.
inline constexpr TransportFlags kAllTransports = TransportFlags::fromBits(TransportFlags::kAllBits);

// "CudaIpc", "HostMemory", "Ethernet", "InfiniBand"; "unknown" for a value out of range.
FERRY_API std::string_view toString(Transport t);
// Names joined by '|', "none" for the empty set.
FERRY_API std::string toString(TransportFlags flags);

}  // namespace ferry
