#include "launcher.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
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
  if (const char* id = get("FERRY_BENCH_ID")) {
    info.rank = intOf(get("FERRY_BENCH_RANK"), 0);
    info.worldSize = intOf(get("FERRY_BENCH_RANKS"), 1);
    info.localRank = info.rank;
    info.bootstrap = TcpBootstrap::create(UniqueId::fromHex(id), info.rank, info.worldSize);
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

int spawnRanks(int ranks, char** argv) {
  const std::string id = UniqueId::create().toHex();
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back("FERRY_BENCH_ID=" + id);
    env.push_back("FERRY_BENCH_RANK=" + std::to_string(r));
    env.push_back("FERRY_BENCH_RANKS=" + std::to_string(ranks));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
    if (err != 0) {
      std::cerr << "ferry-bench: cannot start rank " << r << ": " << std::strerror(err) << "\n";
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
