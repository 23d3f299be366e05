#include "transport/cuda_ipc_connection.hpp"

#include "platform/cuda_check.hpp"
#include "platform/cuda_poll.hpp"
#include "platform/device_guard.hpp"
#include "core/logger.hpp"
#include "ferry/device/arch/atomics.hpp"
#include "ferry/env.hpp"
#include "core/deadline.hpp"

namespace ferry {

CudaIpcConnection::CudaIpcConnection(int rank, int remoteRank, int device)
    : Connection(rank, remoteRank, Transport::CudaIpc), device_(device) {
  DeviceGuard guard(device_);
  // Built step by step; on failure the destructor is not run, so free what exists by hand.
  try {
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    void* ring = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(&ring, sizeof(std::uint64_t) * kStagingSlots, cudaHostAllocPortable));
    ring_ = static_cast<std::uint64_t*>(ring);
    for (auto& e : events_) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    for (auto& e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (ring_ != nullptr) (void)cudaFreeHost(ring_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    throw;
  }
}

CudaIpcConnection::~CudaIpcConnection() {
  try {
    DeviceGuard guard(device_);
    if (!pollUntilReady([&] { return cudaStreamQuery(stream_); }, deadlineAfter(env().connectionTimeout), "cudaStreamQuery"))
      FERRY_LOG(Error, Transport) << describe() << ": copies still in flight at destruction after "
                                  << env().connectionTimeout.count() << " s; freeing anyway";
    for (auto& e : events_) (void)cudaEventDestroy(e);
    for (auto& point : flushPoints_) (void)cudaEventDestroy(point.second);
    for (auto e : spareEvents_) (void)cudaEventDestroy(e);
    (void)cudaFreeHost(ring_);
    (void)cudaStreamDestroy(stream_);
  } catch (const std::exception& e) {
    FERRY_LOG(Error, Transport) << describe() << ": destruction failed: " << e.what();
  }
}

void CudaIpcConnection::doWrite(void* dst, const void* src, std::uint64_t bytes) {
  DeviceGuard guard(device_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  streamBusy_ = true;
}

void CudaIpcConnection::waitEvent(cudaEvent_t event, std::chrono::duration<double> timeout,
                                  const char* what) {
  if (!pollUntilReady([&] { return cudaEventQuery(event); }, deadlineAfter(timeout), "cudaEventQuery"))
    throw TimeoutError(
        describe() + ": " + what + " did not complete within " + std::to_string(timeout.count()) +
        " s (FERRY_CONNECTION_TIMEOUT); is the peer's memory still mapped and the device healthy?");
}

void CudaIpcConnection::doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t newValue) {
  DeviceGuard guard(device_);
  // Fast path: a word in host memory, with nothing of ours still in flight, is stored directly. The
  // release store orders it after everything the stream has completed, and the stream holds
  // nothing else; this saves the few microseconds an 8-byte copy costs to issue and to run, which
  // is most of a PortChannel signal's latency.
  if (dstInHostMemory && streamBusy_) {
    cudaError_t idle = cudaStreamQuery(stream_);
    if (idle == cudaSuccess)
      streamBusy_ = false;
    else if (idle != cudaErrorNotReady)
      detail::throwCudaError(idle, "cudaStreamQuery", SourceLocation::current());
  }
  if (dstInHostMemory && !streamBusy_) {
    atomicStore(dst, newValue, memory_order_release);
    return;
  }
  int slot = static_cast<int>(next_++ % kStagingSlots);
  // The slot's previous value must have been copied before it is overwritten.
  if (inFlight_[slot]) waitEvent(events_[slot], env().connectionTimeout, "an earlier updateAndSync");
  ring_[slot] = newValue;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, &ring_[slot], sizeof(std::uint64_t), cudaMemcpyDefault, stream_));
  FERRY_CUDA_CHECK(cudaEventRecord(events_[slot], stream_));
  inFlight_[slot] = true;
  streamBusy_ = true;
}

void CudaIpcConnection::doFlush(std::chrono::duration<double> timeout) {
  DeviceGuard guard(device_);
  if (!pollUntilReady([&] { return cudaStreamQuery(stream_); }, deadlineAfter(timeout), "cudaStreamQuery"))
    throw TimeoutError(describe() + ": flush: the copies issued so far did not complete within " +
                       std::to_string(timeout.count()) + " s");
  streamBusy_ = false;
  flushedUpTo_ = flushTickets_;  // the stream is idle: every flush point so far is behind it
  for (auto& point : flushPoints_) spareEvents_.push_back(point.second);
  flushPoints_.clear();
}

std::uint64_t CudaIpcConnection::doBeginFlush() {
  const std::uint64_t ticket = ++flushTickets_;
  if (!streamBusy_ && flushPoints_.empty()) {
    flushedUpTo_ = ticket;  // nothing queued since the stream was last seen idle
    return ticket;
  }
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  if (spareEvents_.empty()) {
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spareEvents_.back();
    spareEvents_.pop_back();
  }
  FERRY_CUDA_CHECK(cudaEventRecord(event, stream_));
  flushPoints_.emplace_back(ticket, event);
  return ticket;
}

bool CudaIpcConnection::doFlushComplete(std::uint64_t ticket) {
  if (ticket <= flushedUpTo_) return true;
  DeviceGuard guard(device_);
  while (!flushPoints_.empty()) {
    const auto [point, event] = flushPoints_.front();
    const cudaError_t err = cudaEventQuery(event);
    if (err == cudaErrorNotReady) break;
    if (err != cudaSuccess) detail::throwCudaError(err, "cudaEventQuery", SourceLocation::current());
    flushedUpTo_ = point;
    spareEvents_.push_back(event);
    flushPoints_.pop_front();
  }
  return ticket <= flushedUpTo_;
}

}  // namespace ferry
