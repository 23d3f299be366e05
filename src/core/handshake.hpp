#pragma once
// The bootstrap's authentication (docs/security.md): a challenge-response over fresh nonces, keyed
// by the job's secret, which never travels; then a MAC on every frame under per-direction session
// keys. HMAC-SHA256 from OpenSSL's libcrypto.
//
// What each MAC covers (K: the job's secret; "..." a label that keeps the uses apart):
//   challenge tag = HMAC(K, "ferry/2/challenge" | hello | accepting rank | accepting nonce)
//   proof         = HMAC(K, "ferry/2/proof" | hello | challenge)
//   session keys  = HMAC(K, "ferry/2/to-acceptor" | hello nonce | challenge nonce), and "to-connector"
//   frame tag     = HMAC(session key of its direction, sequence number | header | payload)
// So a recorded hello, challenge or proof is worth nothing on another connection (the other
// side's nonce differs), each side proves it knows K to the other, the hello (ranks, purpose,
// addresses) cannot be altered, and a frame cannot be injected, replayed, reordered or moved to
// another connection without the receiver noticing.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/bootstrap_wire.hpp"
#include "core/socket.hpp"

namespace ferry::handshake {

// HMAC-SHA256 of the concatenated parts.
wire::Tag mac(std::span<const std::uint8_t> key, std::initializer_list<std::span<const std::byte>> parts);
// Constant-time comparison.
bool tagsEqual(const wire::Tag& a, const wire::Tag& b);
wire::Nonce freshNonce();
// A secret from text (FERRY_BOOTSTRAP_SECRET and the like): its HMAC under a fixed label, cut to size.
wire::Secret secretFromText(std::string_view text);

// One authenticated connection's keys and counters.
class Session {
 public:
  Session() = default;
  Session(const wire::Tag& sendKey, const wire::Tag& receiveKey) : sendKey_(sendKey), receiveKey_(receiveKey) {}
  // The tag of the next frame this side sends, and of the next it receives.
  wire::Tag sendTag(std::span<const std::byte> header, std::span<const std::byte> payload);
  bool receiveTagValid(std::span<const std::byte> header, std::span<const std::byte> payload, const wire::Tag& tag);

 private:
  wire::Tag sendKey_{}, receiveKey_{};
  std::uint64_t sent_ = 0, received_ = 0;
};

// The accepting side, in two steps (it runs them on a non-blocking socket, one message at a time):
// the challenge for a hello, then the session if the proof is right (nullopt: wrong secret).
std::vector<std::byte> challengeFor(const wire::Secret& secret, std::span<const std::byte> hello, int rank,
                                    wire::Nonce& nonceOut);
std::optional<Session> acceptProof(const wire::Secret& secret, std::span<const std::byte> hello,
                                   std::span<const std::byte> challenge, std::span<const std::byte> proof);

// The connecting side, blocking until `deadline` (the caller bounds it by the handshake timeout):
// sends `hello` (its nonce filled in here),
// checks that the other side is rank hello.target and knows the secret, sends the proof. Errors
// (RemoteError, ProtocolError, TimeoutError) say so, naming `who` ("rank 3: bootstrap init") and
// the address.
Session connectHandshake(Socket& socket, wire::Hello hello, const wire::Secret& secret,
                         Clock::time_point deadline, const std::string& who);

}  // namespace ferry::handshake
