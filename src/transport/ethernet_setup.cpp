// EthernetConnection's setup (ethernet_connection.hpp): the listener and its key, the proof each
// side sends per lane, and the accepting of the connections that prove it among strangers.
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

// The proof for one lane: a connection proves which lane it is, and can stand for no other.
wire::Tag proofOf(const wire::Nonce& key, int from, int to, int lane) {
  const std::int32_t ranks[3] = {from, to, lane};
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
                                                                  const wire::Nonce& theirKey, int lanes,
                                                                  std::chrono::duration<double> timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const std::string who =
      "rank " + std::to_string(rank) + ": Ethernet connection to rank " + std::to_string(remoteRank);
  // Out: to the peer's listener, once per lane, each with the proof that this rank got the peer's
  // key (for that lane).
  std::vector<Socket> outs;
  for (int lane = 0; lane < lanes; ++lane) {
    outs.push_back(Socket::connect(theirAddress, deadline));
    const wire::Tag proof = proofOf(theirKey, rank, remoteRank, lane);
    outs.back().sendAll(std::as_bytes(std::span(proof)), deadline);
  }
  // In: for each lane, the first connection on our listener that proves the peer got our key for
  // that lane. Every connection is read as its bytes come, side by side, so that strangers (or
  // anyone who found the port) can neither stall the real peer nor fill memory: a wrong proof or a
  // close drops a connection at once, and beyond kMaxPending silent ones the oldest goes.
  std::vector<wire::Tag> expected;
  for (int lane = 0; lane < lanes; ++lane) expected.push_back(proofOf(mine.key, remoteRank, rank, lane));
  std::vector<Socket> ins(static_cast<std::size_t>(lanes));
  int proven = 0;
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
  while (proven < lanes) {
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
      std::size_t lane = 0;
      while (lane < expected.size() && (ins[lane].valid() || !handshake::tagsEqual(p.got, expected[lane])))
        ++lane;
      if (lane == expected.size()) {
        turnAway(i, "a wrong proof: not rank " + std::to_string(remoteRank) + " of this job");
        continue;
      }
      ins[lane] = std::move(p.socket);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      ++proven;
    }
    if (proven == lanes || !(fds[0].revents & POLLIN)) continue;
    for (;;) {
      Socket candidate(::accept4(mine.listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!candidate.valid()) break;
      pending.push_back({std::move(candidate)});
      if (pending.size() > kMaxPending) turnAway(0, "too many connections without a proof");
    }
  }
  // Each side tells the other that its proofs were taken, so that neither writes into a socket
  // the other turned away.
  const std::byte ok{1};
  for (Socket& in : ins) in.sendAll(std::span(&ok, 1), deadline);
  for (Socket& out : outs) {
    std::byte theirOk{};
    out.recvAll(std::span(&theirOk, 1), deadline);
  }
  return std::make_shared<EthernetConnection>(rank, remoteRank, std::move(outs), std::move(ins));
}

}  // namespace ferry
