#include "core/bootstrap_network.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cerrno>
#include <cstring>

#include "core/bootstrap_connection.hpp"
#include "core/handshake.hpp"
#include "core/host_id.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "core/deadline.hpp"

namespace ferry {

namespace {
constexpr std::size_t kMaxReadPerWakeup = 8ull << 20;  // so one busy peer cannot starve the others
// A payload's buffer starts this small and doubles as its bytes arrive: a header that announces a
// large message costs memory only once the message is really sent.
constexpr std::size_t kFirstPayloadBytes = 64 << 10;
}  // namespace

BootstrapNetwork::BootstrapNetwork(const Config& config, Socket listener)
    : config_(config),
      listener_(std::move(listener)),
      acceptJoins_(config.acceptJoins),
      sendConnection_(static_cast<std::size_t>(config.worldSize), nullptr),
      peerAddresses_(static_cast<std::size_t>(config.worldSize)),
      peerFailure_(static_cast<std::size_t>(config.worldSize)) {
  listenAddress_ = listener_.localAddress();
  listener_.setNonBlocking(true);
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) throw SysError("eventfd for the bootstrap progress thread", errno);
  thread_ = std::thread([this] { run(); });
}

BootstrapNetwork::~BootstrapNetwork() {
  // Deliver what was sent before closing, so that "send, then destroy" loses nothing.
  if (!flush(deadlineAfter(config_.flushTimeout)))
    FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank)
                               << ": closing the bootstrap with unsent messages (a peer stopped reading)";
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake();
  thread_.join();
  ::close(wakeFd_);
}

void BootstrapNetwork::wake() {
  std::uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof(one));
}

std::map<int, wire::Hello> BootstrapNetwork::waitForJoins(int count, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return static_cast<int>(joins_.size()) >= count; });
  return joins_;
}

void BootstrapNetwork::stopAcceptingJoins() {
  std::lock_guard lock(mu_);
  acceptJoins_ = false;
}

void BootstrapNetwork::setPeerAddresses(std::vector<SocketAddress> addresses) {
  std::lock_guard lock(mu_);
  peerAddresses_ = std::move(addresses);
}

void BootstrapNetwork::adopt(int peer, Socket socket, handshake::Session session) {
  socket.setNonBlocking(true);
  auto c = std::make_unique<Connection>();
  c->remote = socket.peerAddress();
  c->socket = std::move(socket);
  c->peer = peer;
  c->session = session;
  {
    std::lock_guard lock(mu_);
    if (sendConnection_[peer] == nullptr) sendConnection_[peer] = c.get();
    connections_.push_back(std::move(c));
  }
  wake();
}

int BootstrapNetwork::rejectedConnections() const {
  std::lock_guard lock(mu_);
  return rejected_;
}

// ---- caller side ----

void BootstrapNetwork::throwPeerFailed(int peer, const std::string& what) const {
  std::string others;
  for (int r = 0; r < config_.worldSize; ++r)
    if (r != peer && !peerFailure_[r].empty())
      others += (others.empty() ? "" : "; ") + rankName(r) + ": " + peerFailure_[r];
  throw Error(ErrorCode::RemoteError, rankName(config_.rank) + ": " + what + ": " + rankName(peer) +
                                          " is gone: " + peerFailure_[peer] +
                                          " (see that rank's log for why it stopped)" +
                                          (others.empty() ? "" : "; also gone: " + others));
}

void BootstrapNetwork::throwPeerFailedAfterGrace(int peer, const std::string& what,
                                                 std::unique_lock<std::mutex>& lock) {
  // When one rank fails, the ranks that depend on it stop too, and this rank may notice one of
  // them first. A moment's grace lets the other closes arrive, so that the error lists every rank
  // gone by then, the one that failed first among them, instead of naming only the first noticed.
  const auto graceEnd = Clock::now() + std::chrono::milliseconds(300);
  while (Clock::now() < graceEnd) cv_.wait_until(lock, graceEnd);
  throwPeerFailed(peer, what);
}

BootstrapNetwork::Connection* BootstrapNetwork::connectionFor(int peer, Clock::time_point deadline,
                                                              const std::string& what) {
  SocketAddress address;
  {
    std::lock_guard lock(mu_);
    if (!peerFailure_[peer].empty()) throwPeerFailed(peer, what);
    if (sendConnection_[peer] != nullptr) return sendConnection_[peer];
    // A connection the peer opened to us carries our frames too: one connection per pair is the
    // common case, and the choice is fixed from here on, which keeps our frames to peer in order.
    for (auto& c : connections_)
      if (c->peer == peer && !c->dead) return sendConnection_[peer] = c.get();
    address = peerAddresses_[peer];
  }
  if (!address.valid())
    throw Error(ErrorCode::InternalError,
                rankName(config_.rank) + ": " + what + ": no address known for " + rankName(peer));
  // Connecting and the handshake are bounded by the handshake timeout, not only by the call's
  // deadline: a peer that cannot be reached (packets dropped) must not hold up this rank's sends to
  // the others for the whole call, or they would blame this rank for its silence.
  const Clock::time_point callDeadline = deadline;
  deadline = std::min(deadline, deadlineAfter(config_.handshakeTimeout));
  Socket socket;
  for (int attempt = 0;; ++attempt) {
    try {
      socket = Socket::connect(address, deadline);
      break;
    } catch (const SysError& e) {
      // A refused connection to a listener that exists means the peer is gone; retry briefly in
      // case its accept queue overflowed.
      // A peer that advertises a loopback address while this rank listens on a real interface is
      // most likely on another host and misconfigured, not gone: say so.
      const bool loopback = address.isLoopback() && !listenAddress_.isLoopback();
      if (e.errnum() != ECONNREFUSED || attempt >= 20 || Clock::now() >= deadline)
        throw Error(ErrorCode::RemoteError,
                    rankName(config_.rank) + ": " + what + ": cannot connect to " + rankName(peer) + " at " +
                        address.toString() + ": " + e.detail() +
                        (loopback ? " (it advertises a loopback address, which reaches only its own host: if it "
                                    "runs on another host, set FERRY_SOCKET_IFNAME there to an interface this host "
                                    "can reach; else, has it exited?)"
                                  : " (has that rank exited?)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const TimeoutError&) {
      throw TimeoutError(rankName(config_.rank) + ": " + what + ": connecting to " + rankName(peer) + " at " +
                         address.toString() + " timed out" +
                         (deadline < callDeadline ? " (bounded by FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT: is that "
                                                    "address reachable from here?)"
                                                  : ""));
    }
  }
  wire::Hello hello;
  hello.kind = wire::HelloKind::Connect;
  hello.rank = config_.rank;
  hello.worldSize = config_.worldSize;
  hello.target = peer;
  hello.listen = listenAddress_;
  hello.hostHash = config_.hostHash;
  handshake::Session session =
      handshake::connectHandshake(socket, hello, config_.secret, deadline, rankName(config_.rank) + ": " + what);
  socket.setNonBlocking(true);
  auto c = std::make_unique<Connection>();
  c->remote = address;
  c->socket = std::move(socket);
  c->peer = peer;
  c->session = session;
  Connection* chosen;
  {
    std::lock_guard lock(mu_);
    // Another thread may have connected meanwhile; keep its choice and use ours for reading only.
    if (sendConnection_[peer] == nullptr) sendConnection_[peer] = c.get();
    chosen = sendConnection_[peer];
    connections_.push_back(std::move(c));
  }
  wake();
  return chosen;
}

void BootstrapNetwork::send(int peer, wire::FrameKind kind, std::int64_t tag,
                            std::shared_ptr<const Payload> payload, Clock::time_point deadline,
                            const std::string& what) {
  if (payload->size() > config_.maxMessage)
    throw Error(ErrorCode::InvalidUsage,
                rankName(config_.rank) + ": " + what + ": message of " + std::to_string(payload->size()) +
                    " bytes exceeds the limit of " + std::to_string(config_.maxMessage) +
                    " bytes (raise FERRY_BOOTSTRAP_MAX_MESSAGE on every rank)");
  Connection* c = connectionFor(peer, deadline, what);
  OutFrame frame{wire::encodeFrameHeader({kind, tag, payload->size()}), std::move(payload)};
  {
    std::lock_guard lock(mu_);
    if (c->dead) throwPeerFailed(peer, what);
    c->queue.push_back(std::move(frame));
  }
  wake();
}

std::optional<BootstrapNetwork::Message> BootstrapNetwork::receive(
    int peer, std::initializer_list<wire::FrameKind> kinds, std::int64_t tag, Clock::time_point deadline,
    const std::string& what) {
  std::unique_lock lock(mu_);
  for (;;) {
    for (auto kind : kinds) {
      auto it = mailbox_.find({peer, kind, tag});
      if (it != mailbox_.end() && !it->second.empty()) {
        Message m{kind, std::move(it->second.front())};
        it->second.pop_front();
        if (it->second.empty()) mailbox_.erase(it);
        return m;
      }
    }
    if (!peerFailure_[peer].empty()) throwPeerFailedAfterGrace(peer, what, lock);
    if (Clock::now() >= deadline) return std::nullopt;
    cv_.wait_until(lock, deadline);
  }
}

std::vector<int> BootstrapNetwork::receiveFromEach(wire::FrameKind kind, std::int64_t tag,
                                                   const std::vector<int>& peers, Clock::time_point deadline,
                                                   const std::string& what,
                                                   const std::function<void(int, Payload&&)>& onMessage) {
  std::vector<int> missing = peers;
  std::vector<std::pair<int, Payload>> arrived;
  std::unique_lock lock(mu_);
  for (;;) {
    std::erase_if(missing, [&](int peer) {
      auto it = mailbox_.find({peer, kind, tag});
      if (it == mailbox_.end()) return false;
      arrived.emplace_back(peer, std::move(it->second.front()));
      it->second.pop_front();
      if (it->second.empty()) mailbox_.erase(it);
      return true;
    });
    if (!arrived.empty()) {
      lock.unlock();
      for (auto& [peer, data] : arrived) onMessage(peer, std::move(data));
      arrived.clear();
      lock.lock();
      continue;  // more may have come in while the lock was released
    }
    if (missing.empty()) return missing;
    for (int peer : missing)
      if (!peerFailure_[peer].empty()) throwPeerFailedAfterGrace(peer, what, lock);
    if (Clock::now() >= deadline) return missing;
    cv_.wait_until(lock, deadline);
  }
}

bool BootstrapNetwork::flush(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] {
    return std::all_of(connections_.begin(), connections_.end(),
                       [](const auto& c) { return c->dead || c->queue.empty(); });
  });
}

// ---- progress thread ----

void BootstrapNetwork::run() {
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  for (;;) {
    fds.clear();
    polled.clear();
    fds.push_back({wakeFd_, POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    auto timeout = Clock::time_point::max();
    for (auto& p : pending_) {
      fds.push_back({p->socket.fd(), POLLIN, 0});
      timeout = std::min(timeout, p->deadline);
    }
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      for (auto& c : connections_) {
        if (c->dead) continue;
        short events = POLLIN;
        if (!c->queue.empty()) events |= POLLOUT;
        fds.push_back({c->socket.fd(), events, 0});
        polled.push_back(c.get());
      }
    }
    // Rejections not yet reported are reported within a second, even if nothing else happens.
    if (unreportedRejections_ > 0) timeout = std::min(timeout, lastRejectionLine_ + std::chrono::seconds(1));
    int waitMs = -1;
    if (timeout != Clock::time_point::max())
      waitMs = static_cast<int>(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout - Clock::now()).count() + 1, 0, 1 << 30));
    if (::poll(fds.data(), fds.size(), waitMs) < 0 && errno != EINTR) {
      FERRY_LOG(Error, Bootstrap) << rankName(config_.rank) << ": poll failed: " << std::strerror(errno);
      continue;
    }
    if (fds[0].revents) {
      std::uint64_t drained;
      (void)!::read(wakeFd_, &drained, sizeof(drained));
    }
    reportRejections();
    // Handshakes first, before acceptNew() changes pending_ (fds[2..] mirror pending_ as it was).
    std::size_t index = 2;
    auto now = Clock::now();
    std::vector<std::unique_ptr<Pending>> stillPending;
    for (auto& p : pending_) {
      bool done = false;
      if (fds[index++].revents) done = progressHandshake(*p);
      if (!done && now >= p->deadline) {
        reject(*p, std::string("did not complete the handshake (") + (p->challenge.empty() ? "hello" : "proof") +
                       ") within " + std::to_string(config_.handshakeTimeout.count()) + " s");
        done = true;
      }
      if (!done) stillPending.push_back(std::move(p));
    }
    pending_ = std::move(stillPending);
    if (fds[1].revents) acceptNew();
    for (Connection* c : polled) {
      short revents = fds[index++].revents;
      // Only this thread closes sockets, so valid() needs no lock here.
      if ((revents & (POLLIN | POLLHUP | POLLERR)) && c->socket.valid()) readFrom(*c);
      if ((revents & POLLOUT) && c->socket.valid()) writeTo(*c);
    }
  }
}

void BootstrapNetwork::connectionFailed(Connection& c, const std::string& reason, bool failPeer) {
  std::lock_guard lock(mu_);
  c.dead = true;
  c.queue.clear();
  c.socket.close();
  // A clean close fails the peer only once all its connections are closed: by then every frame it
  // sent on any of them has been read, so no waiter misses a message that was on its way.
  bool anyLeft = std::any_of(connections_.begin(), connections_.end(),
                             [&](const auto& other) { return other->peer == c.peer && !other->dead; });
  if ((failPeer || !anyLeft) && peerFailure_[c.peer].empty()) peerFailure_[c.peer] = reason;
  cv_.notify_all();
}

void BootstrapNetwork::readFrom(Connection& c) {
  using Reading = Connection::Reading;
  std::size_t budget = kMaxReadPerWakeup;
  while (budget > 0) {
    std::byte* dst = nullptr;
    std::size_t want = 0;
    switch (c.reading) {
      case Reading::Header:
        dst = c.header.data() + c.headerGot;
        want = c.header.size() - c.headerGot;
        break;
      case Reading::Payload:
        if (c.payloadGot == c.payload.size() && c.payloadGot < c.frame.length)
          c.payload.resize(static_cast<std::size_t>(std::min<std::uint64_t>(c.frame.length, 2 * c.payload.size())));
        dst = c.payload.data() + c.payloadGot;
        want = std::min(c.payload.size() - c.payloadGot, budget);
        break;
      case Reading::Tag:
        dst = reinterpret_cast<std::byte*>(c.tag.data()) + c.tagGot;
        want = c.tag.size() - c.tagGot;
        break;
    }
    ssize_t n = want == 0 ? 0 : ::recv(c.socket.fd(), dst, want, 0);
    if (want != 0 && n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      bool midFrame = c.headerGot > 0 || c.reading != Reading::Header;
      connectionFailed(
          c,
          n == 0 ? std::string(midFrame ? "its connection closed in the middle of a message"
                                        : "it closed its connection (exited or destroyed its bootstrap)")
                 : std::string("connection error: ") + std::strerror(errno),
          midFrame || n < 0);
      return;
    }
    budget -= std::min<std::size_t>(budget, static_cast<std::size_t>(n));
    switch (c.reading) {
      case Reading::Header:
        c.headerGot += static_cast<std::size_t>(n);
        if (c.headerGot < c.header.size()) continue;
        try {
          c.frame = wire::decodeFrameHeader(c.header, config_.maxMessage);
        } catch (const Error& e) {
          FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank) << ": dropping the connection from "
                                     << rankName(c.peer) << ": " << e.detail();
          connectionFailed(c, "it sent a malformed message: " + e.detail(), true);
          return;
        }
        c.payload.assign(static_cast<std::size_t>(std::min<std::uint64_t>(c.frame.length, kFirstPayloadBytes)),
                         std::byte{0});
        c.payloadGot = 0;
        c.reading = Reading::Payload;
        break;
      case Reading::Payload:
        c.payloadGot += static_cast<std::size_t>(n);
        break;
      case Reading::Tag:
        c.tagGot += static_cast<std::size_t>(n);
        break;
    }
    if (c.reading == Reading::Payload && c.payloadGot == c.frame.length) {
      c.tagGot = 0;
      c.reading = Reading::Tag;
    }
    if (c.reading == Reading::Tag && c.tagGot == c.tag.size()) {
      if (!c.session.receiveTagValid(c.header, c.payload, c.tag)) {
        FERRY_LOG(Warn, Bootstrap) << rankName(config_.rank) << ": dropping the connection from "
                                   << rankName(c.peer) << " at " << c.remote.toString()
                                   << ": a message failed authentication (altered or injected on the way)";
        connectionFailed(c, "a message on its connection failed authentication (altered or injected on the way)",
                         true);
        return;
      }
      std::lock_guard lock(mu_);
      mailbox_[{c.peer, c.frame.kind, c.frame.tag}].push_back(std::move(c.payload));
      c.payload = {};
      c.headerGot = 0;
      c.reading = Reading::Header;
      cv_.notify_all();
    }
  }
}

void BootstrapNetwork::writeTo(Connection& c) {
  for (;;) {
    OutFrame head;
    std::size_t sent;
    {
      std::lock_guard lock(mu_);
      if (c.queue.empty() || c.dead) {
        cv_.notify_all();  // flush() waits for empty queues
        return;
      }
      head = c.queue.front();
      sent = c.headSent;
    }
    // The session numbers frames in the order they go out: the head's tag is made once, before
    // its first byte leaves (only this thread writes, and the queue is written in order).
    if (!c.headTagMade) {
      c.headTag = c.session.sendTag(head.header, *head.payload);
      c.headTagMade = true;
    }
    const std::size_t headerBytes = head.header.size(), payloadBytes = head.payload->size();
    const std::size_t total = headerBytes + payloadBytes + c.headTag.size();
    iovec iov[3];
    int count = 0;
    if (sent < headerBytes) iov[count++] = {head.header.data() + sent, headerBytes - sent};
    const std::size_t payloadSent = std::clamp(sent, headerBytes, headerBytes + payloadBytes) - headerBytes;
    if (payloadSent < payloadBytes)
      iov[count++] = {const_cast<std::byte*>(head.payload->data()) + payloadSent, payloadBytes - payloadSent};
    const std::size_t tagSent = std::max(sent, headerBytes + payloadBytes) - headerBytes - payloadBytes;
    iov[count++] = {c.headTag.data() + tagSent, c.headTag.size() - tagSent};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    ssize_t n = ::sendmsg(c.socket.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      connectionFailed(c, std::string("sending to it failed: ") + std::strerror(errno), true);
      return;
    }
    std::lock_guard lock(mu_);
    c.headSent += static_cast<std::size_t>(n);
    if (c.headSent == total) {
      c.queue.pop_front();
      c.headSent = 0;
      c.headTagMade = false;
    }
  }
}

}  // namespace ferry
