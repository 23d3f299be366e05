/* One process driving every rank through nccl.h, as single-process NCCL programs do: the comms come
 * from ncclCommInitAll, then from ncclCommInitRank calls inside one group, then from
 * ncclCommInitRankConfig with maxCTAs 2; every collective and a send/recv ring (int32, sum) are
 * issued for all ranks from this one thread inside ncclGroupStart / ncclGroupEnd, and each rank's
 * output is checked element by element (poisoned first). On the comms of ncclCommInitAll and of the
 * config, ncclAllReduce also runs every datatype with every op, and allgather and reducescatter
 * every datatype, at counts of 3 and COUNT. Rank i uses GPU i % GPUs; ranks share GPUs only with
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
#include "c_test_values.h"

#define COUNT 3001 /* per rank, odd on purpose */
#define MAX_RANKS 8
#define MAX_TYPE_BYTES 8

#define CHECK(call) ncclMust((call), #call, __FILE__, __LINE__, -1)

static int nranks, devs[MAX_RANKS], failures = 0, checked = 0;
static ncclComm_t comms[MAX_RANKS];
static cudaStream_t streams[MAX_RANKS];
static char* send[MAX_RANKS]; /* COUNT * nranks elements of any type, each */
static char* recv[MAX_RANKS];
static char* want[MAX_RANKS]; /* on the host: what rank r's recv must hold after the call */

/* Fills every rank's send buffer with its first n inputs of type t and poisons its recv buffer (m
 * elements). */
static void prepare(int t, size_t n, size_t m) {
  const size_t es = typeBytes(t);
  char* host = malloc(n * es);
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    fillInputs(host, t, r, 0, n);
    CUDA(cudaMemcpy(send[r], host, n * es, cudaMemcpyHostToDevice));
    CUDA(cudaMemset(recv[r], 0xFF, m * es));
    CUDA(cudaDeviceSynchronize());
  }
  free(host);
}

/* Waits for every rank, then compares rank r's recv (m elements of type t) with want[r], element by
 * element. */
static void finish(const char* what, int t, size_t m) {
  char* host = malloc(m * typeBytes(t));
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaStreamSynchronize(streams[r]));
  }
  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaMemcpy(host, recv[r], m * typeBytes(t), cudaMemcpyDeviceToHost));
    char who[192];
    snprintf(who, sizeof(who), "%s: rank %d", what, r);
    if (compareElements(who, t, host, want[r], m) != 0) ++failures;
    ++checked;
  }
  free(host);
}

#define FOR_EACH_RANK_IN_A_GROUP(body) \
  do {                                 \
    CHECK(ncclGroupStart());           \
    for (int r = 0; r < nranks; ++r) { \
      CUDA(cudaSetDevice(devs[r]));    \
      body;                            \
    }                                  \
    CHECK(ncclGroupEnd());             \
  } while (0)

/* Every collective (int32, sum), all ranks' calls issued by this thread within one group each. */
static void runAll(const char* how) {
  char what[128];
  const int t = ncclInt32;
  const size_t es = typeBytes(t), big = (size_t)COUNT * nranks;

  snprintf(what, sizeof(what), "%s: ncclAllReduce", how);
  prepare(t, COUNT, COUNT);
  for (int r = 0; r < nranks; ++r) fillReduced(want[r], t, ncclSum, nranks, 0, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclInt32, ncclSum, comms[r], streams[r])));
  finish(what, t, COUNT);

  snprintf(what, sizeof(what), "%s: ncclReduceScatter", how);
  prepare(t, big, COUNT);
  for (int r = 0; r < nranks; ++r) fillReduced(want[r], t, ncclSum, nranks, (size_t)r * COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclReduceScatter(send[r], recv[r], COUNT, ncclInt32, ncclSum, comms[r], streams[r])));
  finish(what, t, COUNT);

  snprintf(what, sizeof(what), "%s: ncclAllGather", how);
  prepare(t, COUNT, big);
  for (int r = 0; r < nranks; ++r)
    for (int q = 0; q < nranks; ++q) fillInputs(want[r] + (size_t)q * COUNT * es, t, q, 0, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(CHECK(ncclAllGather(send[r], recv[r], COUNT, ncclInt32, comms[r], streams[r])));
  finish(what, t, big);

  /* Rank r's block q comes from rank q's block r. */
  snprintf(what, sizeof(what), "%s: ncclAlltoAll", how);
  prepare(t, big, big);
  for (int r = 0; r < nranks; ++r)
    for (int q = 0; q < nranks; ++q)
      fillInputs(want[r] + (size_t)q * COUNT * es, t, q, (size_t)r * COUNT, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(CHECK(ncclAlltoAll(send[r], recv[r], COUNT, ncclInt32, comms[r], streams[r])));
  finish(what, t, big);

  snprintf(what, sizeof(what), "%s: ncclBroadcast", how);
  prepare(t, COUNT, COUNT);
  for (int r = 0; r < nranks; ++r) fillInputs(want[r], t, 1 % nranks, 0, COUNT);
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclBroadcast(send[r], recv[r], COUNT, ncclInt32, 1 % nranks, comms[r], streams[r])));
  finish(what, t, COUNT);

  /* Off the root, recvbuff stays poisoned. */
  snprintf(what, sizeof(what), "%s: ncclReduce", how);
  prepare(t, COUNT, COUNT);
  for (int r = 0; r < nranks; ++r) {
    if (r == nranks - 1)
      fillReduced(want[r], t, ncclSum, nranks, 0, COUNT);
    else
      memset(want[r], 0xFF, COUNT * es);
  }
  FOR_EACH_RANK_IN_A_GROUP(
      CHECK(ncclReduce(send[r], recv[r], COUNT, ncclInt32, ncclSum, nranks - 1, comms[r], streams[r])));
  finish(what, t, COUNT);

  snprintf(what, sizeof(what), "%s: ncclSend/ncclRecv ring", how);
  prepare(t, COUNT, COUNT);
  for (int r = 0; r < nranks; ++r) fillInputs(want[r], t, (r + nranks - 1) % nranks, 0, COUNT);
  FOR_EACH_RANK_IN_A_GROUP({
    CHECK(ncclSend(send[r], COUNT, ncclInt32, (r + 1) % nranks, comms[r], streams[r]));
    CHECK(ncclRecv(recv[r], COUNT, ncclInt32, (r + nranks - 1) % nranks, comms[r], streams[r]));
  });
  finish(what, t, COUNT);
}

/* Whether op of type t over nranks ranks is exact, so that the check can be: the inputs are small
 * integers, but an average of floats is exact only over a power of two ranks, and e5m2 holds 3
 * significant bits (the sums of up to 4 ranks). */
static int exact(int t, int op) {
  if (!isFloat(t) || op == ncclProd || op == ncclMax || op == ncclMin) return 1;
  if (op == ncclAvg && (nranks & (nranks - 1)) != 0) return 0;
  return t != ncclFloat8e5m2 || nranks <= 4;
}

/* Every datatype: ncclAllReduce with every op, then allgather and reducescatter (sum), at each count,
 * all ranks' calls issued by this thread within one group each; reductions that are not exact in
 * their type over nranks ranks are left out. */
static void runTypes(const char* how) {
  static const size_t counts[] = {3, COUNT};
  char what[160];
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); ++c) {
    const size_t n = counts[c], big = n * (size_t)nranks;
    for (int t = 0; t < ncclNumTypes; ++t) {
      const ncclDataType_t type = (ncclDataType_t)t;
      const size_t es = typeBytes(t);
      for (int op = 0; op < ncclNumOps; ++op) {
        if (!exact(t, op)) continue;
        snprintf(what, sizeof(what), "%s: ncclAllReduce %s %s count %zu", how, typeName(t), opName(op), n);
        prepare(t, n, n);
        for (int r = 0; r < nranks; ++r) fillReduced(want[r], t, op, nranks, 0, n);
        FOR_EACH_RANK_IN_A_GROUP(
            CHECK(ncclAllReduce(send[r], recv[r], n, type, (ncclRedOp_t)op, comms[r], streams[r])));
        finish(what, t, n);
      }

      snprintf(what, sizeof(what), "%s: ncclAllGather %s count %zu", how, typeName(t), n);
      prepare(t, n, big);
      for (int r = 0; r < nranks; ++r)
        for (int q = 0; q < nranks; ++q) fillInputs(want[r] + (size_t)q * n * es, t, q, 0, n);
      FOR_EACH_RANK_IN_A_GROUP(CHECK(ncclAllGather(send[r], recv[r], n, type, comms[r], streams[r])));
      finish(what, t, big);

      if (!exact(t, ncclSum)) continue;
      snprintf(what, sizeof(what), "%s: ncclReduceScatter %s sum count %zu", how, typeName(t), n);
      prepare(t, big, n);
      for (int r = 0; r < nranks; ++r) fillReduced(want[r], t, ncclSum, nranks, (size_t)r * n, n);
      FOR_EACH_RANK_IN_A_GROUP(
          CHECK(ncclReduceScatter(send[r], recv[r], n, type, ncclSum, comms[r], streams[r])));
      finish(what, t, n);
    }
  }
}

#undef FOR_EACH_RANK_IN_A_GROUP

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
    CUDA(cudaMalloc((void**)&send[r], (size_t)COUNT * nranks * MAX_TYPE_BYTES));
    CUDA(cudaMalloc((void**)&recv[r], (size_t)COUNT * nranks * MAX_TYPE_BYTES));
    want[r] = malloc((size_t)COUNT * nranks * MAX_TYPE_BYTES);
  }

  CHECK(ncclCommInitAll(comms, nranks, devs));
  checkComms("ncclCommInitAll");
  runAll("ncclCommInitAll");
  runTypes("ncclCommInitAll");
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
  runTypes("ncclCommInitRankConfig with maxCTAs 2");
  destroyComms();

  for (int r = 0; r < nranks; ++r) {
    CUDA(cudaSetDevice(devs[r]));
    CUDA(cudaFree(send[r]));
    CUDA(cudaFree(recv[r]));
    CUDA(cudaStreamDestroy(streams[r]));
    free(want[r]);
  }
  printf("nccl C API from one process, %d ranks on %d GPU(s): %d outputs checked, %d wrong\n", nranks,
         gpus < nranks ? gpus : nranks, checked, failures);
  return failures == 0 ? 0 : 1;
}
