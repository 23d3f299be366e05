#include "comm/staging.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "platform/cuda_check.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kAlign = 256;  // where the staged recv starts after the send: any type's vectors fit

std::uint64_t alignUp(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace

StagedLayout stagedLayout(const CollectiveCall& call) {
  const std::uint64_t es = call.elementBytes();
  const std::uint64_t sendBytes = call.usesSend() ? call.sendElements() * es : 0;
  const std::uint64_t recvBytes = call.usesRecv() ? call.recvElements() * es : 0;
  StagedLayout l;
  l.outBytes = recvBytes;
  if (call.usesSend() && call.usesRecv() && call.inPlace()) {
    // One buffer holds the other: stage the outer one whole, the inner at the same distance.
    const auto* send = static_cast<const char*>(call.send);
    const auto* recv = static_cast<const char*>(call.recv);
    const char* outer = std::min(send, recv);
    l.bytes = std::max(sendBytes, recvBytes);
    l.sendOffset = static_cast<std::uint64_t>(send - outer);
    l.recvOffset = static_cast<std::uint64_t>(recv - outer);
    l.inFrom = outer;
    l.inBytes = l.bytes;
    return l;
  }
  l.sendOffset = 0;
  l.recvOffset = alignUp(sendBytes, kAlign);
  l.bytes = l.recvOffset + recvBytes;
  l.inFrom = sendBytes ? call.send : nullptr;
  l.inBytes = sendBytes;
  return l;
}

std::uint64_t grownCapacity(std::uint64_t bytes, std::uint64_t capacity) {
  return alignUp(std::max(bytes, 2 * capacity), std::uint64_t{2} << 20);
}

void refuseGrowthInCapture(const CollectiveCall& call, const std::string& why) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FERRY_CUDA_CHECK(cudaStreamIsCapturing(call.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(ErrorCode::InvalidUsage,
                describe(call) + ": " + why +
                    "; that cannot happen while the stream is being captured. Run a call of this size once "
                    "before capturing");
}

CollectiveCall Staging::stageIn(const CollectiveCall& call) {
  const StagedLayout l = stagedLayout(call);
  if (l.bytes > capacity()) {
    refuseGrowthInCapture(
        call,
        "its buffers are not registered (Comm::registerBuffer would avoid this), so the algorithm runs on "
        "a staging buffer, which must grow to " +
            std::to_string(l.bytes) + " bytes");
    grow(l.bytes);
  }
  const Buffer& b = buffers_.back();
  auto* base = static_cast<char*>(b.memory.get());
  if (l.inBytes)
    FERRY_CUDA_CHECK(
        cudaMemcpyAsync(base, l.inFrom, l.inBytes, cudaMemcpyDeviceToDevice, call.stream));
  CollectiveCall staged = call;
  staged.send = call.usesSend() ? base + l.sendOffset : nullptr;
  staged.recv = call.usesRecv() ? base + l.recvOffset : nullptr;
  staged.sendId = call.usesSend() ? b.id : 0;
  staged.sendOffset = l.sendOffset;
  staged.recvId = call.usesRecv() ? b.id : 0;
  staged.recvOffset = l.recvOffset;
  return staged;
}

void Staging::stageOut(const CollectiveCall& call, const CollectiveCall& staged) {
  const std::uint64_t bytes = stagedLayout(call).outBytes;  // the layout is the one account of the copies
  if (bytes)
    FERRY_CUDA_CHECK(cudaMemcpyAsync(call.recv, staged.recv, bytes, cudaMemcpyDeviceToDevice, call.stream));
}

void Staging::grow(std::uint64_t bytes) {
  const std::uint64_t want = grownCapacity(bytes, capacity());
  Buffer b;
  std::string failure;
  try {
    b.memory = gpuAlloc(want);
    b.bytes = want;
  } catch (const Error& e) {
    failure = e.what();
  }
  // A rank whose allocation failed still takes part in the (collective) registration, with nothing
  // to register: every rank then refuses it together instead of waiting for this one.
  try {
    b.id = registry_.add(b.memory.get(), b.bytes);
  } catch (const Error& e) {
    if (failure.empty()) throw;
    throw Error(e.code(), "staging buffer of " + std::to_string(want) + " bytes: " + failure + "; " + e.what());
  }
  buffers_.push_back(std::move(b));
}

}  // namespace ferry
