// Peer side of registration: mapping another process's memory, cached per (owner process,
// allocation) so that every RegisteredMemory naming one allocation shares one mapping.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "platform/cuda_check.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "platform/cuda_driver.hpp"
#include "platform/cuda_runtime_util.hpp"
#include "memory/registered_memory_impl.hpp"

namespace ferry {

struct ImportedMapping {
  WireKind kind = WireKind::OtherHost;
  std::string what;      // "allocation 3 of rank 0 (pid 1234)", for messages
  void* base = nullptr;  // the whole allocation, mapped here
  std::size_t size = 0;  // its size
  // Undo state, filled as the mapping is built.
  bool reserved = false;
  bool mapped = false;
  bool ipcOpened = false;
  bool hostMapped = false;
  bool hostRegistered = false;

  ImportedMapping() = default;
  ImportedMapping(const ImportedMapping&) = delete;
  ImportedMapping& operator=(const ImportedMapping&) = delete;

  ~ImportedMapping() {
    try {
      if (mapped || reserved) {
        const CudaDriver& cu = cudaDriver();
        auto va = reinterpret_cast<CUdeviceptr>(base);
        if (mapped) FERRY_CU_CHECK(cu, cuMemUnmap(va, size));
        if (reserved) FERRY_CU_CHECK(cu, cuMemAddressFree(va, size));
      }
      if (ipcOpened) FERRY_CUDA_CHECK(cudaIpcCloseMemHandle(base));
      if (hostRegistered) FERRY_CUDA_CHECK(cudaHostUnregister(base));
      if (hostMapped && ::munmap(base, size) != 0) throw SysError("munmap", errno);
    } catch (const std::exception& e) {
      FERRY_LOG(Error, Transport) << "unmapping " << what << " failed: " << e.what();
    }
  }
};

namespace {

struct ImportCache {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<ImportedMapping>> byKey;
};
ImportCache& cache() {
  static auto* c = new ImportCache();  // leaked: mappings may be dropped by static destructors
  return *c;
}

// Whether this process maps the memory at all (see registered_memory.hpp).
bool mappable(const RegisteredMemory::Impl& m) {
  switch (m.wireKind) {
    case WireKind::FerryDevice: return m.transports.has(Transport::CudaIpc);
    case WireKind::OtherDevice: return m.transports.has(Transport::CudaIpc) && m.hasIpcHandle;
    case WireKind::FerryHost:
      return m.transports.has(Transport::HostMemory) || m.transports.has(Transport::CudaIpc);
    case WireKind::OtherHost: return false;
  }
  return false;
}

std::string cacheKey(const RegisteredMemory::Impl& m) {
  std::string key(reinterpret_cast<const char*>(&m.owner.hostHash), 8);
  key.append(reinterpret_cast<const char*>(&m.owner.token), 8);
  key.push_back(static_cast<char>(m.wireKind));
  if (m.wireKind == WireKind::OtherDevice)
    key.append(reinterpret_cast<const char*>(m.ipcHandle.data()), m.ipcHandle.size());
  else
    key.append(reinterpret_cast<const char*>(&m.allocId), 8);
  return key;
}

void requireGpu(const RegisteredMemory::Impl& m, const std::string& what) {
  if (!gpuPresent())
    throw Error(ErrorCode::NotSupported, "cannot map " + what +
                                             " (device memory, registered for CudaIpc): "
                                             "this process has no CUDA device");
  (void)m;
}

void mapFerryDevice(ImportedMapping& map, const RegisteredMemory::Impl& m) {
  requireGpu(m, map.what);
  int dev = currentDevice();
  FERRY_CUDA_CHECK(cudaFree(nullptr));  // the device's primary context, current
  UniqueFd fd = fetchFd(m.serverName, m.allocId, m.allocToken, env().fdTimeout, map.what);
  const CudaDriver& cu = cudaDriver();
  CUmemGenericAllocationHandle handle = 0;
  FERRY_CU_CHECK(cu, cuMemImportFromShareableHandle(
                         &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())),
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  // The mapping holds the memory from here on; the handle and the descriptor can go (both here,
  // also on failure below).
  struct ReleaseHandle {
    const CudaDriver& cu;
    CUmemGenericAllocationHandle h;
    ~ReleaseHandle() { cu.cuMemRelease(h); }
  } release{cu, handle};
  CUdeviceptr va = 0;
  FERRY_CU_CHECK(cu, cuMemAddressReserve(&va, m.allocSize, m.granularity, 0, 0));
  map.base = reinterpret_cast<void*>(va);
  map.size = m.allocSize;
  map.reserved = true;
  FERRY_CU_CHECK(cu, cuMemMap(va, m.allocSize, 0, handle, 0));
  map.mapped = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  FERRY_CU_CHECK(cu, cuMemSetAccess(va, m.allocSize, &access, 1));
}

void mapOtherDevice(ImportedMapping& map, const RegisteredMemory::Impl& m) {
  requireGpu(m, map.what);
  FERRY_CUDA_CHECK(cudaFree(nullptr));
  cudaIpcMemHandle_t handle{};
  std::memcpy(&handle, m.ipcHandle.data(), sizeof(handle));
  void* base = nullptr;
  FERRY_CUDA_CHECK(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
  map.base = base;
  map.ipcOpened = true;
  // The descriptor's allocation size is the owner's word; the driver's is the truth.
  CUdeviceptr rangeBase = 0;
  std::size_t rangeSize = 0;
  FERRY_CU_CHECK(cudaDriver(),
                 cuMemGetAddressRange(&rangeBase, &rangeSize, reinterpret_cast<CUdeviceptr>(base)));
  map.size = rangeSize;
}

void mapFerryHost(ImportedMapping& map, const RegisteredMemory::Impl& m) {
  UniqueFd fd = fetchFd(m.serverName, m.allocId, m.allocToken, env().fdTimeout, map.what);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw SysError("fstat of the descriptor of " + map.what, errno);
  // Mapping past the end of the file would turn later accesses into SIGBUS: check first.
  if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < m.allocSize)
    throw Error(ErrorCode::ProtocolError, "the descriptor of " + map.what +
                                              " is not a memory file of at least " +
                                              std::to_string(m.allocSize) + " bytes");
  void* base = ::mmap(nullptr, m.allocSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throw SysError("mmap of " + map.what, errno);
  map.base = base;
  map.size = m.allocSize;
  map.hostMapped = true;
  if (gpuPresent()) {
    FERRY_CUDA_CHECK(cudaHostRegister(base, m.allocSize, cudaHostRegisterPortable | cudaHostRegisterMapped));
    map.hostRegistered = true;
  }
}

}  // namespace

void importMemory(RegisteredMemory::Impl& m) {
  if (m.owner.hostHash != processIdentity().hostHash || !mappable(m)) return;
  std::string what =
      "allocation " +
      (m.wireKind == WireKind::OtherDevice ? std::string("(legacy IPC)") : std::to_string(m.allocId)) +
      " of rank " + std::to_string(m.rank) + " (pid " + std::to_string(m.owner.pid) + ")";
  ImportCache& c = cache();
  // Held while mapping: two imports of one allocation must not both map it. Imports are control
  // plane and rare; ~ImportedMapping never takes this lock.
  std::lock_guard lock(c.mutex);
  for (auto it = c.byKey.begin(); it != c.byKey.end();)
    it = it->second.expired() ? c.byKey.erase(it) : std::next(it);
  std::string key = cacheKey(m);
  std::shared_ptr<ImportedMapping> map;
  if (auto it = c.byKey.find(key); it != c.byKey.end()) map = it->second.lock();
  if (!map) {
    map = std::make_shared<ImportedMapping>();
    map->kind = m.wireKind;
    map->what = what;
    switch (m.wireKind) {
      case WireKind::FerryDevice: mapFerryDevice(*map, m); break;
      case WireKind::OtherDevice: mapOtherDevice(*map, m); break;
      case WireKind::FerryHost: mapFerryHost(*map, m); break;
      case WireKind::OtherHost: return;
    }
    c.byKey[key] = map;
    FERRY_LOG(Debug, Transport) << "mapped " << what << ": " << map->size << " bytes at " << map->base;
  }
  // Another descriptor of the same allocation may claim a range the mapping does not have.
  if (m.offset > map->size || m.size > map->size - m.offset)
    throw Error(ErrorCode::ProtocolError, "RegisteredMemory descriptor of " + what + " claims [" +
                                              std::to_string(m.offset) + ", +" + std::to_string(m.size) +
                                              ") of a " + std::to_string(map->size) + "-byte allocation");
  m.data = static_cast<char*>(map->base) + m.offset;
  m.mapping = std::move(map);
}

std::size_t liveImportCount() {
  ImportCache& c = cache();
  std::lock_guard lock(c.mutex);
  std::size_t n = 0;
  for (auto& [key, weak] : c.byKey) n += !weak.expired();
  return n;
}

}  // namespace ferry
