#pragma once
// For GPU tests that fork their ranks (mp_harness.hpp): the parent must never touch CUDA, since a
// CUDA context does not survive fork. These helpers ask in a short-lived child instead.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>

#include "support/fd_count.hpp"

namespace ferry::test {

// Number of CUDA devices, counted in a child process.
inline int gpuCountWithoutInit() {
  pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// GPU_TESTS_SHARE_GPUS=1 lets a multi-rank GPU test run more ranks than there are GPUs, rank r
// on GPU r % count: it checks protocols on a one-GPU machine (slowly: the ranks' kernels take turns
// on the GPU), never speed.
inline bool shareGpus() {
  const char* v = std::getenv("GPU_TESTS_SHARE_GPUS");
  return v != nullptr && v[0] == '1';
}

// Empty when `ranks` ranks can run here; otherwise why not (for GTEST_SKIP).
inline std::string whyCannotRun(int ranks) {
  const int gpus = gpuCountWithoutInit();
  if (gpus >= ranks || (gpus >= 1 && shareGpus())) return {};
  return "needs " + std::to_string(ranks) + " GPUs (or GPU_TESTS_SHARE_GPUS=1 and one), found " + std::to_string(gpus);
}

// True when `ranks` ranks would share GPUs here. Tests in which several ranks' kernels time out and
// trap at once skip then: on a shared GPU a trapping context can stall the others' (seen on an
// H100 with 4 ranks), which says nothing about ferry.
inline bool ranksShareGpus(int ranks) { return gpuCountWithoutInit() < ranks; }

// The GPU of a rank: its own, or one it shares (see shareGpus). @pre CUDA may be used here.
inline int rankDevice(int rank) {
  int n = 1;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) n = 1;
  return rank % n;
}

// Free memory of the current device, after the work queued on it.
inline std::size_t freeGpuMemory() {
  std::size_t freeBytes = 0, total = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&freeBytes, &total);
  return freeBytes;
}

}  // namespace ferry::test
