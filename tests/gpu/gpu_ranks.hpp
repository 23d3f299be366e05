#pragma once
// The frame of a multi-rank GPU test: n forked ranks (mp_harness.hpp), each on its GPU (rankDevice,
// shared where GPU_TESTS_SHARE_GPUS allows) with a bootstrap of the n ranks.
//
//   runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) { Comm comm(boot); ... });
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ferry/bootstrap.hpp"
#include "gpu_test_process.hpp"
#include "mp_harness.hpp"

namespace ferry::test {

// True on every rank when any rank has a test failure so far: ranks that leave a loop of collective
// calls must leave it together, or the others wait for them in the next call. Collective.
inline bool anyRankFailed(Bootstrap& boot) {
  std::vector<int> failed(static_cast<std::size_t>(boot.size()));
  failed[static_cast<std::size_t>(boot.rank())] = ::testing::Test::HasFailure() ? 1 : 0;
  boot.allGather(failed.data(), sizeof(int));
  for (int f : failed)
    if (f != 0) return true;
  return false;
}

template <class Body>
void runGpuRanksOk(int n, Body&& body) {
  const UniqueId id = UniqueId::create();
  runRanksOk(n, [&](int rank) {
    cudaSetDevice(rankDevice(rank));
    const std::shared_ptr<TcpBootstrap> boot = TcpBootstrap::create(id, rank, n);
    body(rank, boot);
  });
}

}  // namespace ferry::test
