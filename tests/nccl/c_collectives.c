/* The NCCL API from plain C, on GPUs: N ranks (forked processes, rank r on GPU r % GPUs) run every
 * collective, every datatype and every op through nccl.h, plus grouped send/recv in a ring and the
 * three reducing collectives with PreMulSum ops (host and device scalars), each checked element by
 * element (output poisoned first) against values computed here. Inputs are small integers, so every
 * result is exact in every type.
 *
 *   nccl_c_collectives NRANKS     exit 0: all correct; 77: not enough GPUs (unless
 *                                 GPU_TESTS_SHARE_GPUS=1 lets ranks share them)
 *
 * With FERRY_NCCL_FORWARD_ALL=1 every call goes to the real NCCL: the same checks, less the abort
 * phase (the real NCCL's abort leaves the peers waiting), ferry's own argument errors, and avg and
 * PreMulSum of fp8, which the real NCCL refuses.
 *
 * Diagnostic knobs: NCCL_C_TEST_FIRST_TYPE=k starts the round of types at type k;
 * NCCL_C_TEST_CHECK_UPLOAD=1 reads each input back after upload and reports a difference.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_test_checks.h"

#define COUNT 1023 /* not a multiple of any vector width */

static int failures = 0;

#define CHECK(call) ncclMust((call), #call, __FILE__, __LINE__, rank)

static const size_t kBytes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char* const kTypeNames[ncclNumTypes] = {"int8",    "uint8",   "int32", "uint32", "int64", "uint64",
                                                     "float16", "float32", "float64", "bfloat16", "e4m3", "e5m2"};
static const char* const kOpNames[ncclNumOps] = {"sum", "prod", "max", "min", "avg"};

/* FERRY_NCCL_FORWARD_ALL=1: every communicator runs on the real NCCL (the forwarding path). */
static int forwardedAll(void) {
  const char* v = getenv("FERRY_NCCL_FORWARD_ALL");
  return v != NULL && v[0] == '1';
}

static int isFloat(int t) { return t >= ncclFloat16; }
static int isUnsigned(int t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }

/* Rank r's element i: a small integer, never negative for unsigned types. */
static double value(int t, int r, size_t i) {
  const int v = (int)((r * 7 + i * 3) % 5);
  return isUnsigned(t) ? v : v - 2;
}

/* A float with few mantissa bits, from an exact value: expBits, mantBits, bias. */
static uint32_t minifloat(double v, int expBits, int mantBits, int bias) {
  const uint32_t sign = signbit(v) ? 1u : 0u;
  if (v == 0) return sign << (expBits + mantBits);
  int e = 0;
  const double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
  const uint32_t exponent = (uint32_t)(e - 1 + bias);
  const uint32_t mantissa = (uint32_t)((m * 2 - 1) * (double)(1u << mantBits));
  return sign << (expBits + mantBits) | exponent << mantBits | mantissa;
}

/* Writes v as type t. Each value goes through a typed local and memcpy: GCC 13.3 at -O3 dropped the
 * int8 stores of the earlier version (a pointer cast per case) when this was inlined into the fill
 * loop, leaving the input buffer unwritten (seen on the lent GPU machine; GCC 12 and clang were fine). */
static void store(void* out, const void* value, size_t bytes) { memcpy(out, value, bytes); }

static void encode(int t, double v, void* out) {
  /* Integer types only convert v (a NaN may come for the float types). */
  switch (t) {
    case ncclInt8: { int8_t x = (int8_t)(int64_t)v; store(out, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)(int64_t)v; store(out, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)(int64_t)v; store(out, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)(int64_t)v; store(out, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; store(out, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)(int64_t)v; store(out, &x, 8); break; }
    case ncclFloat16: { uint16_t x = (uint16_t)minifloat(v, 5, 10, 15); store(out, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; store(out, &x, 4); break; }
    case ncclFloat64: { store(out, &v, 8); break; }
    case ncclBfloat16: { uint16_t x = (uint16_t)minifloat(v, 8, 7, 127); store(out, &x, 2); break; }
    case ncclFloat8e4m3: { uint8_t x = (uint8_t)minifloat(v, 4, 3, 7); store(out, &x, 1); break; }
    case ncclFloat8e5m2: { uint8_t x = (uint8_t)minifloat(v, 5, 2, 15); store(out, &x, 1); break; }
  }
}

/* op over ranks of their element i, as the type computes it (integers wrap like the type). */
static double reduceAt(int t, int op, int nranks, size_t i) {
  double acc = value(t, 0, i);
  for (int q = 1; q < nranks; ++q) {
    const double v = value(t, q, i);
    switch (op) {
      case ncclSum:
      case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
    }
  }
  if (op == ncclAvg) acc = isFloat(t) ? acc / nranks : (double)((int64_t)acc / nranks);
  return acc;
}

struct Bufs {
  void* send;
  void* recv;
  char* host;
  char* want;
  size_t sendBytes, recvBytes;
};

static void prepare(struct Bufs* b, int t, size_t sendCount, size_t recvCount, int sendRank) {
  const size_t es = kBytes[t];
  b->sendBytes = sendCount * es;
  b->recvBytes = recvCount * es;
  b->host = malloc(b->sendBytes > b->recvBytes ? b->sendBytes : b->recvBytes);
  b->want = malloc(b->recvBytes);
  CUDA(cudaMalloc(&b->send, b->sendBytes));
  CUDA(cudaMalloc(&b->recv, b->recvBytes));
  for (size_t i = 0; i < sendCount; ++i) encode(t, value(t, sendRank, i), b->host + i * es);
  CUDA(cudaMemcpy(b->send, b->host, b->sendBytes, cudaMemcpyHostToDevice));
  CUDA(cudaMemset(b->recv, 0xFF, b->recvBytes));
  CUDA(cudaDeviceSynchronize());
  if (getenv("NCCL_C_TEST_CHECK_UPLOAD") != NULL) {
    unsigned char back[8] = {0};
    CUDA(cudaMemcpy(back, b->send, b->sendBytes < 8 ? b->sendBytes : 8, cudaMemcpyDeviceToHost));
    if (memcmp(back, b->host, b->sendBytes < 8 ? b->sendBytes : 8) != 0) {
      fprintf(stderr, "type %d: upload differs: host", t);
      for (int k = 0; k < 8; ++k) fprintf(stderr, " %02x", (unsigned char)b->host[k]);
      fprintf(stderr, ", device");
      for (int k = 0; k < 8; ++k) fprintf(stderr, " %02x", back[k]);
      fprintf(stderr, "\n");
    }
  } /* the memset runs on the legacy stream, the calls on a non-blocking one */
}

static void finish(struct Bufs* b, cudaStream_t stream, int rank, const char* what) {
  cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, cudaGetErrorString(err));
    exit(3);
  }
  CUDA(cudaMemcpy(b->host, b->recv, b->recvBytes, cudaMemcpyDeviceToHost));
  if (memcmp(b->host, b->want, b->recvBytes) != 0) {
    size_t first = 0;
    while (b->host[first] == b->want[first]) ++first;
    fprintf(stderr, "rank %d: %s: wrong result (first differing byte %zu of %zu; got", rank, what, first, b->recvBytes);
    for (size_t k = first; k < first + 8 && k < b->recvBytes; ++k) fprintf(stderr, " %02x", (unsigned char)b->host[k]);
    fprintf(stderr, ", want");
    for (size_t k = first; k < first + 8 && k < b->recvBytes; ++k) fprintf(stderr, " %02x", (unsigned char)b->want[k]);
    unsigned char sent[8] = {0};
    CUDA(cudaMemcpy(sent, b->send, b->sendBytes < 8 ? b->sendBytes : 8, cudaMemcpyDeviceToHost));
    fprintf(stderr, "; send %p holds", b->send);
    for (int k = 0; k < 8; ++k) fprintf(stderr, " %02x", sent[k]);
    fprintf(stderr, ", recv %p)\n", b->recv);
    ++failures;
  }
  cudaFree(b->send);
  cudaFree(b->recv);
  free(b->host);
  free(b->want);
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* On a split of comm, the last rank never joins an allreduce and aborts instead: the others' call
 * must end at once (not at FERRY_DEVICE_TIMEOUT, 30 s), they must see ncclRemoteError, and they
 * abort too. Returns 0 when all of that holds on this rank. */
static int abortPhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  ncclComm_t sub;
  CHECK(ncclCommSplit(comm, 0, rank, &sub, NULL));
  const size_t count = 1 << 18;
  void* buf = NULL;
  CUDA(cudaMalloc(&buf, count * 4));
  const double start = seconds();
  int bad = 0;
  if (rank == nranks - 1) {
    usleep(300000); /* the others are surely waiting */
    CHECK(ncclCommAbort(sub));
  } else {
    CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, sub, stream));
    CUDA(cudaStreamSynchronize(stream));
    ncclResult_t async = ncclSuccess;
    while (seconds() - start < 5 && ncclCommGetAsyncError(sub, &async) == ncclSuccess && async != ncclRemoteError)
      usleep(1000);
    if (async != ncclRemoteError) {
      fprintf(stderr, "rank %d: ncclCommGetAsyncError gave %d, not ncclRemoteError, after the peer's abort\n", rank,
              (int)async);
      bad = 1;
    }
    CHECK(ncclCommAbort(sub));
  }
  const double took = seconds() - start;
  if (took > 5) {
    fprintf(stderr, "rank %d: the abort took %.1f s to return control\n", rank, took);
    bad = 1;
  }
  CUDA(cudaFree(buf));
  if (rank == 0) printf("abort: control back on rank 0 after %.2f s\n", took);
  return bad;
}

/* Ops from ncclRedOpCreatePreMulSum: every type with the host scalar 2 on every rank (each sum of
 * doubled small integers is exact even in fp8), then float32 with a device scalar of rank + 1.
 * Returns the number of calls checked. */
static int preMulPhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  char what[128];
  int calls = 0;
  struct Bufs b;
  for (int t = 0; t < ncclNumTypes; ++t) {
    /* NCCL 2.28.3 refuses PreMulSum ops of fp8 as it does avg (seen on one rank); ferry runs them. */
    if (forwardedAll() && t >= ncclFloat8e4m3) continue;
    const size_t es = kBytes[t];
    unsigned char two[8];
    encode(t, 2, two);
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, two, (ncclDataType_t)t, ncclScalarHostImmediate, comm));

    snprintf(what, sizeof(what), "ncclAllReduce %s premulsum(2)", kTypeNames[t]);
    prepare(&b, t, COUNT, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i) encode(t, 2 * reduceAt(t, ncclSum, nranks, i), b.want + i * es);
    CHECK(ncclAllReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, op, comm, stream));
    finish(&b, stream, rank, what);

    snprintf(what, sizeof(what), "ncclReduceScatter %s premulsum(2)", kTypeNames[t]);
    prepare(&b, t, COUNT * nranks, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i)
      encode(t, 2 * reduceAt(t, ncclSum, nranks, rank * COUNT + i), b.want + i * es);
    CHECK(ncclReduceScatter(b.send, b.recv, COUNT, (ncclDataType_t)t, op, comm, stream));
    finish(&b, stream, rank, what);

    const int root = t % nranks;
    snprintf(what, sizeof(what), "ncclReduce %s premulsum(2) root %d", kTypeNames[t], root);
    prepare(&b, t, COUNT, COUNT, rank);
    if (rank == root)
      for (size_t i = 0; i < COUNT; ++i) encode(t, 2 * reduceAt(t, ncclSum, nranks, i), b.want + i * es);
    else
      memset(b.want, 0xFF, b.recvBytes);
    CHECK(ncclReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, op, root, comm, stream));
    finish(&b, stream, rank, what);

    /* The op belongs to its datatype (ferry's check; the real NCCL's differs by version). */
    const int other = (t + 1) % ncclNumTypes;
    if (!forwardedAll() && ncclAllReduce(b.send, b.recv, COUNT, (ncclDataType_t)other, op, comm, stream) !=
                               ncclInvalidArgument) {
      fprintf(stderr, "rank %d: a %s PreMulSum op used on %s was not ncclInvalidArgument\n", rank,
              kTypeNames[t], kTypeNames[other]);
      ++failures;
    }
    CHECK(ncclRedOpDestroy(op, comm));
    calls += 3;
  }
  /* A device scalar, different on every rank, read when the call runs (set after the op is made). */
  float* factor = NULL;
  CUDA(cudaMalloc((void**)&factor, sizeof(float)));
  ncclRedOp_t op;
  CHECK(ncclRedOpCreatePreMulSum(&op, factor, ncclFloat32, ncclScalarDevice, comm));
  const float mine = (float)(rank + 1);
  CUDA(cudaMemcpy(factor, &mine, sizeof mine, cudaMemcpyHostToDevice));
  prepare(&b, ncclFloat32, COUNT, COUNT, rank);
  for (size_t i = 0; i < COUNT; ++i) {
    double want = 0;
    for (int q = 0; q < nranks; ++q) want += (q + 1) * value(ncclFloat32, q, i);
    encode(ncclFloat32, want, b.want + i * 4);
  }
  CHECK(ncclAllReduce(b.send, b.recv, COUNT, ncclFloat32, op, comm, stream));
  finish(&b, stream, rank, "ncclAllReduce float32 premulsum(rank + 1, device scalar)");
  CHECK(ncclRedOpDestroy(op, comm));
  CUDA(cudaFree(factor));
  return calls + 1;
}

static int runRank(int rank, int nranks, ncclUniqueId id) {
  int ngpus = 0;
  cudaGetDeviceCount(&ngpus);
  cudaSetDevice(rank % ngpus);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int n = 0, dev = -1, me = -1;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommCuDevice(comm, &dev));
  CHECK(ncclCommUserRank(comm, &me));
  if (n != nranks || dev != rank % ngpus || me != rank) {
    fprintf(stderr, "rank %d: count %d, device %d, rank %d are wrong\n", rank, n, dev, me);
    return 1;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  char what[128];
  int calls = 0;
  /* NCCL_C_TEST_FIRST_TYPE=k starts the round of types at type k (a diagnostic knob). */
  const char* firstType = getenv("NCCL_C_TEST_FIRST_TYPE");
  const int first = firstType != NULL ? atoi(firstType) % ncclNumTypes : 0;
  for (int k = 0; k < ncclNumTypes; ++k) {
    const int t = (first + k) % ncclNumTypes;
    const size_t es = kBytes[t];
    struct Bufs b;
    for (int op = 0; op < ncclNumOps; ++op) {
      /* NCCL 2.28.3 refuses avg of fp8 (ncclInvalidArgument, seen on one rank); ferry runs it. */
      if (forwardedAll() && op == ncclAvg && t >= ncclFloat8e4m3) continue;
      snprintf(what, sizeof(what), "ncclAllReduce %s %s", kTypeNames[t], kOpNames[op]);
      prepare(&b, t, COUNT, COUNT, rank);
      for (size_t i = 0; i < COUNT; ++i) encode(t, reduceAt(t, op, nranks, i), b.want + i * es);
      CHECK(ncclAllReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream));
      finish(&b, stream, rank, what);

      snprintf(what, sizeof(what), "ncclReduceScatter %s %s", kTypeNames[t], kOpNames[op]);
      prepare(&b, t, COUNT * nranks, COUNT, rank);
      for (size_t i = 0; i < COUNT; ++i) encode(t, reduceAt(t, op, nranks, rank * COUNT + i), b.want + i * es);
      CHECK(ncclReduceScatter(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream));
      finish(&b, stream, rank, what);

      /* Off the root, recvbuff must stay as it was (poisoned). */
      const int root = (t + op) % nranks;
      snprintf(what, sizeof(what), "ncclReduce %s %s root %d", kTypeNames[t], kOpNames[op], root);
      prepare(&b, t, COUNT, COUNT, rank);
      if (rank == root)
        for (size_t i = 0; i < COUNT; ++i) encode(t, reduceAt(t, op, nranks, i), b.want + i * es);
      else
        memset(b.want, 0xFF, b.recvBytes);
      CHECK(ncclReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, root, comm, stream));
      finish(&b, stream, rank, what);
      calls += 3;
    }
    snprintf(what, sizeof(what), "ncclAllGather %s", kTypeNames[t]);
    prepare(&b, t, COUNT, COUNT * nranks, rank);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, q, i), b.want + (q * COUNT + i) * es);
    CHECK(ncclAllGather(b.send, b.recv, COUNT, (ncclDataType_t)t, comm, stream));
    finish(&b, stream, rank, what);

    snprintf(what, sizeof(what), "ncclAlltoAll %s", kTypeNames[t]);
    prepare(&b, t, COUNT * nranks, COUNT * nranks, rank);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, q, rank * COUNT + i), b.want + (q * COUNT + i) * es);
    CHECK(ncclAlltoAll(b.send, b.recv, COUNT, (ncclDataType_t)t, comm, stream));
    finish(&b, stream, rank, what);

    const int root = 1 % nranks;
    snprintf(what, sizeof(what), "ncclBroadcast %s root %d", kTypeNames[t], root);
    prepare(&b, t, COUNT, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, root, i), b.want + i * es);
    CHECK(ncclBroadcast(b.send, b.recv, COUNT, (ncclDataType_t)t, root, comm, stream));
    finish(&b, stream, rank, what);

    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    snprintf(what, sizeof(what), "ncclSend/ncclRecv ring %s", kTypeNames[t]);
    prepare(&b, t, COUNT, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, prev, i), b.want + i * es);
    CHECK(ncclGroupStart());
    CHECK(ncclSend(b.send, COUNT, (ncclDataType_t)t, next, comm, stream));
    CHECK(ncclRecv(b.recv, COUNT, (ncclDataType_t)t, prev, comm, stream));
    CHECK(ncclGroupEnd());
    finish(&b, stream, rank, what);
    calls += 4;
  }
  calls += preMulPhase(comm, rank, nranks, stream);
  /* The real NCCL's abort does not release the peers' kernels: only ferry's is checked. */
  if (!forwardedAll() && abortPhase(comm, rank, nranks, stream) != 0) ++failures;
  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
  if (rank == 0) printf("nccl C API on %d ranks: %d calls checked, %d wrong\n", nranks, calls, failures);
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? atoi(argv[1]) : 2;
  const char* share = getenv("GPU_TESTS_SHARE_GPUS");
  const int sharing = share != NULL && share[0] == '1';
  /* Count GPUs in a child: CUDA must not be initialized before fork. */
  pid_t probe = fork();
  if (probe == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  waitpid(probe, &status, 0);
  const int gpus = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (gpus == 0 || (gpus < nranks && !sharing)) {
    printf("skipped: %d ranks need %d GPUs (or GPU_TESTS_SHARE_GPUS=1), found %d\n", nranks, nranks, gpus);
    return 77;
  }
  if (gpus < nranks && forwardedAll()) {
    printf(
        "skipped: %d ranks on %d GPUs, and the real NCCL (FERRY_NCCL_FORWARD_ALL=1) refuses ranks sharing "
        "one\n",
        nranks, gpus);
    return 77;
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  pid_t pids[64];
  fflush(stdout); /* nothing buffered here is printed again by the children */
  for (int rank = 0; rank < nranks; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      const int rc = runRank(rank, nranks, id);
      fflush(stdout); /* _exit does not flush, and stdout may be a pipe */
      fflush(stderr);
      _exit(rc);
    }
  }
  int bad = 0;
  for (int rank = 0; rank < nranks; ++rank) {
    waitpid(pids[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", rank, status);
      bad = 1;
    }
  }
  return bad;
}
