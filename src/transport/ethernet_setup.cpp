// EthernetConnection's setup (ethernet_connection.hpp): the listener and its key, the proof each
// side sends, and the accepting of the one connection that proves it among strangers.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "core/handshake.hpp"
#include "core/interfaces.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "transport/ethernet_connection.hpp"

namespace ferry {
namespace {

constexpr std::string_view kProofLabel = "ferry/ethernet/1/proof";

wire::Tag proofOf(const wire::Nonce& key, int from, int to) {
  const std::int32_t ranks[2] = {from, to};
  return handshake::mac(key, {std::as_bytes(std::span(kProofLabel)), std::as_bytes(std::span(ranks))});
}

}  // namespace

EthernetConnection::Endpoint EthernetConnection::Endpoint::open() {
  Endpoint e;
  SocketAddress local = chooseLocalAddress(std::nullopt);
  local.setPort(0);
  e.listener = Socket::listen(local, false);
  e.listener.setNonBlocking(true);  // establish() accepts until the queue is empty
  e.address = e.listener.localAddress();
  e.key = handshake::freshNonce();
  return e;
}

std::shared_ptr<EthernetConnection> EthernetConnection::establish(int rank, int remoteRank, Endpoint mine,
                                                                  const SocketAddress& theirAddress,
                                                                  const wire::Nonce& theirKey,
                                                                  std::chrono::duration<double> timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const std::string who = "rank " + std::to_string(rank) + ": Ethernet connection to rank " + std::to_string(remoteRank);
  // Out: to the peer's listener, with the proof that this rank got the peer's key.
  Socket out = Socket::connect(theirAddress, deadline);
  const wire::Tag proof = proofOf(theirKey, rank, remoteRank);
  out.sendAll(std::as_bytes(std::span(proof)), deadline);
  // In: the first connection on our listener that proves the peer got our key. Every connection
  // is read as its bytes come, side by side, so that strangers (or anyone who found the port) can
  // neither stall the real peer nor fill memory: a wrong proof or a close drops a connection at
  // once, and beyond kMaxPending silent ones the oldest goes.
  const wire::Tag expected = proofOf(mine.key, remoteRank, rank);
  struct Pending {
    Socket socket;
    wire::Tag got{};
    std::size_t have = 0;
  };
  constexpr std::size_t kMaxPending = 64;
  std::vector<Pending> pending;
  // One log line a second at most, each saying how many it stands for: a flood of strangers must
  // not become a flood of lines (as the bootstrap's rejections, docs/security.md).
  Clock::time_point lastLine{};
  std::uint64_t unreported = 0;
  auto turnAway = [&](std::size_t i, const std::string& why) {
    const auto now = Clock::now();
    if (now - lastLine >= std::chrono::seconds(1)) {
      lastLine = now;
      FERRY_LOG(Warn, Transport) << who << ": turned away a connection from "
                                 << pending[i].socket.peerAddress().toString() << " (" << why << ")"
                                 << (unreported ? " and " + std::to_string(std::exchange(unreported, 0)) +
                                                      " more before it, not shown"
                                                : std::string());
    } else {
      ++unreported;
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  Socket in;
  while (!in.valid()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      throw TimeoutError(who + ": rank " + std::to_string(remoteRank) + " did not connect to " +
                         mine.address.toString() + " within " + std::to_string(timeout.count()) +
                         " s (is it running, and can it reach this address? FERRY_SOCKET_IFNAME picks the "
                         "interface)");
    std::vector<pollfd> fds{{mine.listener.fd(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 200))) <= 0) continue;
    // Readable candidates first (their indices are those of this poll), then new connections.
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      const ssize_t got = ::recv(p.socket.fd(), p.got.data() + p.have, p.got.size() - p.have, MSG_DONTWAIT);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        turnAway(i, "closed before its proof");
        continue;
      }
      p.have += static_cast<std::size_t>(got);
      if (p.have < p.got.size()) continue;
      if (!handshake::tagsEqual(p.got, expected)) {
        turnAway(i, "a wrong proof: not rank " + std::to_string(remoteRank) + " of this job");
        continue;
      }
      in = std::move(p.socket);
      break;
    }
    if (in.valid() || !(fds[0].revents & POLLIN)) continue;
    for (;;) {
      Socket candidate(::accept4(mine.listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!candidate.valid()) break;
      pending.push_back({std::move(candidate)});
      if (pending.size() > kMaxPending) turnAway(0, "too many connections without a proof");
    }
  }
  // Each side tells the other that its proof was taken, so that neither writes into a socket the
  // other turned away.
  const std::byte ok{1};
  in.sendAll(std::span(&ok, 1), deadline);
  std::byte theirOk{};
  out.recvAll(std::span(&theirOk, 1), deadline);
  return std::make_shared<EthernetConnection>(rank, remoteRank, std::move(out), std::move(in));
}

}  // namespace ferry
