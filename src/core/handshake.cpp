#include "core/handshake.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cstring>
#include <memory>

#include "core/text.hpp"
#include "ferry/errors.hpp"

namespace ferry::handshake {
namespace {

// One EVP_MAC for the process (fetching looks up the provider; a context per MAC is cheap).
EVP_MAC* hmacAlgorithm() {
  static EVP_MAC* algorithm = [] {
    EVP_MAC* m = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (m == nullptr) throw Error(ErrorCode::InternalError, "libcrypto has no HMAC (EVP_MAC_fetch failed)");
    return m;
  }();
  return algorithm;
}

std::span<const std::byte> label(const char* text) { return std::as_bytes(std::span(text, std::strlen(text))); }

template <class T>
std::span<const std::byte> bytesOf(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

// Labels: the wire version is part of each, so MACs of one version are worth nothing in another.
constexpr const char* kChallengeLabel = "ferry/2/challenge";
constexpr const char* kProofLabel = "ferry/2/proof";
constexpr const char* kToAcceptorLabel = "ferry/2/to-acceptor";
constexpr const char* kToConnectorLabel = "ferry/2/to-connector";
constexpr const char* kTextSecretLabel = "ferry/2/secret-from-text";

// The session keys of the connection that `hello` and `challenge` opened.
std::pair<wire::Tag, wire::Tag> sessionKeys(const wire::Secret& secret, const wire::Nonce& helloNonce,
                                            const wire::Nonce& challengeNonce) {
  return {mac(secret, {label(kToAcceptorLabel), bytesOf(helloNonce), bytesOf(challengeNonce)}),
          mac(secret, {label(kToConnectorLabel), bytesOf(helloNonce), bytesOf(challengeNonce)})};
}

}  // namespace

wire::Tag mac(std::span<const std::uint8_t> key, std::initializer_list<std::span<const std::byte>> parts) {
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmacAlgorithm()), EVP_MAC_CTX_free);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  wire::Tag out{};
  std::size_t length = 0;
  bool ok = ctx && EVP_MAC_init(ctx.get(), key.data(), key.size(), params) == 1;
  for (auto part : parts)
    ok = ok && EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(part.data()), part.size()) == 1;
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &length, out.size()) == 1 && length == out.size();
  if (!ok) throw Error(ErrorCode::InternalError, "HMAC-SHA256 failed in libcrypto");
  return out;
}

bool tagsEqual(const wire::Tag& a, const wire::Tag& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

wire::Nonce freshNonce() {
  wire::Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw Error(ErrorCode::InternalError, "libcrypto could not make a random nonce (RAND_bytes failed)");
  return n;
}

wire::Secret secretFromText(std::string_view text) {
  static constexpr std::uint8_t kKey[] = {'f', 'e', 'r', 'r', 'y'};
  const wire::Tag full = mac(kKey, {label(kTextSecretLabel), std::as_bytes(std::span(text.data(), text.size()))});
  wire::Secret s{};
  std::memcpy(s.data(), full.data(), s.size());
  return s;
}

wire::Tag Session::sendTag(std::span<const std::byte> header, std::span<const std::byte> payload) {
  const std::uint64_t sequence = sent_++;
  return mac(sendKey_, {bytesOf(sequence), header, payload});
}

bool Session::receiveTagValid(std::span<const std::byte> header, std::span<const std::byte> payload,
                              const wire::Tag& tag) {
  const std::uint64_t sequence = received_++;
  return tagsEqual(mac(receiveKey_, {bytesOf(sequence), header, payload}), tag);
}

std::vector<std::byte> challengeFor(const wire::Secret& secret, std::span<const std::byte> hello, int rank,
                                    wire::Nonce& nonceOut) {
  wire::Challenge c;
  c.rank = rank;
  c.nonce = nonceOut = freshNonce();
  c.tag = mac(secret, {label(kChallengeLabel), hello, bytesOf(c.rank), bytesOf(c.nonce)});
  return wire::encodeChallenge(c);
}

std::optional<Session> acceptProof(const wire::Secret& secret, std::span<const std::byte> hello,
                                   std::span<const std::byte> challenge, std::span<const std::byte> proof) {
  wire::Tag got{};
  if (proof.size() != got.size()) return std::nullopt;
  std::memcpy(got.data(), proof.data(), got.size());
  if (!tagsEqual(mac(secret, {label(kProofLabel), hello, challenge}), got)) return std::nullopt;
  const wire::Hello h = wire::decodeHello(hello);
  const wire::Challenge c = wire::decodeChallenge(challenge, h.worldSize);
  auto [toAcceptor, toConnector] = sessionKeys(secret, h.nonce, c.nonce);
  return Session(/*send=*/toConnector, /*receive=*/toAcceptor);
}

Session connectHandshake(Socket& socket, wire::Hello hello, const wire::Secret& secret,
                         Clock::time_point deadline, const std::string& who) {
  hello.nonce = freshNonce();
  const std::vector<std::byte> helloBytes = wire::encodeHello(hello);
  const std::string there = rankName(hello.target) + " at " + socket.peerAddress().toString();
  socket.sendAll(helloBytes, deadline);
  std::array<std::byte, wire::kChallengeBytes> challengeBytes{};
  try {
    socket.recvAll(challengeBytes, deadline);
  } catch (const TimeoutError&) {
    throw TimeoutError(who + ": " + there + " accepted the connection but sent no challenge within the "
                             "handshake bound (FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT): it is hung, or not a ferry rank "
                             "of this version");
  } catch (const Error& e) {
    throw Error(ErrorCode::RemoteError, who + ": " + there + " closed the connection instead of answering " +
                                            "this rank's hello: it refused it (its log says why: world size, "
                                            "rank, a late join) or exited (" + e.detail() + ")");
  }
  wire::Challenge c;
  try {
    c = wire::decodeChallenge(challengeBytes, hello.worldSize);
  } catch (const Error& e) {
    throw Error(ErrorCode::ProtocolError, who + ": " + there + " answered with a malformed challenge: " + e.detail());
  }
  if (c.rank != hello.target)
    throw Error(ErrorCode::ProtocolError, who + ": the process at " + socket.peerAddress().toString() +
                                              " says it is " + rankName(c.rank) + ", not " +
                                              rankName(hello.target) + " (a stale peer table, or another job)");
  if (!tagsEqual(c.tag, mac(secret, {label(kChallengeLabel), helloBytes, bytesOf(c.rank), bytesOf(c.nonce)})))
    throw Error(ErrorCode::ProtocolError,
                who + ": " + there + " does not know this job's secret: it is not a rank of this job (another "
                                     "job on that port, a different UniqueId or FERRY_BOOTSTRAP_SECRET, or "
                                     "an impostor)");
  const wire::Tag proof = mac(secret, {label(kProofLabel), helloBytes, std::as_bytes(std::span(challengeBytes))});
  socket.sendAll(std::as_bytes(std::span(proof)), deadline);
  auto [toAcceptor, toConnector] = sessionKeys(secret, hello.nonce, c.nonce);
  return Session(/*send=*/toAcceptor, /*receive=*/toConnector);
}

}  // namespace ferry::handshake
