#pragma once
// Every argument check of the NCCL API, in one place. Each throws ApiError naming the argument and
// the rule it broke; the API functions add their own name in front (results.hpp).
#include <cstddef>

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
// ncclInvalidArgument when config is malformed (wrong magic, or blocking not 0, 1 or undefined).
void checkConfig(const ncclConfig_t* config);
// minCTAs / maxCTAs of a checked config as ferry's block bounds (0 where unset); `inherited` when
// config is NULL (a split keeps its parent's).
CommOptions commOptions(const ncclConfig_t* config, const CommOptions& inherited = {});
// Bytes of one element; 0 for a type out of range.
std::size_t elementBytes(ncclDataType_t type);
const char* dataTypeName(ncclDataType_t type);

}  // namespace ferry::nccl
