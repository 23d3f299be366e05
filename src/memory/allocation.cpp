#include "memory/allocation.hpp"

#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "platform/cuda_check.hpp"
#include "core/host_id.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "platform/cuda_driver.hpp"
#include "platform/cuda_runtime_util.hpp"

namespace ferry {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, std::weak_ptr<Allocation>> byBase;
};
Registry& registry() {
  static auto* r = new Registry();  // leaked: allocations may be freed by static destructors
  return *r;
}

std::uint64_t nextId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::size_t roundUp(std::size_t n, std::size_t to) {
  if (n > SIZE_MAX - (to - 1))
    throw Error(ErrorCode::InvalidUsage, "allocation of " + std::to_string(n) + " bytes is too large");
  return (n + to - 1) / to * to;
}

void checkBytes(std::size_t bytes, const char* what) {
  if (bytes == 0) throw Error(ErrorCode::InvalidUsage, std::string(what) + "(0): the size must be positive");
}

std::shared_ptr<void> track(std::shared_ptr<Allocation> a) {
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.byBase[reinterpret_cast<std::uintptr_t>(a->base)] = a;
  }
  void* base = a->base;
  // The user's pointer shares ownership of the Allocation (aliasing constructor).
  return std::shared_ptr<void>(std::move(a), base);
}

// Devices that may access memory on `owner`: the owner, and every device with peer access to it.
std::vector<CUmemAccessDesc> accessDescriptors(int owner) {
  int count = 0;
  FERRY_CUDA_CHECK(cudaGetDeviceCount(&count));
  std::vector<CUmemAccessDesc> out;
  for (int d = 0; d < count; ++d) {
    int can = d == owner ? 1 : 0;
    if (d != owner) FERRY_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, owner));
    if (!can) continue;
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    out.push_back(desc);
  }
  return out;
}

}  // namespace

Allocation::~Allocation() {
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.byBase.find(reinterpret_cast<std::uintptr_t>(base));
    if (it != r.byBase.end() && it->second.expired()) r.byBase.erase(it);
  }
  // Before the descriptor closes: the server may be sending it right now (withdraw waits for that).
  FdServer::withdrawFromInstance(id);
  try {
    if (kind == AllocationKind::Device) {
      const CudaDriver& cu = cudaDriver();
      auto va = reinterpret_cast<CUdeviceptr>(base);
      if (mapped) FERRY_CU_CHECK(cu, cuMemUnmap(va, size));
      if (reserved) FERRY_CU_CHECK(cu, cuMemAddressFree(va, size));
      if (handle != 0) FERRY_CU_CHECK(cu, cuMemRelease(handle));
    } else if (base != nullptr) {
      if (hostRegistered) FERRY_CUDA_CHECK(cudaHostUnregister(base));
      if (::munmap(base, size) != 0) throw SysError("munmap of a hostAlloc allocation", errno);
    }
  } catch (const std::exception& e) {
    FERRY_LOG(Error, Transport) << "freeing allocation " << id << " (" << size
                                << " bytes) failed: " << e.what();
  }
}

std::string Allocation::share() {
  if (kind == AllocationKind::Device && !fd.valid()) {
    int exported = -1;
    FERRY_CU_CHECK(cudaDriver(), cuMemExportToShareableHandle(&exported, handle,
                                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fd.reset(exported);
  }
  FdServer& server = FdServer::instance();
  server.publish(id, token, fd.get());
  return server.name();
}

std::shared_ptr<Allocation> findAllocation(const void* ptr, std::size_t size) {
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.byBase.upper_bound(p);
  if (it == r.byBase.begin()) return nullptr;
  --it;
  std::shared_ptr<Allocation> a = it->second.lock();
  if (!a) return nullptr;
  std::uintptr_t begin = it->first;
  if (p - begin >= a->size) return nullptr;
  if (size > a->size - (p - begin))
    throw Error(ErrorCode::InvalidUsage, "the range of " + std::to_string(size) + " bytes at offset " +
                                             std::to_string(p - begin) + " runs past the end of its " +
                                             std::to_string(a->size) + "-byte ferry allocation");
  return a;
}

std::size_t liveAllocationCount() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::size_t n = 0;
  for (auto& [base, weak] : r.byBase) n += !weak.expired();
  return n;
}

std::shared_ptr<void> gpuAlloc(std::size_t bytes) {
  checkBytes(bytes, "gpuAlloc");
  int dev = currentDevice();
  FERRY_CUDA_CHECK(cudaFree(nullptr));  // make the device's primary context current
  const CudaDriver& cu = cudaDriver();

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t minimum = 0;
  std::size_t recommended = 0;
  FERRY_CU_CHECK(cu, cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  FERRY_CU_CHECK(cu,
                 cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  std::size_t gran = std::max(minimum, recommended);
  if (gran == 0 || (gran & (gran - 1)) != 0 || gran % minimum != 0)
    throw Error(ErrorCode::InternalError, "unexpected cuMem granularity " + std::to_string(gran));

  // Fill the Allocation step by step: if a step throws, its destructor undoes the earlier ones.
  auto a = std::make_shared<Allocation>();
  a->kind = AllocationKind::Device;
  a->id = nextId();
  a->token = randomSecret();
  a->device = dev;
  a->granularity = gran;
  a->size = roundUp(bytes, gran);
  FERRY_CU_CHECK(cu, cuMemCreate(&a->handle, a->size, &prop, 0));
  CUdeviceptr va = 0;
  FERRY_CU_CHECK(cu, cuMemAddressReserve(&va, a->size, gran, 0, 0));
  a->base = reinterpret_cast<void*>(va);
  a->reserved = true;
  FERRY_CU_CHECK(cu, cuMemMap(va, a->size, 0, a->handle, 0));
  a->mapped = true;
  auto access = accessDescriptors(dev);
  FERRY_CU_CHECK(cu, cuMemSetAccess(va, a->size, access.data(), access.size()));
  FERRY_CUDA_CHECK(cudaMemset(a->base, 0, a->size));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  FERRY_LOG(Debug, Transport) << "gpuAlloc: " << a->size << " bytes on device " << dev << " at " << a->base
                              << " (allocation " << a->id << ")";
  return track(std::move(a));
}

std::shared_ptr<void> hostAlloc(std::size_t bytes) {
  checkBytes(bytes, "hostAlloc");
  auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto a = std::make_shared<Allocation>();
  a->kind = AllocationKind::Host;
  a->id = nextId();
  a->token = randomSecret();
  a->granularity = page;
  a->size = roundUp(bytes, page);
  a->fd.reset(::memfd_create("ferry-host", MFD_CLOEXEC));
  if (!a->fd.valid()) throw SysError("memfd_create for hostAlloc", errno);
  if (::ftruncate(a->fd.get(), static_cast<off_t>(a->size)) != 0)
    throw SysError("ftruncate of a hostAlloc memfd to " + std::to_string(a->size) + " bytes", errno);
  // A fresh memfd reads as zeros: no memset needed.
  void* base = ::mmap(nullptr, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd.get(), 0);
  if (base == MAP_FAILED) throw SysError("mmap of a hostAlloc memfd", errno);
  a->base = base;
  if (gpuPresent()) {
    FERRY_CUDA_CHECK(cudaHostRegister(base, a->size, cudaHostRegisterPortable | cudaHostRegisterMapped));
    a->hostRegistered = true;
  }
  return track(std::move(a));
}

}  // namespace ferry
