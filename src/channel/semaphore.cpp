#include "ferry/semaphore.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "platform/cuda_check.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "memory/token_pool.hpp"
#include "core/deadline.hpp"

namespace ferry {

// What every kind of semaphore holds: this rank's counters and, once received, the peer's inbound
// counter as registered memory.
struct SemaphoreCore {
  std::shared_ptr<Connection> connection;
  Token inbound;             // shared: the peer (or its proxy) increases it
  Token expected, outbound;  // private to this rank
  RegisteredMemory localInbound;
  std::shared_future<RegisteredMemory> remoteFuture;
  std::mutex mu;
  RegisteredMemory remote;  // guarded by mu until resolved
  std::uint64_t hostOutbound = 0;
  bool onDevice = false;
  std::uint64_t hostExpected = 0;

  // onDevice: the private counters (and, unless inboundOnHost, the inbound one) live on the current
  // CUDA device.
  // `allowed`: the transports the connection may have.
  SemaphoreCore(Communicator& comm, std::shared_ptr<Connection> conn, int tag, const char* kind,
                TransportFlags allowed, bool onDevice, bool inboundOnHost = false)
      : connection(std::move(conn)), onDevice(onDevice) {
    if (!connection) throw Error(ErrorCode::InvalidUsage, std::string(kind) + ": the connection is null");
    if (!allowed.has(connection->transport())) {
      std::string names = toString(allowed);
      std::replace(names.begin(), names.end(), '|', '/');
      throw Error(ErrorCode::InvalidUsage,
                  std::string(kind) + " between rank " + std::to_string(connection->rank()) + " and rank " +
                      std::to_string(connection->remoteRank()) + " needs a " + names + " connection, not " +
                      std::string(toString(connection->transport())));
    }
    int device = -1;
    if (onDevice) FERRY_CUDA_CHECK(cudaGetDevice(&device));
    inbound = allocateToken(inboundOnHost ? -1 : device);
    expected = allocateToken(device);
    outbound = allocateToken(device);
    // (A host counter is hostAlloc memory, which CUDA has pinned and mapped for this rank's GPU.)
    localInbound = comm.registerMemory(inbound.ptr, sizeof(std::uint64_t), connection->transport());
    comm.sendMemory(localInbound, connection->remoteRank(), tag);
    remoteFuture = comm.recvMemory(connection->remoteRank(), tag);
  }

  const RegisteredMemory& remoteInbound() {
    std::lock_guard lock(mu);
    if (!remote.valid()) remote = remoteFuture.get();
    return remote;
  }

  SemaphoreDeviceHandle handle(bool withRemote) {
    SemaphoreDeviceHandle h;
    h.inbound = inbound.ptr;
    if (localInbound.kind() == MemoryKind::Host && expected.ptr != nullptr && onDevice)
      FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h.inbound), inbound.ptr, 0));
    h.expectedInbound = expected.ptr;
    h.outbound = outbound.ptr;
    h.remoteInbound = withRemote ? static_cast<std::uint64_t*>(remoteInbound().data()) : nullptr;
    h.wait_.rank = connection->rank();
    h.wait_.peer = connection->remoteRank();
    h.wait_.timeoutNs = timeoutNanoseconds(env().deviceTimeout);
    return h;
  }

  // Proxy or host signal: the value lands in the peer's counter after every earlier write of the
  // connection (Connection::updateAndSync's contract).
  void signalThroughConnection() {
    connection->updateAndSync(remoteInbound(), 0, &hostOutbound, hostOutbound + 1);
  }
};

MemoryDevice2DeviceSemaphore::MemoryDevice2DeviceSemaphore(Communicator& comm,
                                                           std::shared_ptr<Connection> connection, int tag)
    : core_(std::make_shared<SemaphoreCore>(comm, std::move(connection), tag, "MemoryDevice2DeviceSemaphore",
                                            Transport::CudaIpc, true)) {}
MemoryDevice2DeviceSemaphore::~MemoryDevice2DeviceSemaphore() = default;
SemaphoreDeviceHandle MemoryDevice2DeviceSemaphore::deviceHandle() const { return core_->handle(true); }
const std::shared_ptr<Connection>& MemoryDevice2DeviceSemaphore::connection() const {
  return core_->connection;
}

Host2DeviceSemaphore::Host2DeviceSemaphore(Communicator& comm, std::shared_ptr<Connection> connection,
                                           int tag)
    : core_(std::make_shared<SemaphoreCore>(comm, std::move(connection), tag, "Host2DeviceSemaphore",
                                            Transport::CudaIpc | Transport::HostMemory | Transport::Ethernet, true,
                                            /*inboundOnHost=*/true)) {}
Host2DeviceSemaphore::~Host2DeviceSemaphore() = default;
void Host2DeviceSemaphore::signal() { core_->signalThroughConnection(); }
void Host2DeviceSemaphore::awaitPeer() { (void)core_->remoteInbound(); }
SemaphoreDeviceHandle Host2DeviceSemaphore::deviceHandle() const { return core_->handle(false); }
const std::shared_ptr<Connection>& Host2DeviceSemaphore::connection() const { return core_->connection; }

Host2HostSemaphore::Host2HostSemaphore(Communicator& comm, std::shared_ptr<Connection> connection, int tag)
    : core_(std::make_shared<SemaphoreCore>(comm, std::move(connection), tag, "Host2HostSemaphore",
                                            Transport::HostMemory | Transport::Ethernet, false)) {}
Host2HostSemaphore::~Host2HostSemaphore() = default;
void Host2HostSemaphore::signal() { core_->signalThroughConnection(); }
const std::shared_ptr<Connection>& Host2HostSemaphore::connection() const { return core_->connection; }

bool Host2HostSemaphore::poll() {
  if (atomicLoad(core_->inbound.ptr, memory_order_acquire) <= core_->hostExpected) return false;
  ++core_->hostExpected;
  return true;
}

void Host2HostSemaphore::wait(std::chrono::duration<double> timeout) {
  const std::uint64_t want = core_->hostExpected + 1;
  const auto deadline = deadlineAfter(timeout);
  for (std::uint32_t spins = 0; atomicLoad(core_->inbound.ptr, memory_order_acquire) < want; ++spins) {
    if ((spins & 255) == 255) {
      // A connection that can no longer deliver the signal fails the wait now, naming why; a
      // signal that arrived before it broke still counts (checked again first).
      if (std::string why = core_->connection->failure();
          !why.empty() && atomicLoad(core_->inbound.ptr, memory_order_acquire) < want)
        throw Error(ErrorCode::RemoteError,
                    "rank " + std::to_string(core_->connection->rank()) + ": Host2HostSemaphore::wait for rank " +
                        std::to_string(core_->connection->remoteRank()) + ": signal " + std::to_string(want) +
                        " cannot come any more: " + why);
      if (std::chrono::steady_clock::now() > deadline)
        throw TimeoutError(
            "rank " + std::to_string(core_->connection->rank()) + ": Host2HostSemaphore::wait for rank " +
            std::to_string(core_->connection->remoteRank()) + " timed out after " +
            std::to_string(timeout.count()) + " s (signal " + std::to_string(want) + " never came)");
      std::this_thread::yield();
    }
  }
  core_->hostExpected = want;
}

void Host2HostSemaphore::wait() { wait(env().deviceTimeout); }

}  // namespace ferry
