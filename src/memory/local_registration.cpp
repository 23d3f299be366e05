// Owner side of registration: telling ferry memory from other memory, legacy IPC handles for other
// device memory, pinning other host memory, and the table that lets a descriptor that comes back to
// its own process find the original registration.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "platform/cuda_check.hpp"
#include "core/host_id.hpp"
#include "core/logger.hpp"
#include "platform/cuda_driver.hpp"
#include "platform/cuda_runtime_util.hpp"
#include "memory/registered_memory_impl.hpp"

namespace ferry {

struct HostPinning {
  void* ptr = nullptr;
  ~HostPinning() {
    if (cudaError_t err = cudaHostUnregister(ptr); err != cudaSuccess) {
      (void)cudaGetLastError();
      FERRY_LOG(Warn, Transport) << "cudaHostUnregister(" << ptr << ") failed: " << cudaGetErrorName(err);
    }
  }
};

namespace {

struct LocalTables {
  std::mutex mutex;
  std::map<std::uint64_t, std::weak_ptr<RegisteredMemory::Impl>> registrations;
  // Other host memory pinned by ferry, by start address, shared by registrations of that range.
  std::map<void*, std::pair<std::size_t, std::weak_ptr<HostPinning>>> pinnings;
};
LocalTables& tables() {
  static auto* t = new LocalTables();  // leaked: used by static destructors of user objects too
  return *t;
}

template <class Map>
void purgeExpired(Map& map, auto&& expired) {
  for (auto it = map.begin(); it != map.end();) it = expired(it->second) ? map.erase(it) : std::next(it);
}

// Pins [ptr, ptr+size) with cudaHostRegister unless ferry already pinned a range starting there that
// covers it. Memory somebody else pinned (cudaMallocHost, their own cudaHostRegister) is left alone:
// nullptr.
std::shared_ptr<HostPinning> pinHostMemory(void* ptr, std::size_t size) {
  LocalTables& t = tables();
  std::lock_guard lock(t.mutex);
  purgeExpired(t.pinnings, [](auto& v) { return v.second.expired(); });
  if (auto it = t.pinnings.find(ptr); it != t.pinnings.end() && it->second.first >= size)
    if (auto p = it->second.second.lock()) return p;
  cudaError_t err = cudaHostRegister(ptr, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess)
    detail::throwCudaError(err, "cudaHostRegister(ptr, size, Portable | Mapped)", SourceLocation::current());
  auto pinning = std::make_shared<HostPinning>();
  pinning->ptr = ptr;
  t.pinnings[ptr] = {size, pinning};
  return pinning;
}

void fillOtherDevice(RegisteredMemory::Impl& m, void* ptr, int device) {
  const CudaDriver& cu = cudaDriver();
  CUdeviceptr base = 0;
  std::size_t allocSize = 0;
  FERRY_CU_CHECK(cu, cuMemGetAddressRange(&base, &allocSize, reinterpret_cast<CUdeviceptr>(ptr)));
  m.wireKind = WireKind::OtherDevice;
  m.device = device;
  m.allocSize = allocSize;
  m.offset = reinterpret_cast<std::uintptr_t>(ptr) - base;
  if (m.offset + m.size > allocSize)
    throw Error(ErrorCode::InvalidUsage, "registerMemory: the range of " + std::to_string(m.size) +
                                             " bytes at offset " + std::to_string(m.offset) +
                                             " runs past the end of its " + std::to_string(allocSize) +
                                             "-byte device allocation");
  if (!m.transports.has(Transport::CudaIpc)) return;
  cudaIpcMemHandle_t handle{};
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)); err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(ErrorCode::NotSupported,
                std::string("registerMemory for CudaIpc: device memory at ") + std::to_string(base) +
                    " has no legacy CUDA IPC handle (cudaIpcGetMemHandle: " + cudaGetErrorName(err) +
                    "); memory from cudaMallocAsync pools or a foreign VMM allocator cannot be shared this "
                    "way: allocate it with ferry::gpuAlloc");
  }
  static_assert(sizeof(handle) == kIpcHandleBytes);
  std::memcpy(m.ipcHandle.data(), &handle, kIpcHandleBytes);
  m.hasIpcHandle = true;
}

}  // namespace

RegisteredMemory::Impl::~Impl() {
  if (!local) return;
  LocalTables& t = tables();
  std::lock_guard lock(t.mutex);
  if (auto it = t.registrations.find(regId); it != t.registrations.end() && it->second.expired())
    t.registrations.erase(it);
}

std::shared_ptr<RegisteredMemory::Impl> registerLocal(void* ptr, std::size_t size, TransportFlags transports,
                                                      int rank) {
  static std::atomic<std::uint64_t> nextRegId{1};
  auto m = std::make_shared<RegisteredMemory::Impl>();
  m->transports = transports;
  m->rank = rank;
  m->owner = processIdentity();
  m->size = size;
  m->regId = nextRegId.fetch_add(1, std::memory_order_relaxed);
  m->regToken = randomSecret();
  m->data = ptr;
  m->local = true;

  if (std::shared_ptr<Allocation> a = findAllocation(ptr, size)) {
    m->wireKind = a->kind == AllocationKind::Device ? WireKind::FerryDevice : WireKind::FerryHost;
    m->device = a->device;
    m->allocId = a->id;
    m->allocToken = a->token;
    m->allocSize = a->size;
    m->granularity = a->granularity;
    m->offset = static_cast<std::uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(a->base));
    m->allocation = std::move(a);
  } else if (gpuPresent()) {
    cudaPointerAttributes attr{};
    FERRY_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr));
    switch (attr.type) {
      case cudaMemoryTypeDevice: fillOtherDevice(*m, ptr, attr.device); break;
      case cudaMemoryTypeManaged:
        throw Error(ErrorCode::NotSupported,
                    "registerMemory: managed memory (cudaMallocManaged) cannot be "
                    "registered; use ferry::gpuAlloc or ferry::hostAlloc");
      case cudaMemoryTypeUnregistered:
        if (transports.has(Transport::CudaIpc)) m->pinning = pinHostMemory(ptr, size);
        break;
      case cudaMemoryTypeHost: break;  // already pinned by its allocator
    }
  }

  LocalTables& t = tables();
  std::lock_guard lock(t.mutex);
  t.registrations[m->regId] = m;
  return m;
}

std::shared_ptr<RegisteredMemory::Impl> findLocalRegistration(std::uint64_t regId, const FdToken& regToken) {
  std::shared_ptr<RegisteredMemory::Impl> m;
  {
    LocalTables& t = tables();
    std::lock_guard lock(t.mutex);
    if (auto it = t.registrations.find(regId); it != t.registrations.end()) m = it->second.lock();
  }
  // Outside the lock: dropping m may run ~Impl, which takes it.
  if (!m || !secretsEqual(m->regToken, regToken)) return nullptr;
  return m;
}

}  // namespace ferry
