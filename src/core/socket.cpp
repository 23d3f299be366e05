#include "core/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/serializer.hpp"
#include "ferry/errors.hpp"

namespace ferry {
bool waitForFd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) throw SysError("poll", errno);
  }
}

SocketAddress::SocketAddress(const sockaddr* sa, socklen_t len) {
  std::memcpy(&storage_, sa, std::min<std::size_t>(len, sizeof(storage_)));
}

SocketAddress SocketAddress::resolve(const std::string& host, int port) {
  if (port < 0 || port > 65535)
    throw Error(ErrorCode::InvalidUsage,
                "port " + std::to_string(port) + " of '" + host + "' is out of range");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw Error(ErrorCode::InvalidUsage, "cannot resolve host '" + host + "': " + gai_strerror(rc));
  SocketAddress out(res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  out.setPort(port);
  return out;
}

SocketAddress SocketAddress::parse(const std::string& hostPort) {
  std::string host;
  std::string port;
  if (!hostPort.empty() && hostPort.front() == '[') {
    auto close = hostPort.find(']');
    if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
      throw Error(ErrorCode::InvalidUsage, "address '" + hostPort + "' is not of the form [v6addr]:port");
    host = hostPort.substr(1, close - 1);
    port = hostPort.substr(close + 2);
  } else {
    auto colon = hostPort.rfind(':');
    if (colon == std::string::npos || hostPort.find(':') != colon)
      throw Error(ErrorCode::InvalidUsage,
                  "address '" + hostPort + "' is not of the form host:port (write IPv6 as [addr]:port)");
    host = hostPort.substr(0, colon);
    port = hostPort.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (host.empty() || port.empty() || *end != '\0' || p < 0 || p > 65535)
    throw Error(ErrorCode::InvalidUsage, "address '" + hostPort + "' has no valid host and port");
  return resolve(host, static_cast<int>(p));
}

int SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return -1;
}

void SocketAddress::setPort(int port) {
  if (family() == AF_INET)
    reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(static_cast<uint16_t>(port));
  if (family() == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(static_cast<uint16_t>(port));
}

bool SocketAddress::isLoopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
  return false;
}

bool SocketAddress::isLinkLocal() const {
  return family() == AF_INET6 &&
         IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
}

std::string SocketAddress::host() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf, sizeof(buf));
  else if (family() == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buf, sizeof(buf));
  else
    return "<none>";
  return buf;
}

std::string SocketAddress::toString() const {
  if (!valid()) return "<none>";
  // Appends rather than operator+ chains: GCC 12 at -O3 reports a false -Wrestrict on those.
  std::string out = family() == AF_INET6 ? "[" : "";
  out.append(host()).append(family() == AF_INET6 ? "]:" : ":").append(std::to_string(port()));
  return out;
}

socklen_t SocketAddress::length() const {
  return family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

void SocketAddress::serialize(Writer& w) const {
  std::uint8_t fam = family() == AF_INET ? 4 : family() == AF_INET6 ? 6 : 0;
  std::array<std::uint8_t, 16> addr{};
  std::uint32_t scope = 0;
  if (fam == 4) std::memcpy(addr.data(), &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, 4);
  if (fam == 6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
    std::memcpy(addr.data(), &s6->sin6_addr, 16);
    scope = s6->sin6_scope_id;
  }
  w.put(fam);
  w.put(static_cast<std::uint16_t>(fam ? port() : 0));
  w.put(addr);
  w.put(scope);
}

SocketAddress SocketAddress::deserialize(Reader& r) {
  auto fam = r.get<std::uint8_t>();
  auto port = r.get<std::uint16_t>();
  auto addr = r.get<std::array<std::uint8_t, 16>>();
  auto scope = r.get<std::uint32_t>();
  SocketAddress out;
  if (fam == 4) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&out.storage_);
    s4->sin_family = AF_INET;
    std::memcpy(&s4->sin_addr, addr.data(), 4);
  } else if (fam == 6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&out.storage_);
    s6->sin6_family = AF_INET6;
    std::memcpy(&s6->sin6_addr, addr.data(), 16);
    s6->sin6_scope_id = scope;
  } else if (fam != 0) {
    throw Error(ErrorCode::ProtocolError, "address family " + std::to_string(fam) + " is neither 4 nor 6");
  }
  out.setPort(port);
  return out;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket Socket::listen(const SocketAddress& addr, bool reuseAddr) {
  Socket s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) throw SysError("socket() for listening on " + addr.toString(), errno);
  int one = 1;
  if (reuseAddr) ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), addr.sa(), addr.length()) != 0) throw SysError("bind to " + addr.toString(), errno);
  if (::listen(s.fd(), 1024) != 0) throw SysError("listen on " + addr.toString(), errno);
  return s;
}

Socket Socket::connect(const SocketAddress& addr, Clock::time_point deadline) {
  Socket s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) throw SysError("socket() for connecting to " + addr.toString(), errno);
  int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(s.fd(), addr.sa(), addr.length()) != 0) {
    if (errno != EINPROGRESS) throw SysError("connect to " + addr.toString(), errno);
    if (!waitForFd(s.fd(), POLLOUT, deadline))
      throw TimeoutError("connect to " + addr.toString() + " timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw SysError("connect to " + addr.toString(), err);
  }
  s.setNonBlocking(false);
  return s;
}

void Socket::setNonBlocking(bool on) {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  ::fcntl(fd_, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

SocketAddress Socket::localAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw SysError("getsockname", errno);
  return SocketAddress(reinterpret_cast<sockaddr*>(&ss), len);
}

SocketAddress Socket::peerAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return {};
  return SocketAddress(reinterpret_cast<sockaddr*>(&ss), len);
}

void Socket::sendAll(std::span<const std::byte> data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!waitForFd(fd_, POLLOUT, deadline))
        throw TimeoutError("send to " + peerAddress().toString() + " timed out");
    } else {
      throw SysError("send to " + peerAddress().toString(), errno);
    }
  }
}

void Socket::recvAll(std::span<std::byte> data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::recv(fd_, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      throw Error(ErrorCode::RemoteError, "connection from " + peerAddress().toString() + " closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!waitForFd(fd_, POLLIN, deadline))
        throw TimeoutError("receive from " + peerAddress().toString() + " timed out");
    } else {
      throw SysError("recv from " + peerAddress().toString(), errno);
    }
  }
}

}  // namespace ferry
