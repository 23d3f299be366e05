// libFuzzer target for everything the bootstrap decodes from the network before (hello,
// challenge, and the handshake's checks of a proof) and after (frame header, peer table, abort
// notice) a peer has authenticated. Each decoder must return a
// value or throw ferry::Error; a crash, an out-of-bounds read (ASan), undefined behaviour (UBSan) or
// an allocation above -malloc_limit_mb is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/bootstrap_wire.hpp"
#include "core/handshake.hpp"
#include "core/serializer.hpp"
#include "ferry/errors.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto bytes = std::as_bytes(std::span(data, size));
  int worldSize = size > 0 ? 1 + data[0] % 64 : 1;
  try {
    wire::Hello h = wire::decodeHello(bytes);
    // What decodes must encode to something that decodes to the same hello.
    wire::Hello again = wire::decodeHello(wire::encodeHello(h));
    if (again.rank != h.rank || again.worldSize != h.worldSize || again.target != h.target ||
        again.nonce != h.nonce || again.listen.toString() != h.listen.toString() || again.hostHash != h.hostHash)
      std::abort();
  } catch (const Error&) {
  }
  try {
    wire::Challenge c = wire::decodeChallenge(bytes.first(std::min(size, wire::kChallengeBytes)), worldSize);
    if (wire::decodeChallenge(wire::encodeChallenge(c), worldSize).tag != c.tag) std::abort();
  } catch (const Error&) {
  }
  // The accepting side's check of a proof, on a hello, a challenge and a proof cut from the input:
  // never accepted (the input knows no secret), never a crash.
  if (size >= wire::kHelloBytes + wire::kChallengeBytes + wire::kProofBytes) {
    static const wire::Secret secret{1, 2, 3};
    try {
      if (handshake::acceptProof(secret, bytes.first(wire::kHelloBytes),
                                 bytes.subspan(wire::kHelloBytes, wire::kChallengeBytes),
                                 bytes.subspan(wire::kHelloBytes + wire::kChallengeBytes, wire::kProofBytes)))
        std::abort();
    } catch (const Error&) {
    }
  }
  try {
    wire::decodeFrameHeader(bytes.first(std::min(size, wire::kFrameHeaderBytes)), 1u << 20);
  } catch (const Error&) {
  }
  try {
    wire::decodeTable(bytes, worldSize);
  } catch (const Error&) {
  }
  try {
    wire::decodeAbort(bytes, worldSize);
  } catch (const Error&) {
  }
  try {
    Reader r(bytes);
    SocketAddress::deserialize(r).toString();
  } catch (const Error&) {
  }
  return 0;
}
