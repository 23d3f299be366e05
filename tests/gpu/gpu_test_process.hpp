#pragma once
// For GPU tests that fork their ranks (mp_harness.hpp): the parent must never touch CUDA, since a
// CUDA context does not survive fork. These helpers ask in a short-lived child instead.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>

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

// Free memory of the current device, after the work queued on it.
inline std::size_t freeGpuMemory() {
  std::size_t freeBytes = 0, total = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&freeBytes, &total);
  return freeBytes;
}

}  // namespace ferry::test
