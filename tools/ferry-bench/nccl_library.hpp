#pragma once
// NCCL loaded at run time (dlopen, no link-time dependency, through the NCCL library's table:
// shims/nccl/nccl_table.hpp), so that ferry-bench can time NCCL on the same buffers in the same run.
// Only what the benchmark calls. ferry's DataType and ReduceOp values are NCCL's, so they pass
// through unchanged.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace ferry::nccl {
struct NcclTable;
}

namespace ferry::tools {

struct NcclUniqueId {
  char internal[128];
};

class NcclLibrary {
 public:
  // nullptr (and why in `why`) when the library cannot be loaded or lacks a symbol. path: a file
  // name or path for dlopen; "libnccl.so.2" finds the system's.
  static std::unique_ptr<NcclLibrary> load(const std::string& path, std::string& why);
  ~NcclLibrary();

  int version() const { return version_; }  // e.g. 22803
  std::string versionString() const;

  NcclUniqueId uniqueId() const;
  // Collective: every rank calls it with rank 0's id.
  void initComm(const NcclUniqueId& id, int rank, int worldSize);

  void allReduce(const void* send, void* recv, std::size_t count, int type, int op, cudaStream_t s) const;
  void allGather(const void* send, void* recv, std::size_t sendCount, int type, cudaStream_t s) const;
  void reduceScatter(const void* send, void* recv, std::size_t recvCount, int type, int op,
                     cudaStream_t s) const;
  // As nccl-tests does it: grouped send/recv with every peer.
  void allToAll(const void* send, void* recv, std::size_t count, int type, cudaStream_t s) const;
  // As nccl-tests' sendrecv_perf does it: in one group, `count` elements from send to rank sendPeer
  // and `count` from rank recvPeer into recv.
  void sendRecv(const void* send, void* recv, std::size_t count, int type, int sendPeer, int recvPeer,
                cudaStream_t s) const;
  void broadcast(const void* send, void* recv, std::size_t count, int type, int root, cudaStream_t s) const;
  void reduce(const void* send, void* recv, std::size_t count, int type, int op, int root,
              cudaStream_t s) const;

  // What NCCL's fastest paths ask of the caller's memory (nccl-tests -R 1 and -R 2 do the same).
  // Memory from ncclMemAlloc (cuMem, which peers can map); throws when the library lacks it.
  void* memAlloc(std::size_t bytes) const;
  void memFree(void* ptr) const noexcept;
  // ncclCommRegister: NCCL may then read and write the buffer in place (zero-copy). The handle is
  // for deregisterBuffer.
  void* registerBuffer(void* ptr, std::size_t bytes) const;
  void deregisterBuffer(void* handle) const noexcept;
  // ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC (NCCL >= 2.27): every rank registers a buffer
  // of the same size, in the same order, and NCCL may run its symmetric kernels on it. Collective.
  bool hasWindows() const;
  void* registerWindow(void* ptr, std::size_t bytes) const;
  void deregisterWindow(void* window) const noexcept;

 private:
  NcclLibrary() = default;
  void check(int result, const char* call) const;
  std::unique_ptr<nccl::NcclTable> api_;
  void* comm_ = nullptr;
  int version_ = 0;
  int worldSize_ = 0;
};

}  // namespace ferry::tools
