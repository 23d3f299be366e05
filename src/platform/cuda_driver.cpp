#include "platform/cuda_driver.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

namespace ferry {
namespace {

// The ABI version each function is requested at: the one whose signature the declarations in
// cuda.h (CUDA 12/13) have. cuMemGetAddressRange at 12000 is cuMemGetAddressRange_v2.
constexpr unsigned kAbiVersion = 12000;

template <class Fn>
void resolve(Fn& out, const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, kAbiVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    std::string why =
        err != cudaSuccess ? std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")"
        : status == cudaDriverEntryPointVersionNotSufficent ? "the driver is older than CUDA 12.0"
                                                            : "the driver does not export it";
    throw Error(ErrorCode::NotSupported,
                std::string("CUDA driver function ") + symbol + " is not available: " + why);
  }
  out = reinterpret_cast<Fn>(fn);
}

CudaDriver load() {
  CudaDriver d;
  resolve(d.cuGetErrorName, "cuGetErrorName");
  resolve(d.cuMemCreate, "cuMemCreate");
  resolve(d.cuMemRelease, "cuMemRelease");
  resolve(d.cuMemAddressReserve, "cuMemAddressReserve");
  resolve(d.cuMemAddressFree, "cuMemAddressFree");
  resolve(d.cuMemMap, "cuMemMap");
  resolve(d.cuMemUnmap, "cuMemUnmap");
  resolve(d.cuMemSetAccess, "cuMemSetAccess");
  resolve(d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  resolve(d.cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
  resolve(d.cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
  resolve(d.cuMemGetAddressRange, "cuMemGetAddressRange");
  return d;
}

}  // namespace

std::string CudaDriver::errorName(CUresult result) const {
  const char* name = nullptr;
  if (cuGetErrorName != nullptr && cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr)
    return name;
  return "CUresult " + std::to_string(static_cast<int>(result));
}

const CudaDriver& cudaDriver() {
  // Not std::call_once: a failed load must be retried (and throw again) on the next call, and a
  // successful one is never repeated.
  static std::mutex mutex;
  static CudaDriver* loaded = nullptr;  // leaked: used until process exit, by static destructors too
  std::lock_guard lock(mutex);
  if (loaded == nullptr) loaded = new CudaDriver(load());
  return *loaded;
}

namespace detail {
void throwCuError(const CudaDriver& cu, CUresult result, const char* call, SourceLocation where) {
  throw CudaError(std::string(call) + " failed: " + cu.errorName(result), static_cast<int>(result), where);
}
}  // namespace detail

}  // namespace ferry
