#pragma once
// The state behind a RegisteredMemory: the descriptor that travels to peers, and what keeps the
// memory valid in this process (the owner's allocation, or a peer's mapping).
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/registered_memory.hpp"
#include "memory/allocation.hpp"
#include "memory/fd_server.hpp"
#include "platform/process_identity.hpp"

namespace ferry {

// What kind of memory a descriptor describes, which decides how a peer maps it.
enum class WireKind : std::uint8_t {
  FerryDevice = 1,  // gpuAlloc: cuMem, fd over the owner's fd server
  OtherDevice = 2,  // cudaMalloc and friends: legacy CUDA IPC handle (when registered for CudaIpc)
  FerryHost = 3,    // hostAlloc: memfd over the owner's fd server
  OtherHost = 4,    // any other host memory: never mapped by peers
};

inline constexpr std::size_t kIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
using IpcHandleBytes = std::array<std::byte, kIpcHandleBytes>;

// Owner-side registration of other host memory with CUDA (cudaHostRegister), shared by every
// registration of the same range and undone with the last.
struct HostPinning;

// A peer-side mapping of one allocation of one owner process, shared through the import cache.
struct ImportedMapping;

struct RegisteredMemory::Impl {
  // --- the descriptor ---
  WireKind wireKind = WireKind::OtherHost;
  TransportFlags transports;
  int rank = -1;
  ProcessIdentity owner;     // the registering process
  std::int32_t device = -1;  // owner's CUDA device; -1 for host memory
  std::uint64_t size = 0;    // registered bytes
  std::uint64_t regId = 0;   // this registration, unique in the owner process
  FdToken regToken{};        // proves a descriptor came from this registration (same-process lookup)
  // Within the allocation (every kind but OtherHost).
  std::uint64_t offset = 0;
  std::uint64_t allocSize = 0;
  // FerryDevice / FerryHost.
  std::uint64_t allocId = 0;
  FdToken allocToken{};
  std::uint64_t granularity = 0;
  std::string serverName;  // filled at serialize time (starting the fd server lazily)
  // OtherDevice.
  bool hasIpcHandle = false;
  IpcHandleBytes ipcHandle{};

  // --- what keeps data valid here ---
  void* data = nullptr;
  bool local = false;
  std::shared_ptr<Allocation> allocation;    // owner, ferry memory
  std::shared_ptr<HostPinning> pinning;      // owner, other host memory pinned by us
  std::shared_ptr<ImportedMapping> mapping;  // peer

  ~Impl();
};

// Makes the owner-side state for [ptr, ptr+size) (Communicator::registerMemory does the argument
// checks). The result is recorded so that its descriptor deserialized in this process finds it.
std::shared_ptr<RegisteredMemory::Impl> registerLocal(void* ptr, std::size_t size, TransportFlags transports,
                                                      int rank);

// The live local registration (regId, regToken) of this process, or nullptr.
std::shared_ptr<RegisteredMemory::Impl> findLocalRegistration(std::uint64_t regId, const FdToken& regToken);

// Wire form; parse validates every field and throws Error(ProtocolError) on anything malformed.
std::vector<std::byte> encodeDescriptor(RegisteredMemory::Impl& impl);
std::shared_ptr<RegisteredMemory::Impl> decodeDescriptor(std::span<const std::byte> bytes);

// Peer side: maps the memory a decoded descriptor names, where this process can (sets
// impl.mapping and impl.data); leaves data null where it cannot (another host, a kind or transport
// that is not mappable).
void importMemory(RegisteredMemory::Impl& impl);

// Number of live peer-side mappings in this process (for tests).
std::size_t liveImportCount();

}  // namespace ferry
