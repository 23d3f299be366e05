// The exported NCCL C API. Each function checks its arguments (checks.hpp), then runs natively on
// ferry::Comm, or, on a communicator forwarded to the real NCCL (nccl_comm.hpp), hands the call to
// it unchecked (it checks its own). Every body runs inside guarded(), so errors come back as
// ncclResult_t with a message in ncclGetLastError, never as exceptions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "api_internal.hpp"
#include "checks.hpp"
#include "estimate.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "nccl_comm.hpp"
#include "results.hpp"

#define NCCL_API extern "C" __attribute__((visibility("default")))

namespace ferry::nccl {
namespace {

// A native call made inside a group: it runs at the outermost ncclGroupEnd, in the order of the
// calls (as NCCL launches a group's work there), or is dropped by ncclGroupSimulateEnd after its
// cost is added up.
struct DeferredCall {
  ncclComm* comm;
  const char* api;
  CallCost cost;
  bool p2p;
  // Queues the call; `openP2P` lists the comms whose ferry group (of sends and receives) is open.
  std::function<ncclResult_t(std::vector<ncclComm*>& openP2P)> run;
};

// What a thread's ncclGroupStart / ncclGroupEnd have collected.
struct GroupState {
  int depth = 0;
  std::vector<DeferredCall> calls;           // native calls, in order
  std::vector<std::function<void()>> inits;  // ncclCommInitRank calls deferred to ncclGroupEnd
  const RealNccl* realGroup = nullptr;       // the real NCCL's group, if a forwarded call opened one
};
thread_local GroupState group;

// A native collective: run now (no std::function on this path, the common one), or inside a group
// deferred to its end (DeferredCall).
template <class Run>
ncclResult_t nativeCall(ncclComm& c, const char* api, CallCost cost, Run&& run) {
  if (group.depth == 0) return run();
  group.calls.push_back({&c, api, cost, false, [run = std::forward<Run>(run)](std::vector<ncclComm*>&) { return run(); }});
  return ncclSuccess;
}

ReduceOp nativeOp(ncclRedOp_t op) { return static_cast<ReduceOp>(op); }
DataType nativeType(ncclDataType_t t) { return static_cast<DataType>(t); }

}  // namespace

const RealNccl* forwarded(const ncclComm& c) {
  const RealNccl* real = c.forwardedTo;
  if (real != nullptr && group.depth > 0 && group.realGroup == nullptr) {
    real->groupStart();
    group.realGroup = real;
  }
  return real;
}

ncclResult_t realResult(const ncclComm& c, ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw ApiError{r, "the real NCCL (" + c.forwardedTo->path + "): " + c.forwardedTo->getLastError(c.real)};
  return r;
}

namespace {

// One of this comm's PreMulSum ops, copied (a call reads its host scalar after the lock is gone).
PreMulSumOp preMulOp(ncclComm& c, ncclRedOp_t op, ncclDataType_t datatype) {
  std::lock_guard lock(c.mu);
  auto it = c.ops.find(static_cast<int>(op));
  if (it == c.ops.end())
    throw ApiError{ncclInvalidArgument, "op " + std::to_string(op) + " is not an op of this comm"};
  if (it->second.type != datatype)
    throw ApiError{ncclInvalidArgument,
                   "op " + std::to_string(op) + " was made by ncclRedOpCreatePreMulSum for datatype " +
                       std::to_string(it->second.type) + ", not " + std::to_string(datatype)};
  return it->second;
}

void checkOp(ncclComm& c, ncclRedOp_t op) {
  if (static_cast<int>(op) >= 0 && op < ncclNumOps) return;
  std::lock_guard lock(c.mu);
  if (!c.ops.count(static_cast<int>(op)))
    throw ApiError{ncclInvalidArgument,
                   "op " + std::to_string(static_cast<int>(op)) +
                       " is neither a built-in ncclRedOp_t nor made by ncclRedOpCreatePreMulSum "
                       "on this comm"};
}

// A call's sendbuff and recvbuff on c's GPU (checkDeviceBuffer), those it uses: broadcast reads no
// sendbuff off the root, reduce writes no recvbuff off it. One pointer as both is checked once.
void checkBuffers(const ncclComm& c, cudaStream_t stream, std::size_t count, const void* sendbuff,
                  bool usesSend, const void* recvbuff, bool usesRecv) {
  if (usesSend) checkDeviceBuffer(sendbuff, count, "sendbuff", c.device, stream);
  if (usesRecv && !(usesSend && recvbuff == sendbuff))
    checkDeviceBuffer(recvbuff, count, "recvbuff", c.device, stream);
}

// Runs native() (ferry's call on these buffers). NULL is refused first (checkBuffer); whether a
// buffer is device memory of c's GPU is asked of CUDA only once ferry refused the call, which its
// own check (asking CUDA too) does for such a pointer: NCCL's answer to it, ncclInvalidArgument
// with checkDeviceBuffer's message, then replaces ferry's InvalidUsage, and a good call pays for no
// second query.
template <class Native>
ncclResult_t onBuffers(const ncclComm& c, cudaStream_t stream, std::size_t count, const void* sendbuff,
                       bool usesSend, const void* recvbuff, bool usesRecv, Native&& native) {
  if (usesSend) checkBuffer(sendbuff, count, "sendbuff");
  if (usesRecv) checkBuffer(recvbuff, count, "recvbuff");
  try {
    return native();
  } catch (const ferry::Error& e) {
    if (e.code() == ferry::ErrorCode::InvalidUsage)
      checkBuffers(c, stream, count, sendbuff, usesSend, recvbuff, usesRecv);
    throw;
  }
}

}  // namespace

void checkReady(ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress) throw ApiError{r, lastError()};
}

namespace {

std::mutex memMu;
std::map<void*, std::shared_ptr<void>>& memAllocations() {
  static std::map<void*, std::shared_ptr<void>> m;
  return m;
}

}  // namespace

void keepConfig(ncclComm& c, const ncclConfig_t* config) {
  if (config == nullptr) return;
  ncclConfig_t copy = NCCL_CONFIG_INITIALIZER;
  const ncclConfig_t defaults = copy;
  std::memcpy(&copy, config, std::min(config->size, sizeof(ncclConfig_t)));
  copy.size = defaults.size;
  copy.version = defaults.version;
  if (config->size < offsetof(ncclConfig_t, netName) + sizeof(copy.netName)) copy.netName = defaults.netName;
  if (copy.netName != nullptr) c.netName = copy.netName;
  c.config = copy;
}

ncclComm* childComm(const ncclComm& parent, int rank, int nranks, const ncclConfig_t* config) {
  auto* n = new ncclComm;
  n->rank = rank;
  n->nranks = nranks;
  n->device = parent.device;
  n->blocking = config == nullptr || config->blocking != 0;
  n->options = commOptions(config, parent.options);
  if (config != nullptr) {
    keepConfig(*n, config);
  } else {
    n->config = parent.config;  // as its options, a child without a config keeps the parent's
    n->netName = parent.netName;
  }
  return n;
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& commId, int rank,
                      const ncclConfig_t* config, const char* api) {
  return guarded(api, [&] {
    checkNotNull(out, "comm");
    checkRankCount(nranks);
    checkRankIn(rank, nranks, "rank");
    checkConfig(config);
    auto* c = new ncclComm;
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = config == nullptr || config->blocking != 0;
    c->options = commOptions(config);
    keepConfig(*c, config);
    if (cudaGetDevice(&c->device) != cudaSuccess) {
      delete c;
      throw ApiError{ncclUnhandledCudaError, "no current CUDA device"};
    }
    UniqueId id;
    std::memcpy(id.bytes.data(), commId.internal, UniqueId::kBytes);
    auto create = [id, rank, nranks] { return TcpBootstrap::create(id, rank, nranks); };
    *out = c;
    if (group.depth > 0) {  // the ranks of one thread meet at ncclGroupEnd
      c->deferred = true;
      group.inits.push_back([c, create] {
        c->deferred = false;
        (void)startInit(c, create);
      });
      return ncclSuccess;
    }
    const ncclResult_t r = startInit(c, create);
    checkReady(r);  // *out stays set: the comm holds the error, and ncclCommDestroy frees it
    return r;
  });
}

}  // namespace ferry::nccl

using namespace ferry;
using namespace ferry::nccl;

NCCL_API ncclResult_t ncclGetVersion(int* version) {
  return guarded("ncclGetVersion", [&] {
    checkNotNull(version, "version");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
  });
}

NCCL_API const char* ncclGetErrorString(ncclResult_t result) { return resultString(result); }

NCCL_API const char* ncclGetLastError(ncclComm_t) { return lastError(); }

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded("ncclGetUniqueId", [&] {
    checkNotNull(uniqueId, "uniqueId");
    const UniqueId id = UniqueId::create();
    static_assert(UniqueId::kBytes == NCCL_UNIQUE_ID_BYTES);
    std::memcpy(uniqueId->internal, id.bytes.data(), NCCL_UNIQUE_ID_BYTES);
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                             ncclConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", [&] {
    checkNotNull(comms, "comms");
    checkRankCount(ndev);
    std::vector<int> devices(static_cast<std::size_t>(ndev));
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    for (int i = 0; i < ndev; ++i) {
      devices[i] = devlist ? devlist[i] : i;
      checkRankIn(devices[i], count, devlist ? "devlist entry" : "device (ndev exceeds the GPUs)");
    }
    // Ranks of one process reach each other's cudaMalloc'd buffers only with peer access on. The
    // caller's current device is theirs: put it back.
    int callerDevice = 0;
    (void)cudaGetDevice(&callerDevice);
    for (int a : devices)
      for (int b : devices) {
        int can = 0;
        if (a == b || cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) continue;
        cudaSetDevice(a);
        if (cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess) (void)cudaGetLastError();  // already on
      }
    (void)cudaSetDevice(callerDevice);
    const UniqueId id = UniqueId::create();
    std::vector<ncclComm*> made(static_cast<std::size_t>(ndev));
    std::vector<std::thread> threads;
    for (int i = 0; i < ndev; ++i) {
      made[i] = new ncclComm;
      made[i]->rank = i;
      made[i]->nranks = ndev;
      made[i]->device = devices[i];
      threads.emplace_back(
          [&, i] { (void)startInit(made[i], [&, i] { return TcpBootstrap::create(id, i, ndev); }); });
    }
    for (auto& t : threads) t.join();
    ncclResult_t result = ncclSuccess;
    std::string why;
    for (int i = 0; i < ndev; ++i) {
      comms[i] = made[i];
      if (made[i]->initResult != ncclSuccess && result == ncclSuccess) {
        result = made[i]->initResult;
        why = "rank " + std::to_string(i) + ": " + made[i]->initError;
      }
    }
    if (result != ncclSuccess) throw ApiError{result, why};
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  return guarded("ncclCommSplit", [&] {
    ncclComm& c = usable(comm);
    checkNotNull(newcomm, "newcomm");
    checkConfig(config);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      throw ApiError{ncclInvalidArgument,
                     "color " + std::to_string(color) + " must be >= 0 or NCCL_SPLIT_NOCOLOR"};
    auto sub = c.bootstrap->split(color, key);  // collective over comm's ranks
    *newcomm = nullptr;
    if (!sub) return ncclSuccess;
    ncclComm* n = childComm(c, sub->rank(), sub->size(), config);
    *newcomm = n;
    const ncclResult_t r = startInit(n, [sub] { return sub; });
    checkReady(r);
    return r;
  });
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guarded("ncclCommFinalize", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c)) return realResult(c, real->commFinalize(c.real));
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(c.device);
    const cudaError_t err = cudaDeviceSynchronize();  // every call queued on the comm has ended
    cudaSetDevice(previous);
    if (err != cudaSuccess)
      throw ApiError{ncclUnhandledCudaError, std::string("a queued call failed: ") + cudaGetErrorString(err)};
    return ncclSuccess;
  });
}

namespace {

// Frees the comm; `abort`: without waiting for its queued kernels (see ncclCommAbort).
ncclResult_t release(ncclComm_t comm, bool abort, const char* api) {
  return guarded(api, [&] {
    if (comm == nullptr) return ncclSuccess;
    if (comm->magic != ncclComm::kAlive)
      throw ApiError{ncclInvalidArgument, "comm is not a live communicator (destroyed twice?)"};
    if (comm->initThread.joinable()) comm->initThread.join();
    comm->magic = 0;
    if (comm->real != nullptr)
      (abort ? comm->forwardedTo->commAbort : comm->forwardedTo->commDestroy)(comm->real);
    if (abort) {
      comm->state = ncclComm::State::Aborted;
      // Every rank's kernels of this comm stop waiting and finish, so destroying it (which waits
      // for them) returns at once; the peers see ncclRemoteError from ncclCommGetAsyncError.
      if (comm->comm) comm->comm->abort();
    }
    delete comm;
    return ncclSuccess;
  });
}

}  // namespace

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, false, "ncclCommDestroy"); }
NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, true, "ncclCommAbort"); }

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded("ncclCommGetAsyncError", [&] {
    checkNotNull(comm, "comm");
    checkNotNull(asyncError, "asyncError");
    if (comm->magic != ncclComm::kAlive)
      throw ApiError{ncclInvalidArgument, "comm is not a live communicator"};
    if (comm->state.load() == ncclComm::State::Ready && comm->real != nullptr)
      return realResult(*comm, comm->forwardedTo->commGetAsyncError(comm->real, asyncError));
    switch (comm->state.load()) {
      case ncclComm::State::Running: *asyncError = ncclInProgress; break;
      case ncclComm::State::Failed: *asyncError = comm->initResult; break;
      default: *asyncError = comm->comm && comm->comm->aborted() ? ncclRemoteError : ncclSuccess; break;
    }
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", [&] {
    checkNotNull(count, "count");
    *count = usable(comm).nranks;
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", [&] {
    checkNotNull(device, "device");
    *device = usable(comm).device;
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", [&] {
    checkNotNull(rank, "rank");
    *rank = usable(comm).rank;
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guarded("ncclCommRegister", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->commRegister(c.real, buff, size, handle));
    checkNotNull(buff, "buff");
    checkNotNull(handle, "handle");
    if (size == 0) throw ApiError{ncclInvalidArgument, "size is 0"};
    const BufferRegistration reg = c.comm->registerBuffer(buff, size);  // collective
    std::lock_guard lock(c.mu);
    c.registrations[reg.id] = reg;
    *handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(reg.id));
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guarded("ncclCommDeregister", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c)) return realResult(c, real->commDeregister(c.real, handle));
    BufferRegistration reg;
    {
      std::lock_guard lock(c.mu);
      auto it = c.registrations.find(reinterpret_cast<std::uintptr_t>(handle));
      if (it == c.registrations.end())
        throw ApiError{ncclInvalidArgument, "handle was not returned by ncclCommRegister on this comm"};
      reg = it->second;
      c.registrations.erase(it);
    }
    c.comm->deregisterBuffer(reg);
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", [&] {
    checkNotNull(ptr, "ptr");
    if (size == 0) throw ApiError{ncclInvalidArgument, "size is 0"};
    std::shared_ptr<void> mem = gpuAlloc(size);  // cuMem: exportable to peers without legacy IPC
    std::lock_guard lock(memMu);
    *ptr = mem.get();
    memAllocations().emplace(mem.get(), std::move(mem));
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  return guarded("ncclMemFree", [&] {
    if (ptr == nullptr) return ncclSuccess;
    std::lock_guard lock(memMu);
    if (memAllocations().erase(ptr) == 0)
      throw ApiError{ncclInvalidArgument, "ptr was not returned by ncclMemAlloc (or was freed already)"};
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  return guarded("ncclRedOpCreatePreMulSum", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->redOpCreatePreMulSum(op, scalar, datatype, residence, c.real));
    checkNotNull(op, "op");
    checkNotNull(scalar, "scalar");
    checkDataType(datatype);
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
      throw ApiError{ncclInvalidArgument,
                     "residence " + std::to_string(residence) + " is not an ncclScalarResidence_t"};
    PreMulSumOp p{datatype, residence};
    if (residence == ncclScalarHostImmediate)
      std::memcpy(&p.hostScalar, scalar, elementBytes(datatype));
    else
      p.deviceScalar = scalar;
    std::lock_guard lock(c.mu);
    const int id = c.nextOp++;
    c.ops.emplace(id, p);
    *op = static_cast<ncclRedOp_t>(id);
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guarded("ncclRedOpDestroy", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c)) return realResult(c, real->redOpDestroy(op, c.real));
    if (static_cast<int>(op) >= 0 && op < ncclNumOps)
      throw ApiError{ncclInvalidArgument, "op " + std::to_string(op) +
                                              " is built in; only ops of "
                                              "ncclRedOpCreatePreMulSum are destroyed"};
    std::lock_guard lock(c.mu);
    auto it = c.ops.find(static_cast<int>(op));
    if (it == c.ops.end())
      throw ApiError{ncclInvalidArgument, "op " + std::to_string(op) + " is not an op of this comm"};
    c.ops.erase(it);
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclBroadcast", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->broadcast(sendbuff, recvbuff, count, datatype, root, c.real, stream));
    checkDataType(datatype);
    checkRankIn(root, c.nranks, "root");
    checkCount(count, datatype);
    const CallCost cost{Collective::Broadcast, count * elementBytes(datatype), nativeType(datatype)};
    return nativeCall(c, "ncclBroadcast", cost, [=, &c] {
      return onBuffers(c, stream, count, sendbuff, c.rank == root, recvbuff, true, [&] {
        c.comm->broadcast(c.rank == root ? sendbuff : nullptr, recvbuff, count, nativeType(datatype), root,
                          stream);
        return ncclSuccess;
      });
    });
  });
}

NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

namespace {

// allReduce, reduceScatter and reduce: `native` gets a ferry::ReduceOp for a built-in op, a
// ferry::PreMulSum for one made by ncclRedOpCreatePreMulSum.
template <class Native>
ncclResult_t reducing(ncclComm& c, ncclRedOp_t op, ncclDataType_t datatype, Native&& native) {
  if (op < ncclNumOps) {
    native(nativeOp(op));
    return ncclSuccess;
  }
  const PreMulSumOp p = preMulOp(c, op, datatype);
  const bool onDevice = p.residence == ncclScalarDevice;
  native(ferry::PreMulSum{onDevice ? p.deviceScalar : static_cast<const void*>(&p.hostScalar), onDevice});
  return ncclSuccess;
}

}  // namespace

NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclReduce", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->reduce(sendbuff, recvbuff, count, datatype, op, root, c.real, stream));
    checkDataType(datatype);
    checkOp(c, op);
    checkRankIn(root, c.nranks, "root");
    checkCount(count, datatype);
    const CallCost cost{Collective::Reduce, count * elementBytes(datatype), nativeType(datatype)};
    return nativeCall(c, "ncclReduce", cost, [=, &c] {
      return onBuffers(c, stream, count, sendbuff, true, recvbuff, c.rank == root, [&] {
        return reducing(c, op, datatype, [&](const auto& o) {
          c.comm->reduce(sendbuff, c.rank == root ? recvbuff : nullptr, count, nativeType(datatype), o, root,
                         stream);
        });
      });
    });
  });
}

NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  return guarded("ncclAllReduce", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->allReduce(sendbuff, recvbuff, count, datatype, op, c.real, stream));
    checkDataType(datatype);
    checkOp(c, op);
    checkCount(count, datatype);
    const CallCost cost{Collective::AllReduce, count * elementBytes(datatype), nativeType(datatype)};
    return nativeCall(c, "ncclAllReduce", cost, [=, &c] {
      return onBuffers(c, stream, count, sendbuff, true, recvbuff, true, [&] {
        return reducing(c, op, datatype, [&](const auto& o) {
          c.comm->allReduce(sendbuff, recvbuff, count, nativeType(datatype), o, stream);
        });
      });
    });
  });
}

NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  return guarded("ncclReduceScatter", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->reduceScatter(sendbuff, recvbuff, recvcount, datatype, op, c.real, stream));
    checkDataType(datatype);
    checkOp(c, op);
    checkCount(recvcount, datatype, static_cast<std::size_t>(c.nranks));
    const CallCost cost{Collective::ReduceScatter, recvcount * elementBytes(datatype) * c.nranks, nativeType(datatype)};
    return nativeCall(c, "ncclReduceScatter", cost, [=, &c] {
      return onBuffers(c, stream, recvcount, sendbuff, true, recvbuff, true, [&] {
        return reducing(c, op, datatype, [&](const auto& o) {
          c.comm->reduceScatter(sendbuff, recvbuff, recvcount, nativeType(datatype), o, stream);
        });
      });
    });
  });
}

NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclAllGather", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, real->allGather(sendbuff, recvbuff, sendcount, datatype, c.real, stream));
    checkDataType(datatype);
    checkCount(sendcount, datatype, static_cast<std::size_t>(c.nranks));
    const CallCost cost{Collective::AllGather, sendcount * elementBytes(datatype) * c.nranks, nativeType(datatype)};
    return nativeCall(c, "ncclAllGather", cost, [=, &c] {
      return onBuffers(c, stream, sendcount, sendbuff, true, recvbuff, true, [&] {
        c.comm->allGather(sendbuff, recvbuff, sendcount, nativeType(datatype), stream);
        return ncclSuccess;
      });
    });
  });
}

namespace {

// NCCL's own all-to-all is recent, so a forwarded one is the grouped sends and recvs NCCL documents.
ncclResult_t realAllToAll(ncclComm& c, const RealNccl& real, const void* sendbuff, void* recvbuff,
                          size_t count, ncclDataType_t datatype, cudaStream_t stream) {
  if (sendbuff == recvbuff)
    throw ApiError{ncclInvalidUsage,
                   "in-place all-to-all runs only natively; this communicator is forwarded to "
                   "the real NCCL, which takes it as grouped sends and recvs: use two buffers"};
  const std::size_t bytes = count * elementBytes(datatype);
  realResult(c, real.groupStart());
  for (int p = 0; p < c.nranks; ++p) {
    const auto at = static_cast<std::size_t>(p) * bytes;
    realResult(c, real.send(static_cast<const char*>(sendbuff) + at, count, datatype, p, c.real, stream));
    realResult(c, real.recv(static_cast<char*>(recvbuff) + at, count, datatype, p, c.real, stream));
  }
  return realResult(c, real.groupEnd());
}

}  // namespace

NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclAlltoAll", [&] {
    ncclComm& c = usable(comm);
    checkDataType(datatype);
    checkCount(count, datatype, static_cast<std::size_t>(c.nranks));
    if (const RealNccl* real = forwarded(c)) {
      checkBuffers(c, stream, count, sendbuff, true, recvbuff, true);  // NCCL sees sends and recvs only
      return realAllToAll(c, *real, sendbuff, recvbuff, count, datatype, stream);
    }
    const CallCost cost{Collective::AllToAll, count * elementBytes(datatype) * c.nranks, nativeType(datatype)};
    return nativeCall(c, "ncclAlltoAll", cost, [=, &c] {
      return onBuffers(c, stream, count, sendbuff, true, recvbuff, true, [&] {
        c.comm->allToAll(sendbuff, recvbuff, count, nativeType(datatype), stream);
        return ncclSuccess;
      });
    });
  });
}

namespace {

ncclResult_t peerOp(bool isSend, const void* buff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream) {
  return guarded(isSend ? "ncclSend" : "ncclRecv", [&] {
    ncclComm& c = usable(comm);
    if (const RealNccl* real = forwarded(c))
      return realResult(c, isSend
                               ? real->send(buff, count, datatype, peer, c.real, stream)
                               : real->recv(const_cast<void*>(buff), count, datatype, peer, c.real, stream));
    checkDataType(datatype);
    checkRankIn(peer, c.nranks, "peer");
    checkCount(count, datatype);
    auto queue = [=, &c] {
      return onBuffers(c, stream, count, buff, isSend, buff, !isSend, [&] {
        if (isSend)
          c.comm->send(buff, count, nativeType(datatype), peer, stream);
        else
          c.comm->recv(const_cast<void*>(buff), count, nativeType(datatype), peer, stream);
        return ncclSuccess;
      });
    };
    if (group.depth == 0) return queue();
    // In a group: at its end, inside one ferry group per comm (one kernel for its sends and recvs).
    const CallCost cost{std::nullopt, isSend ? count * elementBytes(datatype) : 0, nativeType(datatype)};
    group.calls.push_back({&c, isSend ? "ncclSend" : "ncclRecv", cost, true,
                           [queue, &c](std::vector<ncclComm*>& openP2P) {
                             if (std::find(openP2P.begin(), openP2P.end(), &c) == openP2P.end()) {
                               c.comm->groupStart();
                               openP2P.push_back(&c);
                             }
                             return queue();
                           }});
    return ncclSuccess;
  });
}

}  // namespace

NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  return peerOp(true, sendbuff, count, datatype, peer, comm, stream);
}

NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  return peerOp(false, recvbuff, count, datatype, peer, comm, stream);
}

NCCL_API ncclResult_t ncclGroupStart(void) {
  ++group.depth;
  return ncclSuccess;
}

namespace {

// Closes the thread's outermost group: `depth` back to 0 and what it collected handed over, its
// deferred inits done (the ranks of one thread meet here, all at once).
GroupState closeGroup(const char* api) {
  if (group.depth == 0) throw ApiError{ncclInvalidUsage, std::string(api) + " without a matching ncclGroupStart"};
  GroupState done = std::move(group);
  group = GroupState{};
  std::vector<std::thread> threads;
  for (auto& init : done.inits) threads.emplace_back(init);
  for (auto& t : threads) t.join();
  return done;
}

// The first failure of a group's end: its result, and why.
struct FirstError {
  ncclResult_t result = ncclSuccess;
  std::string why;
  void note(ncclResult_t r, const std::string& message) {
    if (r != ncclSuccess && r != ncclInProgress && result == ncclSuccess) {
      result = r;
      why = message;
    }
  }
};

}  // namespace

NCCL_API ncclResult_t ncclGroupEnd(void) {
  return guarded("ncclGroupEnd", [&] {
    if (group.depth > 1) {
      --group.depth;
      return ncclSuccess;
    }
    GroupState done = closeGroup("ncclGroupEnd");
    // The native calls in the order they were made; the sends and receives of each comm collect in
    // one ferry group, queued as one kernel when it closes.
    FirstError first;
    std::vector<ncclComm*> openP2P;
    for (DeferredCall& call : done.calls) {
      const ncclResult_t r = guarded(call.api, [&] { return call.run(openP2P); });
      first.note(r, lastError());
    }
    for (ncclComm* c : openP2P) {
      const ncclResult_t r = guarded("ncclGroupEnd", [&] {
        c->comm->groupEnd();
        return ncclSuccess;
      });
      first.note(r, lastError());
    }
    if (done.realGroup != nullptr) {
      const ncclResult_t r = done.realGroup->groupEnd();
      first.note(r, std::string("the real NCCL's ncclGroupEnd: ") + done.realGroup->getLastError(nullptr));
    }
    if (first.result != ncclSuccess) throw ApiError{first.result, first.why};
    return ncclSuccess;
  });
}

// As NCCL: the outermost group's work is planned, its time estimated and dropped (nothing runs;
// its communicators made in the group are made). ferry's estimate (estimate.hpp) adds up each
// comm's calls, by the algorithm its selector would pick, and takes the slowest comm; a group
// with forwarded calls asks the real NCCL for their estimate (ncclGroupSimulateEnd, NCCL >= 2.22).
NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return guarded("ncclGroupSimulateEnd", [&] {
    checkNotNull(simInfo, "simInfo");
    if (simInfo->magic != 0x74685283 || simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))
      throw ApiError{ncclInvalidArgument, "simInfo was not set up with NCCL_SIM_INFO_INITIALIZER"};
    if (group.depth > 1)
      throw ApiError{ncclInvalidUsage, "ncclGroupSimulateEnd must end the outermost group (depth " +
                                           std::to_string(group.depth) + "); end the inner ones with ncclGroupEnd"};
    GroupState done = closeGroup("ncclGroupSimulateEnd");
    std::map<ncclComm*, double> perComm;
    std::map<ncclComm*, std::size_t> p2pBytes;
    for (const DeferredCall& call : done.calls) {
      if (call.p2p) {
        p2pBytes[call.comm] += call.cost.bytes;
        continue;
      }
      const std::string algorithm =
          call.comm->comm->algorithmFor(*call.cost.collective, call.cost.bytes, call.cost.type);
      perComm[call.comm] += estimateMicroseconds(call.cost, algorithm, call.comm->nranks);
    }
    for (const auto& [c, bytes] : p2pBytes) perComm[c] += estimateMicroseconds({std::nullopt, bytes, DataType::Uint8}, "p2p", c->nranks);
    double slowest = 0;
    for (const auto& [c, us] : perComm) slowest = std::max(slowest, us);
    if (done.realGroup != nullptr) {
      if (done.realGroup->groupSimulateEnd == nullptr)
        throw ApiError{ncclInvalidUsage, "the group holds calls forwarded to the real NCCL (" + done.realGroup->path +
                                             "), which has no ncclGroupSimulateEnd"};
      ncclSimInfo_t real = NCCL_SIM_INFO_INITIALIZER;
      const ncclResult_t r = done.realGroup->groupSimulateEnd(&real);
      if (r != ncclSuccess)
        throw ApiError{r, std::string("the real NCCL's ncclGroupSimulateEnd: ") + done.realGroup->getLastError(nullptr)};
      slowest = std::max(slowest, static_cast<double>(real.estimatedTime));
    }
    simInfo->estimatedTime = static_cast<float>(slowest);
    return ncclSuccess;
  });
}
