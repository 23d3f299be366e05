// Writes one valid encoding of each message into a directory: the fuzzer's starting corpus, so it
// spends its time on near-valid inputs instead of first discovering the magic number and sizes.
#include <fstream>
#include <string>

#include "core/bootstrap_wire.hpp"

using namespace ferry;

static void write(const std::string& path, std::span<const std::byte> bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string dir = argv[1];
  wire::Nonce nonce{};
  nonce.fill(7);
  // The first byte also picks the world size the table, abort and challenge decoders expect (1 + byte % 64).
  write(dir + "/hello_v4",
        wire::encodeHello({wire::HelloKind::Join, 1, 4, 0, SocketAddress::parse("127.0.0.1:9"), 5, nonce}));
  write(dir + "/hello_v6",
        wire::encodeHello({wire::HelloKind::Connect, 0, 2, 1, SocketAddress::parse("[::1]:9"), 6, nonce}));
  wire::Challenge challenge{1, nonce, {}};
  challenge.tag.fill(3);
  write(dir + "/challenge", wire::encodeChallenge(challenge));
  auto header = wire::encodeFrameHeader({wire::FrameKind::AllGather, 3, 100});
  write(dir + "/frame_header", header);
  write(dir + "/table",
        wire::encodeTable({{SocketAddress::parse("127.0.0.1:1"), 1}, {SocketAddress::parse("[::1]:2"), 2}}));
  write(dir + "/abort", wire::encodeAbort({"ranks 1 never joined", {1}}));
  return 0;
}
