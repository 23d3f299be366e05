#include "memory/fd_server.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/host_id.hpp"
#include "core/logger.hpp"
#include "core/socket.hpp"
#include "ferry/errors.hpp"
#include "platform/process_identity.hpp"
#include "core/deadline.hpp"

namespace ferry {
namespace {

constexpr std::uint32_t kRequestMagic = 0x31444646;  // "FFD1"
constexpr std::uint32_t kReplyMagic = 0x52444646;    // "FFDR"
// How long one client has to deliver its whole request: a slow or silent client delays the others
// by at most this.
constexpr auto kRequestDeadline = std::chrono::milliseconds(1000);

enum class Status : std::uint32_t { Ok = 0, UnknownId = 1, BadToken = 2, Malformed = 3 };

struct Request {
  std::uint32_t magic;
  std::uint32_t reserved;
  std::uint64_t id;
  FdToken token;
};
struct Reply {
  std::uint32_t magic;
  std::uint32_t status;
};
static_assert(sizeof(Request) == 32 && sizeof(Reply) == 8);

sockaddr_un abstractAddress(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // sun_path[0] stays NUL: the abstract namespace (no file, gone with the socket).
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

// Reads exactly n bytes before deadline; false if the peer closed early or time ran out.
bool readExactly(int fd, void* out, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    if (!waitForFd(fd, POLLIN, deadline)) return false;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

std::string hex64(std::uint64_t v) {
  std::ostringstream s;
  s << std::hex << std::setw(16) << std::setfill('0') << v;
  return s.str();
}

}  // namespace

FdServer::FdServer() {
  name_ = "ferry-fd-" + std::to_string(::getpid()) + "-" + hex64(random64());
  listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_.valid()) throw SysError("socket(AF_UNIX) for the fd server", errno);
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(name_, len);
  if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    throw SysError("bind of the fd server socket @" + name_, errno);
  if (::listen(listen_.get(), 128) != 0) throw SysError("listen on the fd server socket @" + name_, errno);
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) throw SysError("eventfd for the fd server", errno);
  thread_ = std::thread([this] { run(); });
  FERRY_LOG(Debug, Transport) << "fd server listening on @" << name_;
}

FdServer::~FdServer() {
  std::uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0) {
    FERRY_LOG(Error, Transport) << "fd server: cannot wake its thread to stop: " << std::strerror(errno);
  }
  if (thread_.joinable()) thread_.join();
}

void abandonFdServerAfterFork(FdServer* server) {
  // In a forked child the thread does not exist: neither join nor destroy it; close the sockets so
  // the child holds no reference to its parent's server.
  server->listen_.reset();
  server->wake_.reset();
}

namespace {
struct InstanceState {
  std::mutex mutex;
  FdServer* server = nullptr;  // leaked: peers may ask until the process ends
  pid_t owner = 0;
};
InstanceState& instanceState() {
  static auto* state = new InstanceState();
  return *state;
}
}  // namespace

FdServer& FdServer::instance() {
  InstanceState& st = instanceState();
  std::lock_guard lock(st.mutex);
  if (st.server != nullptr && st.owner != ::getpid()) {
    abandonFdServerAfterFork(st.server);
    st.server = nullptr;
  }
  if (st.server == nullptr) {
    st.server = new FdServer();
    st.owner = ::getpid();
  }
  return *st.server;
}

void FdServer::withdrawFromInstance(std::uint64_t id) {
  InstanceState& st = instanceState();
  std::lock_guard lock(st.mutex);
  if (st.server != nullptr && st.owner == ::getpid()) st.server->withdraw(id);
}

void FdServer::publish(std::uint64_t id, const FdToken& token, int fd) {
  std::lock_guard lock(mutex_);
  entries_[id] = Entry{token, fd};
}

void FdServer::withdraw(std::uint64_t id) {
  // Taking the mutex also waits for a reply that is being sent with this fd attached.
  std::lock_guard lock(mutex_);
  entries_.erase(id);
}

FdServer::Stats FdServer::stats() const { return Stats{served_.load(), rejected_.load()}; }

void FdServer::run() {
  for (;;) {
    pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      FERRY_LOG(Error, Transport) << "fd server @" << name_ << ": poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!client.valid()) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        FERRY_LOG(Warn, Transport) << "fd server @" << name_ << ": accept failed: " << std::strerror(errno);
      // EMFILE and the like: back off instead of spinning on a connection we cannot take.
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    try {
      serveOne(client.get());
    } catch (const std::exception& e) {
      ++rejected_;
      FERRY_LOG(Warn, Transport) << "fd server @" << name_ << ": dropped a client: " << e.what();
    }
  }
}

void FdServer::serveOne(int client) {
  Request req{};
  Reply reply{kReplyMagic, static_cast<std::uint32_t>(Status::Malformed)};
  bool whole = readExactly(client, &req, sizeof(req), Clock::now() + kRequestDeadline);
  const char* why = nullptr;
  std::lock_guard lock(mutex_);
  const Entry* entry = nullptr;
  if (!whole) {
    why = "an incomplete request";
  } else if (req.magic != kRequestMagic || req.reserved != 0) {
    why = "a malformed request";
  } else if (auto it = entries_.find(req.id); it == entries_.end()) {
    reply.status = static_cast<std::uint32_t>(Status::UnknownId);
    why = "a request for an unknown allocation";
  } else if (!secretsEqual(it->second.token, req.token)) {
    reply.status = static_cast<std::uint32_t>(Status::BadToken);
    why = "a request with a wrong token";
  } else {
    entry = &it->second;
    reply.status = static_cast<std::uint32_t>(Status::Ok);
  }
  if (why != nullptr) {
    ++rejected_;
    FERRY_LOG(Warn, Transport) << "fd server @" << name_ << ": rejected " << why
                               << (whole ? " (allocation " + std::to_string(req.id) + ")" : std::string());
    if (!whole) return;  // nothing sensible to answer to
  }
  iovec iov{&reply, sizeof(reply)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (entry != nullptr) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &entry->fd, sizeof(int));
  }
  // Counted before the reply goes, so that a client that has its answer sees it counted.
  if (entry != nullptr) ++served_;
  // The socket is fresh and the reply tiny, so this does not block; MSG_NOSIGNAL: a client that
  // already left must not kill us with SIGPIPE.
  if (::sendmsg(client, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(reply))) {
    int err = errno;
    if (entry != nullptr) --served_;
    ++rejected_;
    FERRY_LOG(Warn, Transport) << "fd server @" << name_
                               << ": could not answer a client: " << std::strerror(err);
  }
}

UniqueFd fetchFd(const std::string& serverName, std::uint64_t id, const FdToken& token,
                 std::chrono::duration<double> timeout, const std::string& what) {
  if (serverName.empty() || serverName.size() > FdServer::kMaxNameLength)
    throw Error(ErrorCode::ProtocolError,
                "fd server name of " + what + " has a bad length " + std::to_string(serverName.size()));
  auto deadline = deadlineAfter(timeout);
  auto timedOut = [&](const char* stage) {
    return TimeoutError("fetching the file descriptor of " + what + " from fd server @" + serverName + ": " +
                        stage + " took longer than " + std::to_string(timeout.count()) +
                        " s (FERRY_FD_TIMEOUT)");
  };
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) throw SysError("socket(AF_UNIX) to fetch " + what, errno);
  socklen_t len = 0;
  sockaddr_un addr = abstractAddress(serverName, len);
  // A full backlog answers EAGAIN: retry until the deadline.
  while (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      if (Clock::now() >= deadline) throw timedOut("connecting");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (errno == ECONNREFUSED || errno == ENOENT)
      throw Error(ErrorCode::RemoteError, "cannot reach the fd server @" + serverName + " that holds " +
                                              what + ": " + std::strerror(errno) +
                                              " (has the owner exited, or does it run in another network "
                                              "namespace?)");
    throw SysError("connect to the fd server @" + serverName + " for " + what, errno);
  }
  Request req{kRequestMagic, 0, id, token};
  if (!waitForFd(sock.get(), POLLOUT, deadline)) throw timedOut("sending the request");
  if (::send(sock.get(), &req, sizeof(req), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(req)))
    throw SysError("sending the fd request for " + what, errno);

  Reply reply{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  iovec iov{&reply, sizeof(reply)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got = -1;
  for (;;) {
    if (!waitForFd(sock.get(), POLLIN, deadline)) throw timedOut("waiting for the answer");
    got = ::recvmsg(sock.get(), &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    break;
  }
  if (got < 0) throw SysError("receiving the fd of " + what, errno);
  // Take ownership of every descriptor that came, before judging the answer, so none leaks.
  UniqueFd fd;
  int extra = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int f = -1;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!fd.valid()) {
        fd.reset(f);
      } else {
        ::close(f);
        ++extra;
      }
    }
  }
  if (got != static_cast<ssize_t>(sizeof(reply)) || reply.magic != kReplyMagic)
    throw Error(ErrorCode::ProtocolError, "the fd server @" + serverName + " answered nonsense for " + what);
  switch (static_cast<Status>(reply.status)) {
    case Status::Ok:
      if (!fd.valid() || extra != 0 || (msg.msg_flags & MSG_CTRUNC) != 0)
        throw Error(ErrorCode::ProtocolError,
                    "the fd server @" + serverName + " sent a bad set of descriptors for " + what);
      return fd;
    case Status::UnknownId:
      throw Error(ErrorCode::RemoteError,
                  "the owner no longer has " + what + " (freed or deregistered before this peer mapped it?)");
    case Status::BadToken:
      throw Error(ErrorCode::ProtocolError, "the owner refused the token presented for " + what);
    case Status::Malformed: break;
  }
  throw Error(ErrorCode::ProtocolError,
              "the fd server @" + serverName + " refused the request for " + what + " as malformed");
}

}  // namespace ferry
