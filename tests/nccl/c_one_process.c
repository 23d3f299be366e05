/* One process driving every rank through nccl.h, as single-process NCCL programs do: the comms come
 * from ncclCommInitAll, then from ncclCommInitRank calls inside one group, then from
 * ncclCommInitRankConfig with maxCTAs 2; every collective and a send/recv ring are issued for all
 * ranks from this one thread inside ncclGroupStart / ncclGroupEnd, and each rank's output is checked
 * element by element (poisoned first). Rank i uses GPU i % GPUs; ranks share GPUs only with
 * GPU_TESTS_SHARE_GPUS=1.
 *
 *   nccl_c_one_process NRANKS     exit 0: all correct; 77: not enough GPUs
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_checks.h"

#define COUNT 3001 /* per rank, odd on purpose */
#define MAX_RANKS 8

#define CHECK(call) ncclMust((call), #call, __FILE__, __LINE__, -1)

static int nranks, devs[MAX_RANKS], failures = 0, checked = 0;
static ncclComm_t comms[MAX_RANKS];
static cudaStream_t streams[MAX_RANKS];
static int32_t* send[MAX_RANKS];
static int32_t* recv[MAX_RANKS];

/* Rank r's input element i (int32, small: sums and products stay exact). */
static int32_t value(int r, size_t i) { return (int32_t)((r * 5 + i * 7) % 11) - 5; }

/* Fills every rank's send buffer (n elements) and poisons its recv buffer (m elements). */
static void prepare(size_t n, size_t m) {
  int32_t* host = malloc(n * sizeof(int32_t));
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    for (size_t i = 0; i < n; ++i) host[i] = value(r, i);
    CUDA(cudaMemcpy(send[r], host, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA(cudaMemset(recv[r], 0xFF, m * sizeof(int32_t)));
    CUDA(cudaDeviceSynchronize());
  }
  free(host);
}

/* Waits for every rank, then compares rank r's recv with want(r, i) for i < m. */
static void finish(const char* what, size_t m, int32_t (*want)(int r, size_t i)) {
  int32_t* host = malloc(m * sizeof(int32_t));
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaStreamSynchronize(streams[r]));
  }
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaMemcpy(host, recv[r], m * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < m; ++i) {
      if (host[i] != want(r, i)) {
        fprintf(stderr, "%s: rank %d element %zu is %d, want %d\n", what, r, i, host[i], want(r, i));
        ++failures;
        break;
      }
    }
    ++checked;
  }
  free(host);
}

static int32_t sumAt(size_t i) {
  int32_t s = 0;
  for (int q = 0; q < nranks; ++q) s += value(q, i);
  return s;
}
static int32_t wantAllReduce(int r, size_t i) {
  (void)r;
  return sumAt(i);
}
static int32_t wantReduceScatter(int r, size_t i) { return sumAt((size_t)r * COUNT + i); }
static int32_t wantAllGather(int r, size_t i) {
  (void)r;
  return value((int)(i / COUNT), i % COUNT);
}
static int32_t wantAllToAll(int r, size_t i) {
  return value((int)(i / COUNT), (size_t)r * COUNT + i % COUNT);
}
static int32_t wantBroadcast(int r, size_t i) {
  (void)r;
  return value(1 % nranks, i);
}
static int32_t wantReduce(int r, size_t i) { return r == nranks - 1 ? sumAt(i) : -1; /* poison elsewhere */ }
static int32_t wantRing(int r, size_t i) { return value((r + nranks - 1) % nranks, i); }

/* Every collective, all ranks' calls issued by this thread within one group each. */
static void runAll(const char* how) {
  char what[128];
  const size_t big = (size_t)COUNT * nranks;
#define FOR_EACH_RANK_IN_A_GROUP(body) \
  do {                                 \
    CHECK(ncclGroupStart());           \
    for (int r = 0; r < nranks; ++r) { \
      CUDA(cudaSetDevice(devs[r]));    \
      body;                            \
    }                                  \
    CHECK(ncclGroupEnd());             \
  } while (0)

  snprintf(what, sizeof(what), "%s: ncclAllReduce", how);
  prepare(COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclInt32, ncclSum, comms[r], streams[r])));
  finish(what, COUNT, wantAllReduce);

  snprintf(what, sizeof(what), "%s: ncclReduceScatter", how);
  prepare(big, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclReduceScatter(send[r], recv[r], COUNT, ncclInt32, ncclSum, comms[r], streams[r])));
  finish(what, COUNT, wantReduceScatter);

  snprintf(what, sizeof(what), "%s: ncclAllGather", how);
  prepare(COUNT, big);
  FOR_EACH_RANK_IN_A_GROUP(CHECK(ncclAllGather(send[r], recv[r], COUNT, ncclInt32, comms[r], streams[r])));
  finish(what, big, wantAllGather);

  snprintf(what, sizeof(what), "%s: ncclAlltoAll", how);
  prepare(big, big);
  FOR_EACH_RANK_IN_A_GROUP(CHECK(ncclAlltoAll(send[r], recv[r], COUNT, ncclInt32, comms[r], streams[r])));
  finish(what, big, wantAllToAll);

  snprintf(what, sizeof(what), "%s: ncclBroadcast", how);
  prepare(COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclBroadcast(send[r], recv[r], COUNT, ncclInt32, 1 % nranks, comms[r], streams[r])));
  finish(what, COUNT, wantBroadcast);

  snprintf(what, sizeof(what), "%s: ncclReduce", how);
  prepare(COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclReduce(send[r], recv[r], COUNT, ncclInt32, ncclSum, nranks - 1, comms[r], streams[r])));
  finish(what, COUNT, wantReduce);

  snprintf(what, sizeof(what), "%s: ncclSend/ncclRecv ring", how);
  prepare(COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP({
    CHECK(ncclSend(send[r], COUNT, ncclInt32, (r + 1) % nranks, comms[r], streams[r]));
    CHECK(ncclRecv(recv[r], COUNT, ncclInt32, (r + nranks - 1) % nranks, comms[r], streams[r]));
  });
  finish(what, COUNT, wantRing);
#undef FOR_EACH_RANK_IN_A_GROUP
}

static void checkComms(const char* how) {
  for (int r = 0; r < nranks; ++r) {
    int dev = -1, rank = -1, count = 0;
    CHECK(ncclCommCuDevice(comms[r], &dev));
    CHECK(ncclCommUserRank(comms[r], &rank));
    CHECK(ncclCommCount(comms[r], &count));
    if (dev != devs[r] || rank != r || count != nranks) {
      fprintf(stderr, "%s: comm %d says device %d, rank %d, count %d\n", how, r, dev, rank, count);
      ++failures;
    }
  }
}

static void destroyComms(void) {
  for (int r = 0; r < nranks; ++r) CHECK(ncclCommDestroy(comms[r]));
}

int main(int argc, char** argv) {
  nranks = argc > 1 ? atoi(argv[1]) : 2;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: nccl_c_one_process NRANKS (1..%d)\n", MAX_RANKS);
    return 2;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  const char* share = getenv("GPU_TESTS_SHARE_GPUS");
  if (gpus == 0 || (gpus < nranks && !(share != NULL && share[0] == '1'))) {
    printf("skipped: %d ranks need %d GPUs (or GPU_TESTS_SHARE_GPUS=1), found %d\n", nranks, nranks, gpus);
    return 77;
  }
  for (int r = 0; r < nranks; ++r) {
    devs[r] = r % gpus;
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    CUDA(cudaMalloc((void**)&send[r], (size_t)COUNT * nranks * sizeof(int32_t)));
    CUDA(cudaMalloc((void**)&recv[r], (size_t)COUNT * nranks * sizeof(int32_t)));
  }

  CHECK(ncclCommInitAll(comms, nranks, devs));
  checkComms("ncclCommInitAll");
  runAll("ncclCommInitAll");
  destroyComms();

  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CHECK(ncclCommInitRank(&comms[r], nranks, id, r));
  }
  CHECK(ncclGroupEnd());
  checkComms("grouped ncclCommInitRank");
  runAll("grouped ncclCommInitRank");
  destroyComms();

  /* A config that bounds the kernels' thread blocks (maxCTAs): the same calls, the same results. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.minCTAs = 1;
  config.maxCTAs = 2;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CHECK(ncclCommInitRankConfig(&comms[r], nranks, id, r, &config));
  }
  CHECK(ncclGroupEnd());
  checkComms("ncclCommInitRankConfig with maxCTAs 2");
  runAll("ncclCommInitRankConfig with maxCTAs 2");
  destroyComms();

  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaFree(send[r]));
    CUDA(cudaFree(recv[r]));
    CUDA(cudaStreamDestroy(streams[r]));
  }
  printf("nccl C API from one process, %d ranks on %d GPU(s): %d outputs checked, %d wrong\n", nranks,
         gpus < nranks ? gpus : nranks, checked, failures);
  return failures == 0 ? 0 : 1;
}
