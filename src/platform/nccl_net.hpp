#pragma once
// NVIDIA's NCCL as the network under a Comm across hosts (docs/multi-node.md, "The cross-host phase
// on NCCL's network"): the few functions its partners call, from the library FERRY_NCCL_FALLBACK
// names (default libnccl.so.2), opened at run time so that libferry.so needs no NCCL to start. The
// types are NCCL's ABI: a communicator is a pointer, a unique id 128 bytes passed by value, a result
// an int (0: success; 7: in progress).
//
//   std::string why;
//   const ferry::nccl_net::Library* nccl = ferry::nccl_net::library(why);
//   if (!nccl) ... why names the file and what it lacks
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace ferry::nccl_net {

struct UniqueId {
  char internal[128];
};
using Comm = void*;

inline constexpr int kSuccess = 0;
inline constexpr int kInProgress = 7;
inline constexpr int kInt8 = 0;  // ncclInt8: bytes

struct Library {
  int (*getVersion)(int*) = nullptr;
  int (*getUniqueId)(UniqueId*) = nullptr;
  const char* (*getErrorString)(int) = nullptr;
  const char* (*getLastError)(Comm) = nullptr;
  int (*commInitRank)(Comm*, int, UniqueId, int) = nullptr;
  int (*commDestroy)(Comm) = nullptr;
  int (*commAbort)(Comm) = nullptr;
  int (*commGetAsyncError)(Comm, int*) = nullptr;
  int (*send)(const void*, std::size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*recv)(void*, std::size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;

  std::string path;
  int version = 0;  // ncclGetVersion's code, e.g. 22809
};

// The process's NCCL, opened on first use (dlopen with its symbols kept apart from ferry's, which
// a preloaded libferry_nccl.so also defines; a file that is ferry's own library is refused) and
// kept open until the process ends; nullptr with `why` when it cannot be. Before it opens, NVLink
// multicast is turned off in it (NCCL_NVLS_ENABLE=0) unless ferry allows it (architecture.md
// rule 1), and NCCL_HOSTID, when unset, takes FERRY_HOSTID: the hosts ferry sees are NCCL's.
const Library* library(std::string& why);

// What every NVIDIA NCCL that ferry opens runs with (here, and libferry_nccl's fallback): NVLink
// multicast off (NCCL_NVLS_ENABLE=0) unless ferry allows it (architecture.md rule 1), and its
// warnings on, without which ncclGetLastError says nothing (a level the user set stays). Call it
// before dlopen.
void prepareEnvironment();

// "NCCL <version>: <what>: <its error string> (<its last error>)", for errors.
std::string describe(const Library& nccl, Comm comm, const std::string& what, int result);

}  // namespace ferry::nccl_net
