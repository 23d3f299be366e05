#pragma once
// Multi-process GPU tests: one process per GPU, forked by mp_harness.hpp's runRanks. CUDA must not
// be initialized in the parent before fork (a forked child cannot use a CUDA context it inherits),
// so the GPU count is taken in a throwaway child.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_harness.hpp"

namespace ferry::test {

inline int gpuCountWithoutInit() {
  static int count = [] {
    pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
      _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  }();
  return count;
}

}  // namespace ferry::test
