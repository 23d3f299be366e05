#include "checks.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
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
  static const char* const names[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",      "ncclUint32",
                                      "ncclInt64",   "ncclUint64",   "ncclFloat16",    "ncclFloat32",
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
    invalid("datatype " + std::to_string(t) + " is not an ncclDataType_t (0.." +
            std::to_string(ncclNumTypes - 1) + ")");
}

void checkRankCount(int nranks) {
  if (nranks < 1) invalid("nranks " + std::to_string(nranks) + " must be at least 1");
}

void checkRankIn(int value, int nranks, const char* name) {
  if (value < 0 || value >= nranks)
    invalid(std::string(name) + " " + std::to_string(value) + " is out of range [0, " +
            std::to_string(nranks) + ")");
}

void checkCount(std::size_t count, ncclDataType_t type, std::size_t blocks) {
  const std::size_t es = elementBytes(type);
  if (es != 0 && blocks != 0 && count > std::numeric_limits<std::size_t>::max() / es / blocks)
    invalid("count " + std::to_string(count) + " of " + dataTypeName(type) + " overflows the byte size");
}

void checkBuffer(const void* p, std::size_t count, const char* name) {
  if (count > 0 && p == nullptr) invalid(std::string(name) + " is NULL with count " + std::to_string(count));
}

PointerPlace pointerPlace(const void* p) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  PointerPlace place;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    place.kind = PointerPlace::Kind::Error;
    place.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return place;
  }
  switch (attr.type) {
    case cudaMemoryTypeHost: place.kind = PointerPlace::Kind::Host; break;
    case cudaMemoryTypeDevice: place.kind = PointerPlace::Kind::Device; break;
    case cudaMemoryTypeManaged: place.kind = PointerPlace::Kind::Managed; break;
    default: place.kind = PointerPlace::Kind::Unknown; break;
  }
  place.device = attr.device;
  return place;
}

void checkPointerPlace(const void* p, const PointerPlace& place, const char* name, int device) {
  using Kind = PointerPlace::Kind;
  const bool onDevice = place.kind == Kind::Device || place.kind == Kind::Managed;
  if (onDevice && place.device == device) return;
  std::string what;
  switch (place.kind) {
    case Kind::Unknown:
      what = "CUDA does not know it (host memory from malloc or the stack, or freed?)";
      break;
    case Kind::Host: what = "it is pinned host memory"; break;
    case Kind::Device: what = "it is device memory of GPU " + std::to_string(place.device); break;
    case Kind::Managed: what = "it is managed memory of GPU " + std::to_string(place.device); break;
    case Kind::Error: what = "cudaPointerGetAttributes failed (" + place.error + ")"; break;
  }
  char address[32];
  std::snprintf(address, sizeof(address), "%p", p);
  invalid(std::string(name) + " " + address + " is not a valid pointer: " + what +
          "; it must be device memory of the communicator's GPU " + std::to_string(device));
}

void checkDeviceBuffer(const void* p, std::size_t count, const char* name, int device, cudaStream_t stream) {
  checkBuffer(p, count, name);
  if (count == 0) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) (void)cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone) return;
  checkPointerPlace(p, pointerPlace(p), name, device);
}

void checkConfig(const ncclConfig_t* config) {
  if (config == nullptr) return;
  if (config->magic != 0xcafebeef)
    invalid("config was not set up with NCCL_CONFIG_INITIALIZER (magic " + std::to_string(config->magic) +
            ")");
  if (config->size < offsetof(ncclConfig_t, cgaClusterSize))
    invalid("config->size " + std::to_string(config->size) + " is too small for an ncclConfig_t");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    invalid("config->blocking " + std::to_string(config->blocking) + " must be 0 or 1");
  const bool hasMin = hasMinCTAs(config), hasMax = hasMaxCTAs(config);
  if (hasMin && config->minCTAs < 1)
    invalid("config->minCTAs " + std::to_string(config->minCTAs) + " must be >= 1");
  if (hasMax && config->maxCTAs < 1)
    invalid("config->maxCTAs " + std::to_string(config->maxCTAs) + " must be >= 1");
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
