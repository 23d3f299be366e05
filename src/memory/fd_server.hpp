#pragma once
// File-descriptor passing between processes of one host. Each process that shares memory runs one
// FdServer: a Unix-domain socket in the abstract namespace (a name with a random part, so it cannot
// be guessed or squatted) and one thread that answers "the fd of allocation <id>, token <t>" with
// the descriptor attached (SCM_RIGHTS). The token is random per allocation and travels only inside
// serialized RegisteredMemory, so only the peers it was sent to can fetch the descriptor.
//
// The server is bounded: one request at a time, each with a short deadline to arrive whole; a bad
// request (garbage, unknown id, wrong token) gets a refusal and a log line, never a crash.
//
//   // owner
//   FdServer& server = FdServer::instance();
//   server.publish(id, token, memfd);          // until withdraw(id), before memfd is closed
//   send(server.name(), id, token) to the peer ...
//   // peer
//   UniqueFd fd = fetchFd(name, id, token, std::chrono::seconds(10), "allocation 3 of rank 0");
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/bootstrap_wire.hpp"
#include "platform/unique_fd.hpp"

namespace ferry {

using FdToken = wire::Secret;

class FdServer {
 public:
  // Longest name: sun_path (108 bytes) less the leading NUL of the abstract namespace.
  static constexpr std::size_t kMaxNameLength = 107;

  // Binds a fresh random name and starts the thread.
  FdServer();
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // This process's server, started on first use; a forked child starts its own.
  static FdServer& instance();
  // Withdraws id from this process's server if one runs (starts none).
  static void withdrawFromInstance(std::uint64_t id);

  // The abstract socket name, without the leading NUL.
  const std::string& name() const noexcept { return name_; }

  // Serves fd to requests for id that carry token, until withdraw(id). The server does not own fd:
  // the caller withdraws it before closing it. Publishing an id again replaces its entry.
  void publish(std::uint64_t id, const FdToken& token, int fd);
  void withdraw(std::uint64_t id);

  struct Stats {
    std::uint64_t served = 0;
    std::uint64_t rejected = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    FdToken token;
    int fd;
  };
  void run();
  void serveOne(int client);

  std::string name_;
  UniqueFd listen_;
  UniqueFd wake_;  // eventfd: wakes the thread to stop
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Entry> entries_;
  std::atomic<std::uint64_t> served_{0};
  std::atomic<std::uint64_t> rejected_{0};
  std::thread thread_;

  friend void abandonFdServerAfterFork(FdServer*);
};

// Fetches the descriptor of allocation id from the server `serverName`, waiting at most timeout.
// `what` names the allocation and its owner in errors ("allocation 3 of rank 0 (pid 1234)").
// Throws TimeoutError, Error(RemoteError) when the server is gone or no longer has the allocation,
// Error(ProtocolError) when it refuses the token or answers nonsense, SysError for other failures.
UniqueFd fetchFd(const std::string& serverName, std::uint64_t id, const FdToken& token,
                 std::chrono::duration<double> timeout, const std::string& what);

}  // namespace ferry
