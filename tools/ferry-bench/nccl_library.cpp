#include "nccl_library.hpp"

#include <dlfcn.h>

#include <stdexcept>

#include "ferry/datatype.hpp"

namespace ferry::tools {

using Comm = void*;
using Result = int;

struct NcclLibrary::Api {
  Result (*getVersion)(int*);
  Result (*getUniqueId)(NcclUniqueId*);
  Result (*commInitRank)(Comm*, int, NcclUniqueId, int);
  Result (*commDestroy)(Comm);
  const char* (*getErrorString)(Result);
  Result (*allReduce)(const void*, void*, std::size_t, int, int, Comm, cudaStream_t);
  Result (*allGather)(const void*, void*, std::size_t, int, Comm, cudaStream_t);
  Result (*reduceScatter)(const void*, void*, std::size_t, int, int, Comm, cudaStream_t);
  Result (*broadcast)(const void*, void*, std::size_t, int, int, Comm, cudaStream_t);
  Result (*reduce)(const void*, void*, std::size_t, int, int, int, Comm, cudaStream_t);
  Result (*send)(const void*, std::size_t, int, int, Comm, cudaStream_t);
  Result (*recv)(void*, std::size_t, int, int, Comm, cudaStream_t);
  Result (*groupStart)();
  Result (*groupEnd)();
};

std::unique_ptr<NcclLibrary> NcclLibrary::load(const std::string& path, std::string& why) {
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace.
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    why = e ? e : ("cannot load " + path);
    return nullptr;
  }
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary);
  lib->handle_ = h;
  lib->api_ = std::make_unique<Api>();
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
    if (!fn) {
      why = path + " has no " + name;
      ok = false;
    }
  };
  Api& a = *lib->api_;
  get(a.getVersion, "ncclGetVersion");
  get(a.getUniqueId, "ncclGetUniqueId");
  get(a.commInitRank, "ncclCommInitRank");
  get(a.commDestroy, "ncclCommDestroy");
  get(a.getErrorString, "ncclGetErrorString");
  get(a.allReduce, "ncclAllReduce");
  get(a.allGather, "ncclAllGather");
  get(a.reduceScatter, "ncclReduceScatter");
  get(a.broadcast, "ncclBroadcast");
  get(a.reduce, "ncclReduce");
  get(a.send, "ncclSend");
  get(a.recv, "ncclRecv");
  get(a.groupStart, "ncclGroupStart");
  get(a.groupEnd, "ncclGroupEnd");
  if (!ok) return nullptr;  // the destructor closes the handle
  a.getVersion(&lib->version_);
  return lib;
}

NcclLibrary::~NcclLibrary() {
  if (comm_) api_->commDestroy(comm_);
  // The handle stays open: NCCL's own threads may still run code of the library at exit.
}

std::string NcclLibrary::versionString() const {
  const int major = version_ / 10000, minor = version_ / 100 % 100, patch = version_ % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void NcclLibrary::check(int result, const char* call) const {
  if (result != 0)
    throw std::runtime_error(std::string("NCCL ") + call + " failed: " + api_->getErrorString(result));
}

NcclUniqueId NcclLibrary::uniqueId() const {
  NcclUniqueId id{};
  check(api_->getUniqueId(&id), "ncclGetUniqueId");
  return id;
}

void NcclLibrary::initComm(const NcclUniqueId& id, int rank, int worldSize) {
  check(api_->commInitRank(&comm_, worldSize, id, rank), "ncclCommInitRank");
  worldSize_ = worldSize;
}

void NcclLibrary::allReduce(const void* send, void* recv, std::size_t count, int type, int op,
                            cudaStream_t s) const {
  check(api_->allReduce(send, recv, count, type, op, comm_, s), "ncclAllReduce");
}
void NcclLibrary::allGather(const void* send, void* recv, std::size_t sendCount, int type,
                            cudaStream_t s) const {
  check(api_->allGather(send, recv, sendCount, type, comm_, s), "ncclAllGather");
}
void NcclLibrary::reduceScatter(const void* send, void* recv, std::size_t recvCount, int type, int op,
                                cudaStream_t s) const {
  check(api_->reduceScatter(send, recv, recvCount, type, op, comm_, s), "ncclReduceScatter");
}
void NcclLibrary::broadcast(const void* send, void* recv, std::size_t count, int type, int root,
                            cudaStream_t s) const {
  check(api_->broadcast(send, recv, count, type, root, comm_, s), "ncclBroadcast");
}
void NcclLibrary::reduce(const void* send, void* recv, std::size_t count, int type, int op, int root,
                         cudaStream_t s) const {
  check(api_->reduce(send, recv, count, type, op, root, comm_, s), "ncclReduce");
}
void NcclLibrary::allToAll(const void* send, void* recv, std::size_t count, int type, cudaStream_t s) const {
  const std::size_t bytes = count * sizeOf(static_cast<DataType>(type));
  check(api_->groupStart(), "ncclGroupStart");
  for (int p = 0; p < worldSize_; ++p) {
    check(api_->send(static_cast<const char*>(send) + p * bytes, count, type, p, comm_, s), "ncclSend");
    check(api_->recv(static_cast<char*>(recv) + p * bytes, count, type, p, comm_, s), "ncclRecv");
  }
  check(api_->groupEnd(), "ncclGroupEnd");
}
void NcclLibrary::sendRecv(const void* send, void* recv, std::size_t count, int type, int sendPeer,
                           int recvPeer, cudaStream_t s) const {
  check(api_->groupStart(), "ncclGroupStart");
  check(api_->send(send, count, type, sendPeer, comm_, s), "ncclSend");
  check(api_->recv(recv, count, type, recvPeer, comm_, s), "ncclRecv");
  check(api_->groupEnd(), "ncclGroupEnd");
}

}  // namespace ferry::tools
