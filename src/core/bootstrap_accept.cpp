// How the bootstrap's progress thread admits connections: accept, the accepting side of the
// handshake (core/handshake.hpp), eviction when too many are handshaking, and rejections with their
// rate-limited log lines. docs/security.md says what a connection costs before it has proven itself.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "core/bootstrap_connection.hpp"
#include "core/bootstrap_network.hpp"
#include "core/deadline.hpp"
#include "core/handshake.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"

namespace ferry {

namespace {
constexpr std::size_t kMaxPending = 64;  // unauthenticated connections at once
}  // namespace

void BootstrapNetwork::acceptNew() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank) << ": accept failed: " << std::strerror(errno);
      return;
    }
    auto p = std::make_unique<Pending>();
    p->socket = Socket(fd);
    p->remote = SocketAddress(reinterpret_cast<sockaddr*>(&ss), len);
    p->deadline = deadlineAfter(config_.handshakeTimeout);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A rank sends its hello right after connecting, so it is usually here already: such a
    // connection is done before it could be crowded out by connections that say nothing.
    if (progressHandshake(*p)) continue;
    if (pending_.size() >= kMaxPending) evictOnePending();
    pending_.push_back(std::move(p));
  }
}

// Full: the connections that hold the place are dropped, not the newcomer, so that idle
// connections cannot keep real ranks out. The victim comes from the source address with the most
// connections still handshaking (a flood's), and among those it is the one that has sent the least,
// for the longest.
void BootstrapNetwork::evictOnePending() {
  std::map<std::string, int> perSource;
  for (const auto& q : pending_) ++perSource[q->remote.host()];
  auto victim = pending_.begin();
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    const int a = perSource[(*it)->remote.host()], b = perSource[(*victim)->remote.host()];
    const std::size_t got = (*it)->received(), victimGot = (*victim)->received();
    if (a != b ? a > b : got != victimGot ? got < victimGot : (*it)->deadline < (*victim)->deadline)
      victim = it;
  }
  reject(**victim, "dropped to make room: " + std::to_string(pending_.size()) + " connections were handshaking, " +
                       std::to_string(perSource[(*victim)->remote.host()]) + " of them from this address");
  pending_.erase(victim);
}

// One line per rejected connection, at most one a second: a flood of connections must not become
// a flood of log lines. Those not shown are counted in the next line, or in a line of their own
// (reportRejections) once a second has passed.
void BootstrapNetwork::reject(Pending& p, const std::string& reason) {
  p.socket.close();
  {
    std::lock_guard lock(mu_);
    ++rejected_;
  }
  const auto now = Clock::now();
  if (now - lastRejectionLine_ < std::chrono::seconds(1)) {
    ++unreportedRejections_;
    return;
  }
  lastRejectionLine_ = now;
  const std::uint64_t others = std::exchange(unreportedRejections_, 0);
  FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank) << ": rejected a connection from " << p.remote.toString()
                             << ": " << reason
                             << (others ? " (and " + std::to_string(others) + " more rejected before it, not shown)" : "");
}

void BootstrapNetwork::reportRejections() {
  if (unreportedRejections_ == 0 || Clock::now() - lastRejectionLine_ < std::chrono::seconds(1)) return;
  lastRejectionLine_ = Clock::now();
  FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank) << ": rejected "
                             << std::exchange(unreportedRejections_, 0)
                             << " more connection(s) since the last such line (one line a second at most)";
}

bool BootstrapNetwork::progressHandshake(Pending& p) {
  const bool readingProof = !p.challenge.empty();
  std::span<std::byte> message = readingProof ? std::span<std::byte>(p.proof) : std::span<std::byte>(p.hello);
  for (;;) {
    ssize_t n = ::recv(p.socket.fd(), message.data() + p.got, message.size() - p.got, 0);
    if (n > 0) {
      p.got += static_cast<std::size_t>(n);
      if (p.got == message.size()) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n < 0 && errno == EINTR) continue;
    reject(p, n == 0 ? std::string("closed before sending a complete ") + (readingProof ? "proof" : "hello")
                     : std::string("recv: ") + std::strerror(errno));
    return true;
  }
  wire::Hello hello;
  try {
    hello = wire::decodeHello(p.hello);
  } catch (const Error& e) {
    reject(p, e.detail());
    return true;
  }
  if (hello.worldSize != config_.worldSize) {
    reject(p, "it claims world size " + std::to_string(hello.worldSize) + ", this group has " +
                  std::to_string(config_.worldSize));
    return true;
  }
  if (hello.rank == config_.rank) {
    reject(p, "it claims this rank's own number " + std::to_string(hello.rank));
    return true;
  }
  if (hello.target != config_.rank) {
    reject(p, "it means to reach " + rankName(hello.target) + ", not this rank (a stale peer table?)");
    return true;
  }
  if (!readingProof) {
    // The challenge is a few dozen bytes on a fresh connection: it fits the socket's buffer, so a
    // short write means a broken connection, not a full one.
    wire::Nonce nonce;
    p.challenge = handshake::challengeFor(config_.secret, p.hello, config_.rank, nonce);
    ssize_t n = ::send(p.socket.fd(), p.challenge.data(), p.challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(p.challenge.size())) {
      reject(p, "could not send it the challenge: " + std::string(n < 0 ? std::strerror(errno) : "short write"));
      return true;
    }
    p.got = 0;
    return false;  // the proof comes once the other side has checked the challenge
  }
  std::optional<handshake::Session> session =
      handshake::acceptProof(config_.secret, p.hello, p.challenge, p.proof);
  if (!session) {
    reject(p, "wrong proof of the job's secret (a stray client, a rank of another job, or a replayed handshake)");
    return true;
  }
  auto c = std::make_unique<Connection>();
  c->remote = p.remote;
  c->socket = std::move(p.socket);
  c->peer = hello.rank;
  c->session = *session;
  std::unique_lock lock(mu_);
  if (hello.kind == wire::HelloKind::Join) {
    std::string why = !acceptJoins_ ? "a join arrived after init (another job on this port, or a late rank?)"
                      : joins_.count(hello.rank) ? "a second join for " + rankName(hello.rank) +
                                                       " (two processes started with the same rank?)"
                                                 : "";
    if (!why.empty()) {
      lock.unlock();
      p.socket = std::move(c->socket);
      reject(p, why);
      return true;
    }
    joins_[hello.rank] = hello;
  }
  FERRY_LOG(Debug, Bootstrap) << rankName(config_.rank) << ": accepted " << rankName(hello.rank) << " from "
                              << p.remote.toString();
  connections_.push_back(std::move(c));
  cv_.notify_all();
  return true;
}

}  // namespace ferry
