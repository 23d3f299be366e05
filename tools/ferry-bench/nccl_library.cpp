#include "nccl_library.hpp"

#include <dlfcn.h>

#include <cstring>
#include <stdexcept>

#include "ferry/datatype.hpp"
#include "nccl_table.hpp"

namespace ferry::tools {

namespace {
// ferry's DataType and ReduceOp values are NCCL's (ferry/datatype.hpp).
ncclDataType_t ncclType(int type) { return static_cast<ncclDataType_t>(type); }
ncclRedOp_t ncclOp(int op) { return static_cast<ncclRedOp_t>(op); }
ncclComm_t asComm(void* comm) { return static_cast<ncclComm_t>(comm); }
}  // namespace

std::unique_ptr<NcclLibrary> NcclLibrary::load(const std::string& path, std::string& why) {
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace.
  auto table = nccl::openNccl(path, RTLD_NOW | RTLD_LOCAL, why);
  if (!table) return nullptr;
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary);
  lib->api_ = std::move(table);
  lib->version_ = lib->api_->version;
  return lib;
}

NcclLibrary::~NcclLibrary() {
  if (comm_) api_->commDestroy(asComm(comm_));
  // The handle stays open: NCCL's own threads may still run code of the library at exit.
}

std::string NcclLibrary::versionString() const {
  const int major = version_ / 10000, minor = version_ / 100 % 100, patch = version_ % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void NcclLibrary::check(int result, const char* call) const {
  if (result != 0)
    throw std::runtime_error(std::string("NCCL ") + call + " failed: " +
                             api_->getErrorString(static_cast<ncclResult_t>(result)));
}

NcclUniqueId NcclLibrary::uniqueId() const {
  static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId));
  ncclUniqueId id{};
  check(api_->getUniqueId(&id), "ncclGetUniqueId");
  NcclUniqueId out{};
  std::memcpy(out.internal, id.internal, sizeof(out.internal));
  return out;
}

void NcclLibrary::initComm(const NcclUniqueId& id, int rank, int worldSize) {
  ncclUniqueId nid{};
  std::memcpy(nid.internal, id.internal, sizeof(nid.internal));
  ncclComm_t comm = nullptr;
  check(api_->commInitRank(&comm, worldSize, nid, rank), "ncclCommInitRank");
  comm_ = comm;
  worldSize_ = worldSize;
}

void NcclLibrary::allReduce(const void* send, void* recv, std::size_t count, int type, int op,
                            cudaStream_t s) const {
  check(api_->allReduce(send, recv, count, ncclType(type), ncclOp(op), asComm(comm_), s), "ncclAllReduce");
}
void NcclLibrary::allGather(const void* send, void* recv, std::size_t sendCount, int type,
                            cudaStream_t s) const {
  check(api_->allGather(send, recv, sendCount, ncclType(type), asComm(comm_), s), "ncclAllGather");
}
void NcclLibrary::reduceScatter(const void* send, void* recv, std::size_t recvCount, int type, int op,
                                cudaStream_t s) const {
  check(api_->reduceScatter(send, recv, recvCount, ncclType(type), ncclOp(op), asComm(comm_), s),
        "ncclReduceScatter");
}
void NcclLibrary::broadcast(const void* send, void* recv, std::size_t count, int type, int root,
                            cudaStream_t s) const {
  check(api_->broadcast(send, recv, count, ncclType(type), root, asComm(comm_), s), "ncclBroadcast");
}
void NcclLibrary::reduce(const void* send, void* recv, std::size_t count, int type, int op, int root,
                         cudaStream_t s) const {
  check(api_->reduce(send, recv, count, ncclType(type), ncclOp(op), root, asComm(comm_), s), "ncclReduce");
}
void NcclLibrary::allToAll(const void* send, void* recv, std::size_t count, int type, cudaStream_t s) const {
  const std::size_t bytes = count * sizeOf(static_cast<DataType>(type));
  check(api_->groupStart(), "ncclGroupStart");
  for (int p = 0; p < worldSize_; ++p) {
    check(api_->send(static_cast<const char*>(send) + p * bytes, count, ncclType(type), p, asComm(comm_), s),
          "ncclSend");
    check(api_->recv(static_cast<char*>(recv) + p * bytes, count, ncclType(type), p, asComm(comm_), s), "ncclRecv");
  }
  check(api_->groupEnd(), "ncclGroupEnd");
}
void NcclLibrary::sendRecv(const void* send, void* recv, std::size_t count, int type, int sendPeer,
                           int recvPeer, cudaStream_t s) const {
  check(api_->groupStart(), "ncclGroupStart");
  check(api_->send(send, count, ncclType(type), sendPeer, asComm(comm_), s), "ncclSend");
  check(api_->recv(recv, count, ncclType(type), recvPeer, asComm(comm_), s), "ncclRecv");
  check(api_->groupEnd(), "ncclGroupEnd");
}

void* NcclLibrary::memAlloc(std::size_t bytes) const {
  if (api_->memAlloc == nullptr || api_->memFree == nullptr)
    throw std::runtime_error(api_->path + " lacks ncclMemAlloc/ncclMemFree (NCCL >= 2.19)");
  void* ptr = nullptr;
  check(api_->memAlloc(&ptr, bytes), "ncclMemAlloc");
  return ptr;
}
void NcclLibrary::memFree(void* ptr) const noexcept {
  if (ptr != nullptr && api_->memFree != nullptr) api_->memFree(ptr);
}
void* NcclLibrary::registerBuffer(void* ptr, std::size_t bytes) const {
  void* handle = nullptr;
  check(api_->commRegister(asComm(comm_), ptr, bytes, &handle), "ncclCommRegister");
  return handle;
}
void NcclLibrary::deregisterBuffer(void* handle) const noexcept {
  if (handle != nullptr) api_->commDeregister(asComm(comm_), handle);
}
bool NcclLibrary::hasWindows() const {
  return api_->commWindowRegister != nullptr && api_->commWindowDeregister != nullptr;
}
void* NcclLibrary::registerWindow(void* ptr, std::size_t bytes) const {
  if (!hasWindows()) throw std::runtime_error(api_->path + " lacks ncclCommWindowRegister (NCCL >= 2.27)");
  ncclWindow_t window = nullptr;
  check(api_->commWindowRegister(asComm(comm_), ptr, bytes, &window, NCCL_WIN_COLL_SYMMETRIC),
        "ncclCommWindowRegister");
  return window;
}
void NcclLibrary::deregisterWindow(void* window) const noexcept {
  if (window != nullptr) api_->commWindowDeregister(asComm(comm_), static_cast<ncclWindow_t>(window));
}

}  // namespace ferry::tools
