#include "comm/comm_ports.hpp"

#include <cuda_runtime_api.h>

#include <future>
#include <string>

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "platform/cuda_check.hpp"
#include "platform/device_upload.hpp"

namespace ferry {
namespace {

constexpr int kTag = 0x706f;  // the Comm's own tag for its port channels' connections and semaphores

}  // namespace

CommPorts::CommPorts(Communicator& comm, const CommOptions::ConnectFn& connect, const PeerMemory& regions,
                     const std::uint32_t* abortFlag)
    : rank_(comm.bootstrap()->rank()), service_(512, std::chrono::microseconds(20)) {
  // Idle between calls the proxy dozes (20 us sleeps) rather than hold a core; a call after a pause
  // pays at most that much once.
  const int size = comm.bootstrap()->size();
  const std::string who = "rank " + std::to_string(rank_) + ": Comm: ";
  std::vector<std::shared_future<std::shared_ptr<Connection>>> pending(static_cast<std::size_t>(size));
  std::vector<std::shared_ptr<Connection>> connections(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank_) continue;
    if (connect) {
      connections[p] = connect(comm, p);
      if (!connections[p])
        throw Error(ErrorCode::InvalidUsage, who + "CommOptions::connect returned no connection to rank " + std::to_string(p));
      if (connections[p]->rank() != rank_ || connections[p]->remoteRank() != p)
        throw Error(ErrorCode::InvalidUsage,
                    who + "CommOptions::connect, asked for rank " + std::to_string(p) + ", returned a connection from rank " +
                        std::to_string(connections[p]->rank()) + " to rank " + std::to_string(connections[p]->remoteRank()));
    } else {
      pending[p] = comm.connect(p, Transport::CudaIpc, kTag);
    }
  }
  semaphores_.resize(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank_) continue;
    if (!connect) connections[p] = pending[p].get();
    semaphores_[p] = std::make_shared<Host2DeviceSemaphore>(comm, connections[p], kTag);
  }
  PortPeers peers{};
  for (int p = 0; p < size; ++p) {
    peers.region[p] = service_.addMemory(regions.registration(p));
    if (p == rank_) continue;
    semaphores_[p]->awaitPeer();  // here, not on the proxy thread at its first signal
    PortChannelDeviceHandle h = service_.addChannel(semaphores_[p]).deviceHandle();
    h.fifo.wait.abortFlag = abortFlag;
    h.semaphore.wait_.abortFlag = abortFlag;
    peers.channel[p] = h;
  }
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), sizeof(PortPeers)));
  try {
    uploadNow(device_, &peers, sizeof(PortPeers));
  } catch (...) {
    (void)cudaFree(device_);
    throw;
  }
}

CommPorts::~CommPorts() {
  try {
    service_.stop();
  } catch (const std::exception& e) {
    FERRY_LOG(Error, Collectives) << "rank " << rank_ << ": the Comm's proxy had failed: " << e.what();
  }
  (void)cudaFree(device_);
}

const PortPeers* CommPorts::start() {
  std::lock_guard lock(startMutex_);
  if (service_.running()) return device_;
  if (std::exception_ptr failed = service_.error()) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::RemoteError, "rank " + std::to_string(rank_) +
                                              ": the Comm's proxy failed on an earlier call (" + e.what() +
                                              "); destroy the Comm and make a new one");
    }
  }
  service_.start();
  return device_;
}

}  // namespace ferry
