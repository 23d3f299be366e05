/* Checks shared by the C tests of the NCCL API: a CUDA or nccl.h call that must succeed, or the
 * process ends naming the call, where it was made and why it failed. */
#ifndef FERRY_TESTS_NCCL_C_TEST_CHECKS_H
#define FERRY_TESTS_NCCL_C_TEST_CHECKS_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

/* The test's own CUDA calls: a failure ends the process (exit 4) with the call and the error. */
#define CUDA(call)                                                                          \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(4);                                                                              \
    }                                                                                       \
  } while (0)

/* An nccl.h call's result: anything but ncclSuccess ends the process (exit 2) with the call, the
 * result and ncclGetLastError; rank >= 0 is named too. Each test wraps it in its CHECK macro. */
static inline void ncclMust(ncclResult_t r, const char* call, const char* file, int line, int rank) {
  if (r == ncclSuccess) return;
  if (rank >= 0) fprintf(stderr, "rank %d: ", rank);
  fprintf(stderr, "%s:%d: %s: %s (%s)\n", file, line, call, ncclGetErrorString(r), ncclGetLastError(NULL));
  exit(2);
}

#endif
