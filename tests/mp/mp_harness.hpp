#pragma once
// Multi-process tests without MPI: runRanks() forks one process per rank, runs the body in each,
// and waits for all of them with a time limit, so a hang fails the test instead of stalling CI.
//
// The body may use gtest assertions: a child that records a failure (or throws) exits non-zero,
// and the parent reports which rank failed. Fork before any thread exists in the parent (gtest's
// main thread only), which holds for tests that create bootstraps only inside the body.
//
//   runRanks(4, [&](int rank) { auto boot = TcpBootstrap::create(id, rank, 4); ... });
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <thread>
#include <vector>

namespace ferry::test {

struct RankOptions {
  std::chrono::seconds limit{120};  // for all ranks together
  std::set<int> skip;               // ranks that are not started (to test a rank that never joins)
};

// Returns each rank's exit code (-1 for skipped or killed ranks).
inline std::vector<int> runRanks(int worldSize, const std::function<void(int rank)>& body,
                                 RankOptions options = {}) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(static_cast<std::size_t>(worldSize), -1);
  for (int rank = 0; rank < worldSize; ++rank) {
    if (options.skip.count(rank)) continue;
    pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      break;
    }
    if (pid == 0) {
      int code = 0;
      try {
        body(rank);
        if (::testing::Test::HasFailure()) code = 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids[rank] = pid;
  }
  std::vector<int> codes(static_cast<std::size_t>(worldSize), -1);
  auto deadline = std::chrono::steady_clock::now() + options.limit;
  int running = 0;
  for (pid_t p : pids) running += p > 0;
  while (running > 0) {
    for (int rank = 0; rank < worldSize; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        codes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[rank] = -1;
        --running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < worldSize; ++rank) {
        if (pids[rank] <= 0) continue;
        ADD_FAILURE() << "rank " << rank << " did not finish within " << options.limit.count()
                      << " s: killed";
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], nullptr, 0);
        pids[rank] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

// Runs the ranks and expects every started rank to succeed.
inline void runRanksOk(int worldSize, const std::function<void(int rank)>& body, RankOptions options = {}) {
  auto codes = runRanks(worldSize, body, options);
  for (int rank = 0; rank < worldSize; ++rank)
    if (!options.skip.count(rank)) {
      EXPECT_EQ(codes[rank], 0) << "rank " << rank << " failed (its output is above)";
    }
}

// A port that is free now (another process may take it later: use only on loopback in tests).
int freePort(int family);

}  // namespace ferry::test
