#include "common/launcher.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ferry::tools {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int intOf(const char* v, int fallback) { return v ? std::atoi(v) : fallback; }

}  // namespace

std::optional<RankInfo> rankFromEnvironment() {
  RankInfo info;
  if (const char* root = get("FERRY_BENCH_ROOT")) {
    info.rank = intOf(get("FERRY_BENCH_RANK"), 0);
    info.worldSize = intOf(get("FERRY_BENCH_RANKS"), 1);
    info.localRank = info.rank;
    info.bootstrap = TcpBootstrap::create(root, info.rank, info.worldSize);
    return info;
  }
  if (const char* r = get("OMPI_COMM_WORLD_RANK")) {
    // mpirun: speak torchrun's variables to the bootstrap.
    ::setenv("RANK", r, 1);
    ::setenv("WORLD_SIZE", get("OMPI_COMM_WORLD_SIZE") ? get("OMPI_COMM_WORLD_SIZE") : "1", 1);
    ::setenv("LOCAL_RANK", get("OMPI_COMM_WORLD_LOCAL_RANK") ? get("OMPI_COMM_WORLD_LOCAL_RANK") : r, 1);
    if (!get("MASTER_ADDR")) ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    if (!get("MASTER_PORT")) ::setenv("MASTER_PORT", "29511", 1);
  }
  if (get("RANK") && get("WORLD_SIZE")) {
    info.rank = intOf(get("RANK"), 0);
    info.worldSize = intOf(get("WORLD_SIZE"), 1);
    info.localRank = intOf(get("LOCAL_RANK"), info.rank);
    info.bootstrap = TcpBootstrap::fromEnvironment();
    return info;
  }
  return std::nullopt;
}

namespace {

// A loopback port that is free now. (A UniqueId would reserve one, but its socket belongs to the
// process that made it, and rank 0 is a child.) Another process could take it before rank 0
// listens; then rank 0 fails to bind and says so.
int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  if (port == 0) throw std::runtime_error(std::string("no free loopback port: ") + std::strerror(errno));
  return port;
}

}  // namespace

int spawnRanks(int ranks, char** argv, int hosts) {
  if (hosts < 1 || ranks % hosts != 0)
    throw std::invalid_argument(std::to_string(ranks) + " ranks cannot be split evenly over " + std::to_string(hosts) +
                                " hosts");
  // The variables a posing host sets are its own, whatever the caller's environment says.
  auto posed = [&](const char* e) {
    if (hosts == 1) return false;
    for (const char* key : {"FERRY_HOSTID=", "NCCL_HOSTID=", "FERRY_MULTI_HOST="})
      if (std::strncmp(e, key, std::strlen(key)) == 0) return true;
    return false;
  };
  // A random secret authenticates the ranks that join (FERRY_BOOTSTRAP_SECRET).
  const std::string root = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  const std::string secret = UniqueId::create().toHex().substr(16, 32);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (!posed(*e)) env.emplace_back(*e);
    if (hosts > 1) {
      const std::string host = "posed-host-" + std::to_string(r / (ranks / hosts));
      env.push_back("FERRY_HOSTID=" + host);
      env.push_back("NCCL_HOSTID=" + host);
      env.push_back("FERRY_MULTI_HOST=1");
    }
    env.push_back("FERRY_BENCH_ROOT=" + root);
    env.push_back("FERRY_BOOTSTRAP_SECRET=" + secret);
    env.push_back("FERRY_BENCH_RANK=" + std::to_string(r));
    env.push_back("FERRY_BENCH_RANKS=" + std::to_string(ranks));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
    if (err != 0) {
      std::cerr << program_invocation_short_name << ": cannot start rank " << r << ": " << std::strerror(err) << "\n";
      for (pid_t p : pids) ::kill(p, SIGTERM);
      return 1;
    }
    pids.push_back(pid);
  }
  int result = 0;
  std::size_t running = pids.size();
  // After the first failure the others get a grace period, then they are killed.
  bool failing = false;
  auto giveUpAt = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    for (auto& pid : pids) {
      if (pid <= 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && result == 0) {
        result = code;
        failing = true;
        giveUpAt = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      }
      pid = -1;
      --running;
    }
    if (failing && std::chrono::steady_clock::now() > giveUpAt) {
      for (pid_t pid : pids)
        if (pid > 0) ::kill(pid, SIGKILL);
      failing = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace ferry::tools
