#pragma once
// The frame of a multi-rank GPU test: n forked ranks (mp_harness.hpp), each on its GPU (rankDevice,
// shared where GPU_TESTS_SHARE_GPUS allows) with a bootstrap of the n ranks.
//
//   runGpuRanksOk(n, [&](int rank, const std::shared_ptr<TcpBootstrap>& boot) { Comm comm(boot); ... });
#include <cuda_runtime_api.h>

#include <memory>

#include "ferry/bootstrap.hpp"
#include "gpu_test_process.hpp"
#include "mp_harness.hpp"

namespace ferry::test {

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
