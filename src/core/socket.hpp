#pragma once
// Thin RAII wrappers over BSD sockets for the bootstrap: an address type that handles IPv4 and IPv6
// alike, and a Socket that owns its file descriptor.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <span>
#include <string>

namespace ferry {

class Reader;
class Writer;
using Clock = std::chrono::steady_clock;

// Waits until fd has one of `events` (poll) or the deadline passes; false on timeout. Retries on
// EINTR; other poll errors are SysError.
bool waitForFd(int fd, short events, Clock::time_point deadline);

class SocketAddress {
 public:
  SocketAddress() = default;
  SocketAddress(const sockaddr* sa, socklen_t len);
  // "host:port", "[v6]:port" or "v6addr" with a separate port; the host may be a name (resolved).
  static SocketAddress parse(const std::string& hostPort);
  static SocketAddress resolve(const std::string& host, int port);

  int family() const { return storage_.ss_family; }
  bool valid() const { return family() == AF_INET || family() == AF_INET6; }
  int port() const;
  void setPort(int port);
  bool isLoopback() const;
  bool isLinkLocal() const;
  std::string host() const;
  std::string toString() const;  // "1.2.3.4:5" or "[::1]:5"

  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const;

  // Fixed-size wire form (kWireBytes): family, port, 16 address bytes, IPv6 scope id.
  static constexpr std::size_t kWireBytes = 1 + 2 + 16 + 4;
  void serialize(Writer& w) const;
  static SocketAddress deserialize(Reader& r);

  friend bool operator==(const SocketAddress& a, const SocketAddress& b) {
    return a.toString() == b.toString();
  }

 private:
  sockaddr_storage storage_{};
};

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  // Binds and listens; port 0 picks a free port. reuseAddr lets a restarted root rebind its port.
  static Socket listen(const SocketAddress& addr, bool reuseAddr);
  // One connect attempt, bounded by deadline. Throws SysError (e.g. ECONNREFUSED) or TimeoutError.
  static Socket connect(const SocketAddress& addr, Clock::time_point deadline);

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void close();
  void setNonBlocking(bool on);
  SocketAddress localAddress() const;
  SocketAddress peerAddress() const;

  // Blocking whole-buffer transfers bounded by deadline (poll-based, so they work on non-blocking
  // sockets too). Throw TimeoutError, SysError, or RemoteError on a closed connection.
  void sendAll(std::span<const std::byte> data, Clock::time_point deadline);
  void recvAll(std::span<std::byte> data, Clock::time_point deadline);

 private:
  int fd_ = -1;
};

}  // namespace ferry
