#pragma once
// How the ranks of ferry's tools (ferry-bench, ferry-perf) come to be: one process per GPU, either
// started by the tool itself (a parent that spawns its own executable once per rank and waits), or
// by mpirun or torchrun.
#include <memory>
#include <optional>

#include "ferry/bootstrap.hpp"

namespace ferry::tools {

struct RankInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::shared_ptr<Bootstrap> bootstrap;
};

// This process's rank, when it is one: spawned by spawnRanks (FERRY_BENCH_ROOT), under mpirun
// (OMPI_COMM_WORLD_RANK; rank 0's host in MASTER_ADDR, default 127.0.0.1, port MASTER_PORT,
// default 29511) or torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). nullopt otherwise.
std::optional<RankInfo> rankFromEnvironment();

// Starts `ranks` copies of this executable with argv, as ranks 0..ranks-1, and waits for them.
// Returns 0 when all exit 0; otherwise the first non-zero code (a rank that fails makes the parent
// stop the others after a grace period, so a broken run ends instead of hanging).
// hosts > 1 (dividing ranks): consecutive ranks pose as one host each, so the "hosts" talk over the
// network on loopback (docs/multi-node.md): FERRY_HOSTID and NCCL_HOSTID name the rank's host, and
// FERRY_MULTI_HOST=1 lets ferry's Comm span them.
int spawnRanks(int ranks, char** argv, int hosts = 1);

}  // namespace ferry::tools
