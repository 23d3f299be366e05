#pragma once
// The CUDA driver API functions ferry uses, resolved once at run time through the runtime's
// cudaGetDriverEntryPointByVersion. ferry never links libcuda: libferry.so must load and run its
// host-only parts on machines without a driver, and the calls below exist only where one is.
//
// Never add cuMulticast* here (architecture.md rule 1: the GPU check aborts on any such call).
//
//   const CudaDriver& cu = cudaDriver();          // throws Error(NotSupported) without a driver
//   FERRY_CU_CHECK(cu, cuMemAddressFree(ptr, size));
#include <cuda.h>

#include "ferry/errors.hpp"

namespace ferry {

struct CudaDriver {
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle = nullptr;
  decltype(&::cuMemGetAddressRange) cuMemGetAddressRange = nullptr;  // the _v2 ABI

  // "CUDA_ERROR_OUT_OF_MEMORY" (or "CUresult 2" when the name is unknown).
  std::string errorName(CUresult result) const;
};

// The table, resolved on first use (thread-safe). Throws Error(NotSupported) naming the symbol and
// the runtime's answer when the driver or a function is missing; later calls throw again.
const CudaDriver& cudaDriver();

namespace detail {
[[noreturn]] void throwCuError(const CudaDriver& cu, CUresult result, const char* call, SourceLocation where);
}  // namespace detail

}  // namespace ferry

// Calls cu.call and throws CudaError naming the call and the CUresult when it fails.
#define FERRY_CU_CHECK(cu, call)                                                                       \
  do {                                                                                                 \
    const ::ferry::CudaDriver& ferry_cu_ = (cu);                                                       \
    CUresult ferry_res_ = ferry_cu_.call;                                                              \
    if (ferry_res_ != CUDA_SUCCESS)                                                                    \
      ::ferry::detail::throwCuError(ferry_cu_, ferry_res_, #call, ::ferry::SourceLocation::current()); \
  } while (0)
