#pragma once
// Every argument check of the NCCL API, in one place. Each throws ApiError naming the argument and
// the rule it broke; the API functions add their own name in front (results.hpp).
#include <cstddef>
#include <string>

#include "ferry/comm.hpp"
#include "nccl.h"
#include "results.hpp"

namespace ferry::nccl {

// ncclInvalidArgument: "<name> is NULL".
void checkNotNull(const void* p, const char* name);
// ncclInvalidArgument unless 0 <= type < ncclNumTypes.
void checkDataType(ncclDataType_t type);
// ncclInvalidArgument unless 1 <= nranks.
void checkRankCount(int nranks);
// ncclInvalidArgument unless 0 <= value < nranks; `name` is "rank", "root", "peer".
void checkRankIn(int value, int nranks, const char* name);
// ncclInvalidArgument when count elements of `type` (times `blocks`) do not fit in size_t.
void checkCount(std::size_t count, ncclDataType_t type, std::size_t blocks = 1);
// ncclInvalidArgument when a buffer is NULL while count > 0 (`name`: "sendbuff", "recvbuff").
void checkBuffer(const void* p, std::size_t count, const char* name);

// Where a buffer pointer points, as CUDA tells (pointerPlace).
struct PointerPlace {
  enum class Kind {
    Unknown,  // memory CUDA does not know: malloc'd or stack host memory, a freed or made-up address
    Host,     // host memory pinned by or registered with CUDA
    Device,   // device memory of `device` (cudaMalloc, cuMem, ncclMemAlloc)
    Managed,  // managed memory (cudaMallocManaged) of `device`
    Error,    // CUDA could not say (`error` tells why)
  };
  Kind kind = Kind::Unknown;
  int device = -1;
  std::string error;
};
// Asks CUDA (cudaPointerGetAttributes) where p points; an error it returns is cleared, not left
// for the caller's cudaGetLastError.
PointerPlace pointerPlace(const void* p);
// ncclInvalidArgument "<name> <p> is not a valid pointer: <what it is>; it must be device memory of
// the communicator's GPU <device>" unless `place` (of p) is device or managed memory of `device`.
void checkPointerPlace(const void* p, const PointerPlace& place, const char* name, int device);
// A call's buffer on the communicator's GPU `device`, as NCCL checks it with NCCL_CHECK_POINTERS=1:
// when count > 0, NULL (checkBuffer) and, unless `stream` is being captured (a capture must not
// see calls it could object to), a pointer that is not device memory of `device`
// (checkPointerPlace) are ncclInvalidArgument.
void checkDeviceBuffer(const void* p, std::size_t count, const char* name, int device, cudaStream_t stream);
// ncclInvalidArgument when config is malformed (wrong magic, or blocking not 0, 1 or undefined).
void checkConfig(const ncclConfig_t* config);
// minCTAs / maxCTAs of a checked config as ferry's block bounds (0 where unset); `inherited` when
// config is NULL (a split keeps its parent's).
CommOptions commOptions(const ncclConfig_t* config, const CommOptions& inherited = {});
// Bytes of one element; 0 for a type out of range.
std::size_t elementBytes(ncclDataType_t type);
const char* dataTypeName(ncclDataType_t type);

}  // namespace ferry::nccl
