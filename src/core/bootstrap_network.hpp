#pragma once
// The bootstrap's transport: one progress thread per bootstrap owns the listening socket and every
// connection. It authenticates new connections (the challenge-response of core/handshake.hpp),
// writes queued frames (each with its tag under the connection's session) and files incoming
// frames, once their tags check, into a mailbox keyed by (peer, kind, tag), where callers wait for
// them with a deadline.
//
// Ordering: frames from one peer arrive in the order that peer queued them, because a peer sends
// everything to us over one connection, fixed at its first send (see connectionFor).
// Failure: a peer whose connections have all closed, or that broke the protocol, is failed;
// waiting for it raises RemoteError at once instead of running into the timeout.
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/bootstrap_wire.hpp"
#include "core/handshake.hpp"
#include "core/socket.hpp"

namespace ferry {

using Payload = std::vector<std::byte>;

class BootstrapNetwork {
 public:
  struct Config {
    int rank = 0;
    int worldSize = 1;
    wire::Secret secret{};
    std::uint64_t hostHash = 0;
    std::chrono::duration<double> handshakeTimeout{10.0};
    std::chrono::duration<double> flushTimeout{10.0};  // how long the destructor drains queued sends
    std::uint64_t maxMessage = 1ull << 30;
    bool acceptJoins = false;  // the root during init
  };

  BootstrapNetwork(const Config& config, Socket listener);
  ~BootstrapNetwork();
  BootstrapNetwork(const BootstrapNetwork&) = delete;
  BootstrapNetwork& operator=(const BootstrapNetwork&) = delete;

  const SocketAddress& listenAddress() const { return listenAddress_; }

  // The root during init: waits until `count` ranks have joined or the deadline passes, and returns
  // the hellos of those that joined, by rank.
  std::map<int, wire::Hello> waitForJoins(int count, Clock::time_point deadline);
  void stopAcceptingJoins();

  // Where each rank listens; needed before sending to a rank that has no connection with us.
  void setPeerAddresses(std::vector<SocketAddress> addresses);
  // Hands over an authenticated connection made by the caller (a joining rank's link to the root)
  // with the session its handshake made.
  void adopt(int peer, Socket socket, handshake::Session session);

  // Queues one frame to peer, connecting first if needed. `what` names the operation for errors.
  void send(int peer, wire::FrameKind kind, std::int64_t tag, std::shared_ptr<const Payload> payload,
            Clock::time_point deadline, const std::string& what);

  struct Message {
    wire::FrameKind kind;
    Payload data;
  };
  // Waits for a frame from peer of one of `kinds` with `tag`; nullopt at the deadline.
  std::optional<Message> receive(int peer, std::initializer_list<wire::FrameKind> kinds, std::int64_t tag,
                                 Clock::time_point deadline, const std::string& what);
  // Waits for a frame of (kind, tag) from each of `peers`, handing each to onMessage as it arrives
  // (outside the lock). Returns the peers still missing at the deadline.
  std::vector<int> receiveFromEach(wire::FrameKind kind, std::int64_t tag, const std::vector<int>& peers,
                                   Clock::time_point deadline, const std::string& what,
                                   const std::function<void(int, Payload&&)>& onMessage);

  // Waits until every queued frame is written or its peer has failed; false at the deadline.
  bool flush(Clock::time_point deadline);

  // Connections rejected so far (wrong secret, malformed hello, ...): for tests and logs.
  int rejectedConnections() const;

 private:
  struct OutFrame {
    std::array<std::byte, wire::kFrameHeaderBytes> header;
    std::shared_ptr<const Payload> payload;
  };
  struct Connection;
  struct Pending;
  using MailboxKey = std::tuple<int, wire::FrameKind, std::int64_t>;

  void run();
  void acceptNew();
  void evictOnePending();
  bool progressHandshake(Pending& p);  // true when finished (accepted or rejected)
  void reject(Pending& p, const std::string& reason);
  void reportRejections();
  void readFrom(Connection& c);
  void writeTo(Connection& c);
  void connectionFailed(Connection& c, const std::string& reason, bool failPeer);
  Connection* connectionFor(int peer, Clock::time_point deadline, const std::string& what);
  // With mu_ held: RemoteError naming `peer`, and every other rank known to be gone.
  [[noreturn]] void throwPeerFailed(int peer, const std::string& what) const;
  [[noreturn]] void throwPeerFailedAfterGrace(int peer, const std::string& what,
                                              std::unique_lock<std::mutex>& lock);
  void wake();

  const Config config_;
  Socket listener_;
  SocketAddress listenAddress_;
  int wakeFd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool acceptJoins_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Connection*> sendConnection_;  // by peer; fixed once chosen
  std::vector<SocketAddress> peerAddresses_;
  std::vector<std::string> peerFailure_;  // by peer; empty while usable
  std::map<MailboxKey, std::deque<Payload>> mailbox_;
  std::map<int, wire::Hello> joins_;
  int rejected_ = 0;

  std::vector<std::unique_ptr<Pending>> pending_;  // progress thread only
  Clock::time_point lastRejectionLine_{};           // progress thread only
  std::uint64_t unreportedRejections_ = 0;          // progress thread only
  std::thread thread_;
};

}  // namespace ferry
