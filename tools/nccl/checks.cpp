#include "checks.hpp"

#include <cstddef>
#include <limits>
#include <string>

namespace ferry::nccl {
namespace {

[[noreturn]] void invalid(const std::string& message) { throw ApiError{ncclInvalidArgument, message}; }

// The caller's structure reaches `field` (an older caller's is shorter: `size` says how much).
#define FERRY_CONFIG_HAS(config, field) \
  ((config)->size >= offsetof(ncclConfig_t, field) + sizeof((config)->field))

// A bound on the blocks the caller set (and its structure has).
bool hasMinCTAs(const ncclConfig_t* config) {
  return FERRY_CONFIG_HAS(config, minCTAs) && config->minCTAs != NCCL_CONFIG_UNDEF_INT;
}
bool hasMaxCTAs(const ncclConfig_t* config) {
  return FERRY_CONFIG_HAS(config, maxCTAs) && config->maxCTAs != NCCL_CONFIG_UNDEF_INT;
}

}  // namespace

std::size_t elementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    case ncclNumTypes: break;
  }
  return 0;
}

const char* dataTypeName(ncclDataType_t type) {
  static const char* const names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",
                                      "ncclInt64",   "ncclUint64",  "ncclFloat16",  "ncclFloat32",
                                      "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  const int t = static_cast<int>(type);
  return t >= 0 && t < ncclNumTypes ? names[t] : "(not a datatype)";
}

void checkNotNull(const void* p, const char* name) {
  if (p == nullptr) invalid(std::string(name) + " is NULL");
}

void checkDataType(ncclDataType_t type) {
  const int t = static_cast<int>(type);
  if (t < 0 || t >= ncclNumTypes)
    invalid("datatype " + std::to_string(t) + " is not an ncclDataType_t (0.." + std::to_string(ncclNumTypes - 1) + ")");
}

void checkRankCount(int nranks) {
  if (nranks < 1) invalid("nranks " + std::to_string(nranks) + " must be at least 1");
}

void checkRankIn(int value, int nranks, const char* name) {
  if (value < 0 || value >= nranks)
    invalid(std::string(name) + " " + std::to_string(value) + " is out of range [0, " + std::to_string(nranks) + ")");
}

void checkCount(std::size_t count, ncclDataType_t type, std::size_t blocks) {
  const std::size_t es = elementBytes(type);
  if (es != 0 && blocks != 0 && count > std::numeric_limits<std::size_t>::max() / es / blocks)
    invalid("count " + std::to_string(count) + " of " + dataTypeName(type) + " overflows the byte size");
}

void checkBuffer(const void* p, std::size_t count, const char* name) {
  if (count > 0 && p == nullptr) invalid(std::string(name) + " is NULL with count " + std::to_string(count));
}

void checkConfig(const ncclConfig_t* config) {
  if (config == nullptr) return;
  if (config->magic != 0xcafebeef)
    invalid("config was not set up with NCCL_CONFIG_INITIALIZER (magic " + std::to_string(config->magic) + ")");
  if (config->size < offsetof(ncclConfig_t, cgaClusterSize))
    invalid("config->size " + std::to_string(config->size) + " is too small for an ncclConfig_t");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    invalid("config->blocking " + std::to_string(config->blocking) + " must be 0 or 1");
  const bool hasMin = hasMinCTAs(config), hasMax = hasMaxCTAs(config);
  if (hasMin && config->minCTAs < 1) invalid("config->minCTAs " + std::to_string(config->minCTAs) + " must be >= 1");
  if (hasMax && config->maxCTAs < 1) invalid("config->maxCTAs " + std::to_string(config->maxCTAs) + " must be >= 1");
  if (hasMin && hasMax && config->minCTAs > config->maxCTAs)
    invalid("config->minCTAs " + std::to_string(config->minCTAs) + " exceeds config->maxCTAs " +
            std::to_string(config->maxCTAs));
}

CommOptions commOptions(const ncclConfig_t* config, const CommOptions& inherited) {
  if (config == nullptr) return inherited;
  CommOptions o;
  if (hasMinCTAs(config)) o.minBlocks = config->minCTAs;
  if (hasMaxCTAs(config)) o.maxBlocks = config->maxCTAs;
  return o;
}

}  // namespace ferry::nccl
