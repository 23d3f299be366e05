#pragma once
// CudaIpcConnection: same host, GPU memory (or registered host memory) mapped into this process.
// Every operation is a copy-engine copy (cudaMemcpyAsync) on one non-blocking stream that belongs
// to this connection, so operations complete in issue order.
//
// updateAndSync copies the value from a slot of a small pinned staging ring, on the same stream:
// the copy engine reads the slot when it runs, after the earlier copies have landed, so the value
// is visible at the destination only after the data. A slot is reused only after the event recorded
// behind its copy has completed (a bounded wait), so a value is never overwritten before it is read.
// flush polls the stream (cudaStreamQuery) until it is idle or the timeout passes; beginFlush
// records an event on the stream instead, and flushComplete queries the events, oldest first.
#include <cuda_runtime_api.h>

#include <array>
#include <deque>
#include <utility>
#include <vector>

#include "ferry/connection.hpp"

namespace ferry {

class CudaIpcConnection final : public Connection {
 public:
  static constexpr int kStagingSlots = 64;

  // @pre device is a valid CUDA device; the stream, ring and events are made on it.
  CudaIpcConnection(int rank, int remoteRank, int device);
  // Waits (bounded by FERRY_CONNECTION_TIMEOUT) for the copies in flight, then frees everything.
  ~CudaIpcConnection() override;

  int device() const noexcept { return device_; }
  // cudaMemcpyAsync reads any GPU memory of this process.
  bool readsLocalPointers() const override { return true; }

 protected:
  void doWrite(void* dst, const void* src, std::uint64_t bytes) override;
  void doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t newValue) override;
  void doFlush(std::chrono::duration<double> timeout) override;
  std::uint64_t doBeginFlush() override;
  bool doFlushComplete(std::uint64_t ticket) override;

 private:
  // Waits until event completes; TimeoutError naming `what` after timeout.
  void waitEvent(cudaEvent_t event, std::chrono::duration<double> timeout, const char* what);

  int device_;
  cudaStream_t stream_ = nullptr;
  std::uint64_t* ring_ = nullptr;  // kStagingSlots words of pinned host memory
  std::array<cudaEvent_t, kStagingSlots> events_{};
  std::array<bool, kStagingSlots> inFlight_{};
  std::uint64_t next_ = 0;
  bool streamBusy_ = false;  // something was queued on stream_ since it was last seen idle
  // Asynchronous flushes: points not yet seen complete (ticket, event), oldest first; events to
  // reuse; tickets handed out; every ticket up to flushedUpTo_ is complete.
  std::deque<std::pair<std::uint64_t, cudaEvent_t>> flushPoints_;
  std::vector<cudaEvent_t> spareEvents_;
  std::uint64_t flushTickets_ = 0;
  std::uint64_t flushedUpTo_ = 0;
};

}  // namespace ferry
