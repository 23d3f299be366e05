/* The NCCL API from plain C, on GPUs: N ranks (forked processes, rank r on GPU r % GPUs) run every
 * collective, every datatype and every op through nccl.h, plus grouped send/recv in a ring and the
 * three reducing collectives with PreMulSum ops (host and device scalars), each checked element by
 * element (output poisoned first) against values computed here. Inputs are small integers, so every
 * result is exact in every type. Then, at counts 1, 3, 1023 and 65541 (kShapes): in-place calls
 * (allreduce, broadcast, ncclBcast, reduce, allgather, reducescatter), calls on buffers from
 * ncclMemAlloc and on buffers registered with ncclCommRegister, and allreduces on a communicator
 * made with config.blocking = 0; and calls on buffers that are not device memory, which must be
 * ncclInvalidArgument.
 *
 *   nccl_c_collectives NRANKS     exit 0: all correct; 77: not enough GPUs (unless
 *                                 GPU_TESTS_SHARE_GPUS=1 lets ranks share them)
 *
 * With FERRY_NCCL_FORWARD_ALL=1 every call goes to the real NCCL: the same checks, less the abort
 * phase (the real NCCL's abort leaves the peers waiting), ferry's own argument errors (bad pointers
 * included), and avg and PreMulSum of fp8, which the real NCCL refuses.
 *
 * Diagnostic knobs: NCCL_C_TEST_FIRST_TYPE=k starts the round of types at type k;
 * NCCL_C_TEST_CHECK_UPLOAD=1 reads each input back after upload and reports a difference.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "c_test_checks.h"
#include "c_test_values.h"

#define COUNT 1023 /* not a multiple of any vector width */

static int failures = 0;

#define CHECK(call) ncclMust((call), #call, __FILE__, __LINE__, rank)

/* FERRY_NCCL_FORWARD_ALL=1: every communicator runs on the real NCCL (the forwarding path). */
static int forwardedAll(void) {
  const char* v = getenv("FERRY_NCCL_FORWARD_ALL");
  return v != NULL && v[0] == '1';
}

struct Bufs {
  void* send;
  void* recv;
  char* host;
  char* want;
  size_t sendBytes, recvBytes;
};

static void prepare(struct Bufs* b, int t, size_t sendCount, size_t recvCount, int sendRank) {
  const size_t es = typeBytes(t);
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
    fprintf(stderr, "rank %d: %s: wrong result (first differing byte %zu of %zu; got", rank, what, first,
            b->recvBytes);
    for (size_t k = first; k < first + 8 && k < b->recvBytes; ++k)
      fprintf(stderr, " %02x", (unsigned char)b->host[k]);
    fprintf(stderr, ", want");
    for (size_t k = first; k < first + 8 && k < b->recvBytes; ++k)
      fprintf(stderr, " %02x", (unsigned char)b->want[k]);
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
    while (seconds() - start < 5 && ncclCommGetAsyncError(sub, &async) == ncclSuccess &&
           async != ncclRemoteError)
      usleep(1000);
    if (async != ncclRemoteError) {
      fprintf(stderr, "rank %d: ncclCommGetAsyncError gave %d, not ncclRemoteError, after the peer's abort\n",
              rank, (int)async);
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
    const size_t es = typeBytes(t);
    unsigned char two[8];
    encode(t, 2, two);
    ncclRedOp_t op;
    CHECK(ncclRedOpCreatePreMulSum(&op, two, (ncclDataType_t)t, ncclScalarHostImmediate, comm));

    snprintf(what, sizeof(what), "ncclAllReduce %s premulsum(2)", typeName(t));
    prepare(&b, t, COUNT, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i) encode(t, 2 * reduceAt(t, ncclSum, nranks, i), b.want + i * es);
    CHECK(ncclAllReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, op, comm, stream));
    finish(&b, stream, rank, what);

    snprintf(what, sizeof(what), "ncclReduceScatter %s premulsum(2)", typeName(t));
    prepare(&b, t, COUNT * nranks, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i)
      encode(t, 2 * reduceAt(t, ncclSum, nranks, rank * COUNT + i), b.want + i * es);
    CHECK(ncclReduceScatter(b.send, b.recv, COUNT, (ncclDataType_t)t, op, comm, stream));
    finish(&b, stream, rank, what);

    const int root = t % nranks;
    snprintf(what, sizeof(what), "ncclReduce %s premulsum(2) root %d", typeName(t), root);
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
              typeName(t), typeName(other));
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

/* The shapes of the cases below: counts of 1, 3, not a multiple of any vector width and over 64 Ki
 * elements, each with a type and an op of its own (none that the real NCCL refuses). */
static const struct Shape {
  size_t count;
  int type, op;
} kShapes[] = {{1, ncclFloat32, ncclSum},
               {3, ncclInt8, ncclMax},
               {1023, ncclBfloat16, ncclProd},
               {65536 + 5, ncclFloat32, ncclSum},
               {65536 + 5, ncclFloat16, ncclAvg}};
#define NUM_SHAPES (sizeof(kShapes) / sizeof(kShapes[0]))

/* Writes rank src's input elements [from, from + n) of type t at dev. */
static void upload(void* dev, int t, int src, size_t from, size_t n) {
  const size_t es = typeBytes(t);
  char* host = malloc(n * es);
  fillInputs(host, t, src, from, n);
  CUDA(cudaMemcpy(dev, host, n * es, cudaMemcpyHostToDevice));
  CUDA(cudaDeviceSynchronize()); /* the copy runs on the legacy stream, the calls on a non-blocking one */
  free(host);
}

/* Fills an output with 0xFF bytes (a NaN in every float type), so that an element left unwritten shows. */
static void poison(void* dev, size_t bytes) {
  CUDA(cudaMemset(dev, 0xFF, bytes));
  CUDA(cudaDeviceSynchronize());
}

/* A broadcast's buffer: the root's input on the root, poison elsewhere (where it is only written). */
static void rootInputOrPoison(void* dev, int t, int rank, int root, size_t n) {
  if (rank == root)
    upload(dev, t, rank, 0, n);
  else
    poison(dev, n * typeBytes(t));
}

/* Waits for the call on `stream`, then compares the n elements of type t at dev with want, element
 * by element; a difference is a failure, reported with the rank and `what`. */
static void expectElements(int rank, const char* what, cudaStream_t stream, int t, const void* dev,
                           const char* want, size_t n) {
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, cudaGetErrorString(err));
    exit(3);
  }
  char* host = malloc(n * typeBytes(t));
  CUDA(cudaMemcpy(host, dev, n * typeBytes(t), cudaMemcpyDeviceToHost));
  char who[256];
  snprintf(who, sizeof(who), "rank %d: %s", rank, what);
  if (compareElements(who, t, host, want, n) != 0) ++failures;
  free(host);
}

/* ncclGroupSimulateEnd: a group of an allreduce and a send/recv ring is estimated (above 0 us) and
 * dropped, so its outputs stay poisoned; the same group ended with ncclGroupEnd then runs. Returns
 * the number of calls checked. */
static int simulatePhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  const size_t n = 1 << 16, bytes = 2 * n * sizeof(float);
  float *in, *out;
  CUDA(cudaMalloc((void**)&in, bytes));
  CUDA(cudaMalloc((void**)&out, bytes));
  CUDA(cudaMemset(in, 0, bytes));
  poison(out, bytes);
  unsigned char* host = malloc(bytes);
  for (int simulate = 1; simulate >= 0; --simulate) {
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, stream));
    CHECK(ncclSend(in, n, ncclFloat32, (rank + 1) % nranks, comm, stream));
    CHECK(ncclRecv(out + n, n, ncclFloat32, (rank + nranks - 1) % nranks, comm, stream));
    if (simulate)
      CHECK(ncclGroupSimulateEnd(&sim));
    else
      CHECK(ncclGroupEnd());
    CUDA(cudaStreamSynchronize(stream));
    CUDA(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) wrong += host[i] != (simulate ? 0xFF : 0x00);
    if (wrong != 0) {
      fprintf(stderr, "rank %d: %s: %zu of %zu output bytes are not %s\n", rank,
              simulate ? "ncclGroupSimulateEnd" : "the group ended", wrong, bytes,
              simulate ? "the poison (a simulated group must not run)" : "the sums and receives (0)");
      ++failures;
    }
    if (simulate && !(sim.estimatedTime > 0.0f)) {
      fprintf(stderr, "rank %d: ncclGroupSimulateEnd estimated %g us\n", rank, (double)sim.estimatedTime);
      ++failures;
    }
  }
  free(host);
  CUDA(cudaFree(in));
  CUDA(cudaFree(out));
  return 2;
}

/* In-place calls, by NCCL's rules: one buffer for allreduce, broadcast, ncclBcast (the legacy
 * in-place broadcast) and reduce; allgather's sendbuff is recvbuff + rank * count; reducescatter's
 * recvbuff is sendbuff + rank * recvcount. The whole buffer is checked after each: what is only
 * read (a reduce's buffer off the root, the rest of a reducescatter's sendbuff) must be as it was.
 * Returns the number of calls checked. */
static int inPlacePhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  char what[160];
  int calls = 0;
  for (size_t s = 0; s < NUM_SHAPES; ++s) {
    const int t = kShapes[s].type, op = kShapes[s].op;
    const size_t n = kShapes[s].count, es = typeBytes(t), all = n * (size_t)nranks;
    const ncclDataType_t type = (ncclDataType_t)t;
    char* buf = NULL;
    char* want = malloc(all * es);
    CUDA(cudaMalloc((void**)&buf, all * es));

    snprintf(what, sizeof(what), "in-place ncclAllReduce %s %s count %zu", typeName(t), opName(op), n);
    upload(buf, t, rank, 0, n);
    fillReduced(want, t, op, nranks, 0, n);
    CHECK(ncclAllReduce(buf, buf, n, type, (ncclRedOp_t)op, comm, stream));
    expectElements(rank, what, stream, t, buf, want, n);

    int root = (int)(s % (size_t)nranks);
    snprintf(what, sizeof(what), "in-place ncclBroadcast %s count %zu root %d", typeName(t), n, root);
    rootInputOrPoison(buf, t, rank, root, n);
    fillInputs(want, t, root, 0, n);
    CHECK(ncclBroadcast(buf, buf, n, type, root, comm, stream));
    expectElements(rank, what, stream, t, buf, want, n);

    root = (int)((s + 1) % (size_t)nranks);
    snprintf(what, sizeof(what), "ncclBcast %s count %zu root %d", typeName(t), n, root);
    rootInputOrPoison(buf, t, rank, root, n);
    fillInputs(want, t, root, 0, n);
    CHECK(ncclBcast(buf, n, type, root, comm, stream));
    expectElements(rank, what, stream, t, buf, want, n);

    /* Off the root, the buffer is sendbuff only: it keeps the rank's input. */
    root = (int)((s + 2) % (size_t)nranks);
    snprintf(what, sizeof(what), "in-place ncclReduce %s %s count %zu root %d", typeName(t), opName(op), n,
             root);
    upload(buf, t, rank, 0, n);
    if (rank == root)
      fillReduced(want, t, op, nranks, 0, n);
    else
      fillInputs(want, t, rank, 0, n);
    CHECK(ncclReduce(buf, buf, n, type, (ncclRedOp_t)op, root, comm, stream));
    expectElements(rank, what, stream, t, buf, want, n);

    snprintf(what, sizeof(what), "in-place ncclAllGather %s count %zu", typeName(t), n);
    poison(buf, all * es);
    upload(buf + (size_t)rank * n * es, t, rank, 0, n);
    for (int q = 0; q < nranks; ++q) fillInputs(want + (size_t)q * n * es, t, q, 0, n);
    CHECK(ncclAllGather(buf + (size_t)rank * n * es, buf, n, type, comm, stream));
    expectElements(rank, what, stream, t, buf, want, all);

    snprintf(what, sizeof(what), "in-place ncclReduceScatter %s %s count %zu", typeName(t), opName(op), n);
    upload(buf, t, rank, 0, all);
    fillInputs(want, t, rank, 0, all);
    fillReduced(want + (size_t)rank * n * es, t, op, nranks, (size_t)rank * n, n);
    CHECK(ncclReduceScatter(buf, buf + (size_t)rank * n * es, n, type, (ncclRedOp_t)op, comm, stream));
    expectElements(rank, what, stream, t, buf, want, all);

    CUDA(cudaFree(buf));
    free(want);
    calls += 6;
  }
  return calls;
}

/* Out-of-place allreduce, reducescatter, allgather and broadcast of one shape on the caller's
 * buffers (count * nranks elements each), outputs poisoned first; `how` says where the buffers
 * come from. Returns the number of calls checked. */
static int outOfPlaceCalls(ncclComm_t comm, int rank, int nranks, cudaStream_t stream,
                           const struct Shape* shape, char* send, char* recv, const char* how) {
  const int t = shape->type, op = shape->op, root = nranks - 1;
  const size_t n = shape->count, es = typeBytes(t), all = n * (size_t)nranks;
  const ncclDataType_t type = (ncclDataType_t)t;
  char* want = malloc(all * es);
  char what[160];

  snprintf(what, sizeof(what), "ncclAllReduce %s %s count %zu, %s", typeName(t), opName(op), n, how);
  upload(send, t, rank, 0, n);
  poison(recv, n * es);
  fillReduced(want, t, op, nranks, 0, n);
  CHECK(ncclAllReduce(send, recv, n, type, (ncclRedOp_t)op, comm, stream));
  expectElements(rank, what, stream, t, recv, want, n);

  snprintf(what, sizeof(what), "ncclReduceScatter %s %s count %zu, %s", typeName(t), opName(op), n, how);
  upload(send, t, rank, 0, all);
  poison(recv, n * es);
  fillReduced(want, t, op, nranks, (size_t)rank * n, n);
  CHECK(ncclReduceScatter(send, recv, n, type, (ncclRedOp_t)op, comm, stream));
  expectElements(rank, what, stream, t, recv, want, n);

  snprintf(what, sizeof(what), "ncclAllGather %s count %zu, %s", typeName(t), n, how);
  upload(send, t, rank, 0, n);
  poison(recv, all * es);
  for (int q = 0; q < nranks; ++q) fillInputs(want + (size_t)q * n * es, t, q, 0, n);
  CHECK(ncclAllGather(send, recv, n, type, comm, stream));
  expectElements(rank, what, stream, t, recv, want, all);

  snprintf(what, sizeof(what), "ncclBroadcast %s count %zu root %d, %s", typeName(t), n, root, how);
  upload(send, t, rank, 0, n);
  poison(recv, n * es);
  fillInputs(want, t, root, 0, n);
  CHECK(ncclBroadcast(send, recv, n, type, root, comm, stream));
  expectElements(rank, what, stream, t, recv, want, n);

  free(want);
  return 4;
}

/* Buffers from ncclMemAlloc (CUDA VMM memory in ferry), freed with ncclMemFree. */
static int memAllocPhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  int calls = 0;
  for (size_t s = 0; s < NUM_SHAPES; ++s) {
    const size_t bytes = kShapes[s].count * (size_t)nranks * typeBytes(kShapes[s].type);
    void* send = NULL;
    void* recv = NULL;
    CHECK(ncclMemAlloc(&send, bytes));
    CHECK(ncclMemAlloc(&recv, bytes));
    calls +=
        outOfPlaceCalls(comm, rank, nranks, stream, &kShapes[s], send, recv, "buffers from ncclMemAlloc");
    CHECK(ncclMemFree(send));
    CHECK(ncclMemFree(recv));
  }
  return calls;
}

/* Buffers registered with ncclCommRegister, which is collective in ferry: every rank registers the
 * same roles in the same order (sendbuff from cudaMalloc, then recvbuff from ncclMemAlloc, each
 * whole), and deregisters them all before they are freed. Every shape's calls run on the starts of
 * the two buffers, then an in-place allreduce in recvbuff. */
static int registeredPhase(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
  size_t bytes = 0;
  for (size_t s = 0; s < NUM_SHAPES; ++s) {
    const size_t b = kShapes[s].count * (size_t)nranks * typeBytes(kShapes[s].type);
    bytes = b > bytes ? b : bytes;
  }
  char* send = NULL;
  void* recv = NULL;
  CUDA(cudaMalloc((void**)&send, bytes));
  CHECK(ncclMemAlloc(&recv, bytes));
  void* sendHandle = NULL;
  void* recvHandle = NULL;
  CHECK(ncclCommRegister(comm, send, bytes, &sendHandle));
  CHECK(ncclCommRegister(comm, recv, bytes, &recvHandle));
  char* want = malloc(bytes);
  char what[160];
  int calls = 0;
  for (size_t s = 0; s < NUM_SHAPES; ++s) {
    const int t = kShapes[s].type, op = kShapes[s].op;
    const size_t n = kShapes[s].count;
    calls += outOfPlaceCalls(comm, rank, nranks, stream, &kShapes[s], send, recv, "registered buffers");
    snprintf(what, sizeof(what), "in-place ncclAllReduce %s %s count %zu, registered buffer", typeName(t),
             opName(op), n);
    upload(recv, t, rank, 0, n);
    fillReduced(want, t, op, nranks, 0, n);
    CHECK(ncclAllReduce(recv, recv, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream));
    expectElements(rank, what, stream, t, recv, want, n);
    ++calls;
  }
  CHECK(ncclCommDeregister(comm, sendHandle));
  CHECK(ncclCommDeregister(comm, recvHandle));
  CUDA(cudaFree(send));
  CHECK(ncclMemFree(recv));
  free(want);
  return calls;
}

/* A call that must be ncclInvalidArgument, with a message naming the argument and the rule. */
static void expectInvalidArgument(int rank, ncclResult_t r, const char* name, const char* rule,
                                  const char* what) {
  const char* last = ncclGetLastError(NULL);
  if (r != ncclInvalidArgument || strstr(last, name) == NULL || strstr(last, rule) == NULL) {
    fprintf(stderr, "rank %d: %s: got %s (\"%s\"), want ncclInvalidArgument naming %s and \"%s\"\n", rank,
            what, ncclGetErrorString(r), last, name, rule);
    ++failures;
  }
}

/* Buffers that are not device memory of the communicator's GPU are ncclInvalidArgument naming the
 * argument, as NCCL's with NCCL_CHECK_POINTERS=1: host memory from malloc, pinned host memory
 * (which NCCL would take; ferry needs device memory) and another GPU's memory (with two GPUs or
 * more); so is NULL with a count. Each is found before anything runs, so no rank waits for another.
 * An empty call checks nothing. Returns the number of calls checked. */
static int badPointerPhase(ncclComm_t comm, int rank, int nranks, int ngpus, cudaStream_t stream) {
  const size_t n = 1023;
  const int peer = (rank + 1) % nranks;
  float* dev = NULL;
  float* pinned = NULL;
  float* host = calloc(n * (size_t)nranks, sizeof(float));
  CUDA(cudaMalloc((void**)&dev, n * (size_t)nranks * sizeof(float)));
  CUDA(cudaMallocHost((void**)&pinned, n * (size_t)nranks * sizeof(float)));
  const char* const rule = "is not a valid pointer";
  expectInvalidArgument(rank, ncclAllReduce(host, dev, n, ncclFloat32, ncclSum, comm, stream), "sendbuff",
                        rule, "ncclAllReduce with sendbuff from malloc");
  expectInvalidArgument(rank, ncclAllReduce(dev, host, n, ncclFloat32, ncclSum, comm, stream), "recvbuff",
                        rule, "ncclAllReduce with recvbuff from malloc");
  expectInvalidArgument(rank, ncclReduceScatter(pinned, dev, n, ncclFloat32, ncclSum, comm, stream),
                        "sendbuff", "pinned host memory",
                        "ncclReduceScatter with sendbuff from cudaMallocHost");
  expectInvalidArgument(rank, ncclAllGather(dev, pinned, n, ncclFloat32, comm, stream), "recvbuff",
                        "pinned host memory", "ncclAllGather with recvbuff from cudaMallocHost");
  expectInvalidArgument(rank, ncclBcast(host, n, ncclFloat32, rank, comm, stream), "sendbuff", rule,
                        "ncclBcast of a buffer from malloc on its root");
  expectInvalidArgument(rank, ncclReduce(host, dev, n, ncclFloat32, ncclSum, 0, comm, stream), "sendbuff",
                        rule, "ncclReduce with sendbuff from malloc");
  expectInvalidArgument(rank, ncclSend(host, n, ncclFloat32, peer, comm, stream), "sendbuff", rule,
                        "ncclSend of a buffer from malloc");
  expectInvalidArgument(rank, ncclRecv(pinned, n, ncclFloat32, peer, comm, stream), "recvbuff", rule,
                        "ncclRecv into a buffer from cudaMallocHost");
  expectInvalidArgument(rank, ncclAllReduce(NULL, dev, n, ncclFloat32, ncclSum, comm, stream), "sendbuff",
                        "is NULL", "ncclAllReduce with a NULL sendbuff");
  int calls = 9;
  int mine = 0;
  CUDA(cudaGetDevice(&mine));
  if (ngpus > 1) {
    const int other = (mine + 1) % ngpus;
    float* far = NULL;
    CUDA(cudaSetDevice(other));
    CUDA(cudaMalloc((void**)&far, n * sizeof(float)));
    CUDA(cudaSetDevice(mine));
    char rule2[64];
    snprintf(rule2, sizeof(rule2), "device memory of GPU %d", other);
    expectInvalidArgument(rank, ncclAllReduce(dev, far, n, ncclFloat32, ncclSum, comm, stream), "recvbuff",
                          rule2, "ncclAllReduce with recvbuff on another GPU");
    CUDA(cudaFree(far));
    ++calls;
  }
  const ncclResult_t empty = ncclAllReduce(host, host, 0, ncclFloat32, ncclSum, comm, stream);
  if (empty != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclAllReduce of 0 elements in host memory: %s (%s), want ncclSuccess\n", rank,
            ncclGetErrorString(empty), ncclGetLastError(NULL));
    ++failures;
  }
  CUDA(cudaStreamSynchronize(stream));
  CUDA(cudaFreeHost(pinned));
  CUDA(cudaFree(dev));
  free(host);
  return calls + 1;
}

/* Polls ncclCommGetAsyncError while comm is in progress, for at most `limit` seconds; returns the
 * last state (or the poll's own error). */
static ncclResult_t waitWhileInProgress(ncclComm_t comm, double limit) {
  const double start = seconds();
  ncclResult_t state = ncclInProgress;
  for (;;) {
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress || seconds() - start > limit) return state;
    usleep(1000);
  }
}

/* A communicator of its own, made with config.blocking = 0: ncclCommInitRankConfig returns at once
 * (ncclInProgress in ferry, whose init runs on a thread of its own), and ncclCommGetAsyncError is
 * polled until it is no longer ncclInProgress (at most 60 s). Then an allreduce of every shape on
 * it (a call that returns ncclInProgress, as the real NCCL's non-blocking calls may, is waited out
 * the same way), and its finalize and destroy. Returns the number of calls checked. */
static int nonBlockingPhase(int rank, int nranks, ncclUniqueId id, cudaStream_t stream) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = NULL;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  /* The real NCCL may have finished already. */
  if (started != ncclInProgress && !(forwardedAll() && started == ncclSuccess)) {
    fprintf(stderr, "rank %d: non-blocking ncclCommInitRankConfig returned %s (%s), not ncclInProgress\n",
            rank, ncclGetErrorString(started), ncclGetLastError(NULL));
    ++failures;
    if (started != ncclSuccess) return 0;
  }
  ncclResult_t state = waitWhileInProgress(comm, 60);
  if (state != ncclSuccess) {
    fprintf(stderr, "rank %d: non-blocking init: ncclCommGetAsyncError gives %s after up to 60 s (%s)\n",
            rank, ncclGetErrorString(state), ncclGetLastError(NULL));
    ++failures;
    return 0;
  }
  int count = 0, me = -1;
  CHECK(ncclCommCount(comm, &count));
  CHECK(ncclCommUserRank(comm, &me));
  if (count != nranks || me != rank) {
    fprintf(stderr, "rank %d: the non-blocking comm says count %d, rank %d\n", rank, count, me);
    ++failures;
  }
  char what[160];
  int calls = 0;
  for (size_t s = 0; s < NUM_SHAPES; ++s) {
    const int t = kShapes[s].type, op = kShapes[s].op;
    const size_t n = kShapes[s].count, es = typeBytes(t);
    char* send = NULL;
    char* recv = NULL;
    char* want = malloc(n * es);
    CUDA(cudaMalloc((void**)&send, n * es));
    CUDA(cudaMalloc((void**)&recv, n * es));
    snprintf(what, sizeof(what), "ncclAllReduce %s %s count %zu on a non-blocking comm", typeName(t),
             opName(op), n);
    upload(send, t, rank, 0, n);
    poison(recv, n * es);
    fillReduced(want, t, op, nranks, 0, n);
    ncclResult_t r = ncclAllReduce(send, recv, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream);
    if (r == ncclInProgress) r = waitWhileInProgress(comm, 60);
    ncclMust(r, what, __FILE__, __LINE__, rank);
    expectElements(rank, what, stream, t, recv, want, n);
    CUDA(cudaFree(send));
    CUDA(cudaFree(recv));
    free(want);
    ++calls;
  }
  state = ncclCommFinalize(comm);
  if (state == ncclInProgress) state = waitWhileInProgress(comm, 60);
  ncclMust(state, "ncclCommFinalize of the non-blocking comm", __FILE__, __LINE__, rank);
  CHECK(ncclCommDestroy(comm));
  return calls;
}

static int runRank(int rank, int nranks, ncclUniqueId id, ncclUniqueId nonBlockingId) {
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
    const size_t es = typeBytes(t);
    struct Bufs b;
    for (int op = 0; op < ncclNumOps; ++op) {
      /* NCCL 2.28.3 refuses avg of fp8 (ncclInvalidArgument, seen on one rank); ferry runs it. */
      if (forwardedAll() && op == ncclAvg && t >= ncclFloat8e4m3) continue;
      snprintf(what, sizeof(what), "ncclAllReduce %s %s", typeName(t), opName(op));
      prepare(&b, t, COUNT, COUNT, rank);
      for (size_t i = 0; i < COUNT; ++i) encode(t, reduceAt(t, op, nranks, i), b.want + i * es);
      CHECK(ncclAllReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream));
      finish(&b, stream, rank, what);

      snprintf(what, sizeof(what), "ncclReduceScatter %s %s", typeName(t), opName(op));
      prepare(&b, t, COUNT * nranks, COUNT, rank);
      for (size_t i = 0; i < COUNT; ++i)
        encode(t, reduceAt(t, op, nranks, rank * COUNT + i), b.want + i * es);
      CHECK(ncclReduceScatter(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, comm, stream));
      finish(&b, stream, rank, what);

      /* Off the root, recvbuff must stay as it was (poisoned). */
      const int root = (t + op) % nranks;
      snprintf(what, sizeof(what), "ncclReduce %s %s root %d", typeName(t), opName(op), root);
      prepare(&b, t, COUNT, COUNT, rank);
      if (rank == root)
        for (size_t i = 0; i < COUNT; ++i) encode(t, reduceAt(t, op, nranks, i), b.want + i * es);
      else
        memset(b.want, 0xFF, b.recvBytes);
      CHECK(ncclReduce(b.send, b.recv, COUNT, (ncclDataType_t)t, (ncclRedOp_t)op, root, comm, stream));
      finish(&b, stream, rank, what);
      calls += 3;
    }
    snprintf(what, sizeof(what), "ncclAllGather %s", typeName(t));
    prepare(&b, t, COUNT, COUNT * nranks, rank);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, q, i), b.want + (q * COUNT + i) * es);
    CHECK(ncclAllGather(b.send, b.recv, COUNT, (ncclDataType_t)t, comm, stream));
    finish(&b, stream, rank, what);

    snprintf(what, sizeof(what), "ncclAlltoAll %s", typeName(t));
    prepare(&b, t, COUNT * nranks, COUNT * nranks, rank);
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < COUNT; ++i)
        encode(t, value(t, q, rank * COUNT + i), b.want + (q * COUNT + i) * es);
    CHECK(ncclAlltoAll(b.send, b.recv, COUNT, (ncclDataType_t)t, comm, stream));
    finish(&b, stream, rank, what);

    const int root = 1 % nranks;
    snprintf(what, sizeof(what), "ncclBroadcast %s root %d", typeName(t), root);
    prepare(&b, t, COUNT, COUNT, rank);
    for (size_t i = 0; i < COUNT; ++i) encode(t, value(t, root, i), b.want + i * es);
    CHECK(ncclBroadcast(b.send, b.recv, COUNT, (ncclDataType_t)t, root, comm, stream));
    finish(&b, stream, rank, what);

    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    snprintf(what, sizeof(what), "ncclSend/ncclRecv ring %s", typeName(t));
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
  calls += inPlacePhase(comm, rank, nranks, stream);
  if (!forwardedAll()) calls += simulatePhase(comm, rank, nranks, stream);
  calls += memAllocPhase(comm, rank, nranks, stream);
  calls += registeredPhase(comm, rank, nranks, stream);
  /* The real NCCL checks pointers only with NCCL_CHECK_POINTERS=1 (and a bad one may crash it). */
  if (!forwardedAll()) calls += badPointerPhase(comm, rank, nranks, ngpus, stream);
  calls += nonBlockingPhase(rank, nranks, nonBlockingId, stream);
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
  ncclUniqueId id, nonBlockingId; /* the second: the non-blocking comm's (nonBlockingPhase) */
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclGetUniqueId(&nonBlockingId) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  pid_t pids[64];
  fflush(stdout); /* nothing buffered here is printed again by the children */
  for (int rank = 0; rank < nranks; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      const int rc = runRank(rank, nranks, id, nonBlockingId);
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
