#include "kernels/copy_engine_host.hpp"

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "platform/cuda_check.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

// Polls query() until it stops answering cudaErrorNotReady; false once `timeout` has passed.
// Spins first (a flush usually ends within microseconds of being asked), then sleeps briefly.
template <class Query>
bool pollReady(Query query, std::chrono::duration<double> timeout, const char* call) {
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t err = query();
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) detail::throwCudaError(err, call, SourceLocation::current());
    if (polls < 2000) continue;
    if (Clock::now() - start > timeout) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(2));
  }
}

}  // namespace

CopyEngine::CopyEngine(int rank, int worldSize, int device) : rank_(rank), worldSize_(worldSize), device_(device) {
  try {
    for (int s = 0; s < worldSize_; ++s) {
      FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[s], cudaStreamNonBlocking));
      for (auto& set : events_) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&set[s], cudaEventDisableTiming));
    }
    FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&locks_), sizeof(std::uint32_t) * kCeStreams));
    FERRY_CUDA_CHECK(cudaMemset(locks_, 0, sizeof(std::uint32_t) * kCeStreams));
    ProxyOptions options;
    options.fifo.device = device_;
    options.fifo.rank = rank_;
    // Idle between calls: doze rather than hold a core; a call pays at most this much more once.
    options.idleSleep = std::chrono::microseconds(20);
    proxy_ = std::make_unique<Proxy>([this](ProxyTrigger t) { return handleTrigger(t); }, options);
  } catch (...) {
    if (locks_ != nullptr) (void)cudaFree(locks_);
    for (int s = 0; s < worldSize_; ++s) {
      for (auto& set : events_)
        if (set[s] != nullptr) (void)cudaEventDestroy(set[s]);
      if (streams_[s] != nullptr) (void)cudaStreamDestroy(streams_[s]);
    }
    throw;
  }
}

CopyEngine::~CopyEngine() {
  try {
    proxy_->stop();
  } catch (const std::exception& e) {
    FERRY_LOG(Error, Collectives) << "rank " << rank_ << ": the copy engine's proxy had failed: " << e.what();
  }
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  for (int s = 0; s < worldSize_; ++s) {
    try {
      if (!pollReady([&] { return cudaStreamQuery(streams_[s]); }, env().connectionTimeout, "cudaStreamQuery"))
        FERRY_LOG(Error, Collectives) << "rank " << rank_ << ": copies to rank " << s
                                      << " still in flight when the Comm was destroyed; freeing anyway";
    } catch (const std::exception& e) {
      FERRY_LOG(Error, Collectives) << "rank " << rank_ << ": copies to rank " << s << " failed: " << e.what();
    }
    for (auto& set : events_) (void)cudaEventDestroy(set[s]);
    (void)cudaStreamDestroy(streams_[s]);
  }
  (void)cudaFree(locks_);
  (void)cudaSetDevice(previous);
}

CopyEngineHandle CopyEngine::handle() {
  std::lock_guard lock(startMutex_);
  if (!proxy_->running()) {
    if (std::exception_ptr failed = proxy_->error()) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        throw Error(ErrorCode::RemoteError, "rank " + std::to_string(rank_) +
                                                ": the copy engine failed on an earlier call (" + e.what() +
                                                "); destroy the Comm and make a new one");
      }
    }
    proxy_->start();
  }
  return CopyEngineHandle{proxy_->fifo().deviceHandle(), locks_};
}

void CopyEngine::awaitCopies(int stream, cudaEvent_t upTo) const {
  const bool done = upTo != nullptr
                        ? pollReady([&] { return cudaEventQuery(upTo); }, env().deviceTimeout, "cudaEventQuery")
                        : pollReady([&] { return cudaStreamQuery(streams_[stream]); }, env().deviceTimeout,
                                    "cudaStreamQuery");
  if (!done)
    throw TimeoutError("rank " + std::to_string(rank_) + ": copy engine: the copies to rank " + std::to_string(stream) +
                       (upTo != nullptr ? " before a flush mark" : "") + " did not complete within FERRY_DEVICE_TIMEOUT (" +
                       std::to_string(env().deviceTimeout.count()) + " s); is that rank's GPU healthy?");
}

ProxyHandlerResult CopyEngine::handleTrigger(ProxyTrigger trigger) {
  const CeRequest r = CeRequest::decode(trigger);
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::InternalError, "rank " + std::to_string(rank_) + ": copy engine: " + why);
  };
  if (r.stream >= static_cast<std::uint32_t>(worldSize_)) throw bad("stream " + std::to_string(r.stream) + " out of range");
  switch (r.kind) {
    case CeKind::CopyTo:
      if (pending_[r.stream]) throw bad("a copy's destination was not followed by its source");
      pending_[r.stream] = r;
      break;
    case CeKind::CopyFrom: {
      if (!pending_[r.stream]) throw bad("a copy's source came without its destination");
      const CeRequest to = *std::exchange(pending_[r.stream], std::nullopt);
      FERRY_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(to.address), reinterpret_cast<const void*>(r.address),
                                       to.value, cudaMemcpyDefault, streams_[r.stream]));
      break;
    }
    case CeKind::Mark:
      if (r.value >= kCeMarks) throw bad("event set " + std::to_string(r.value) + " out of range");
      for (int s = 0; s < worldSize_; ++s) FERRY_CUDA_CHECK(cudaEventRecord(events_[r.value][s], streams_[s]));
      break;
    case CeKind::Flush:
      if (r.value >= kCeMarks) throw bad("event set " + std::to_string(r.value) + " out of range");
      for (int s = 0; s < worldSize_; ++s) awaitCopies(s, events_[r.value][s]);
      break;
    case CeKind::FlushAll:
      for (int s = 0; s < worldSize_; ++s) awaitCopies(s);
      break;
    case CeKind::FlushStream: awaitCopies(static_cast<int>(r.stream)); break;
    default: throw bad("unknown request kind " + std::to_string(static_cast<unsigned>(r.kind)));
  }
  return ProxyHandlerResult::Continue;
}

}  // namespace ferry
