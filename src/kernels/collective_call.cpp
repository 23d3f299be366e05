#include "kernels/collective_call.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "ferry/errors.hpp"
#include "kernels/pointer_check.hpp"
#include "core/text.hpp"

namespace ferry {
namespace {

const char* apiName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "allReduce";
    case Collective::AllGather: return "allGather";
    case Collective::ReduceScatter: return "reduceScatter";
    case Collective::AllToAll: return "allToAll";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
  }
  return "collective";
}

// Asking CUDA about a pointer is not a stream operation, but it is skipped while the stream is being
// captured: a capture must not see calls it could object to. device < 0 skips it too.
bool mayAskAboutPointers(int device, cudaStream_t stream) {
  if (device < 0) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) (void)cudaGetLastError();
  return capture == cudaStreamCaptureStatusNone;
}

// Throws bad(...) when [p, p + bytes) is not device memory of `device` (pointer_check.hpp).
template <class Bad>
void checkDeviceMemory(const void* p, std::uint64_t bytes, const char* what, int device, cudaStream_t stream, Bad&& bad) {
  if (std::string why = whyNotDeviceMemory(p, bytes, device, stream); !why.empty())
    throw bad(std::string(what) + " is " + why);
}

}  // namespace

std::size_t CollectiveCall::sendElements() const {
  switch (collective) {
    case Collective::ReduceScatter:
    case Collective::AllToAll: return count * static_cast<std::size_t>(worldSize);
    default: return count;
  }
}

std::size_t CollectiveCall::recvElements() const {
  switch (collective) {
    case Collective::AllGather:
    case Collective::AllToAll: return count * static_cast<std::size_t>(worldSize);
    default: return count;
  }
}

std::size_t CollectiveCall::bytes() const {
  return std::max(sendElements(), recvElements()) * elementBytes();
}

bool CollectiveCall::sumsInFloat32() const {
  const bool lowFloat = type == DataType::Float16 || type == DataType::BFloat16 || type == DataType::Fp8E4M3 ||
                        type == DataType::Fp8E5M2;
  return accumulation == Accumulation::Float32 && reduces() && lowFloat &&
         (op == ReduceOp::Sum || op == ReduceOp::Avg);
}

bool CollectiveCall::inPlace() const {
  const char* s = static_cast<const char*>(send);
  const char* r = static_cast<const char*>(recv);
  switch (collective) {
    case Collective::AllGather: return s == r + static_cast<std::size_t>(rank) * count * elementBytes();
    case Collective::ReduceScatter: return r == s + static_cast<std::size_t>(rank) * count * elementBytes();
    default: return s == r;
  }
}

std::string describe(const CollectiveCall& call) {
  return "rank " + std::to_string(call.rank) + ": " + apiName(call.collective);
}

void validateCall(const CollectiveCall& call, int device) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::InvalidUsage, describe(call) + ": " + what);
  };
  if (!isValid(call.type))
    throw bad("datatype " + std::to_string(static_cast<int>(call.type)) + " is not a ferry::DataType");
  if (call.reduces() && !isValid(call.op))
    throw bad("reduce op " + std::to_string(static_cast<int>(call.op)) + " is not a ferry::ReduceOp");
  if (call.accumulation != Accumulation::Stepwise && call.accumulation != Accumulation::Float32)
    throw bad("accumulation " + std::to_string(static_cast<int>(call.accumulation)) +
              " is not a ferry::Accumulation");
  if (call.rooted() && (call.root < 0 || call.root >= call.worldSize))
    throw bad("root " + std::to_string(call.root) + " is out of range [0, " + std::to_string(call.worldSize) + ")");
  const std::size_t esize = call.elementBytes();
  if (call.count > std::numeric_limits<std::size_t>::max() / esize / static_cast<std::size_t>(call.worldSize))
    throw bad("count " + std::to_string(call.count) + " is too large (its byte size overflows)");
  if (call.count == 0) return;  // nothing to do, nothing to check (as NCCL)
  const bool needsSend = call.usesSend(), needsRecv = call.usesRecv();
  if (needsSend && call.send == nullptr) throw bad("send buffer is null");
  if (needsRecv && call.recv == nullptr) throw bad("recv buffer is null");
  auto misaligned = [&](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % esize != 0; };
  if (needsSend && misaligned(call.send))
    throw bad("send buffer " + hexString(call.send) +
              " is not aligned to the element size " + std::to_string(esize));
  if (needsRecv && misaligned(call.recv))
    throw bad("recv buffer " + hexString(call.recv) +
              " is not aligned to the element size " + std::to_string(esize));
  if (needsSend && needsRecv && !call.inPlace()) {
    const auto s = reinterpret_cast<std::uintptr_t>(call.send), r = reinterpret_cast<std::uintptr_t>(call.recv);
    const std::size_t sb = call.sendElements() * esize, rb = call.recvElements() * esize;
    if (s < r + rb && r < s + sb)
      throw bad("send and recv buffers overlap but the call is not in place (in place: " +
                std::string(call.collective == Collective::AllGather       ? "send == recv + rank * sendCount"
                            : call.collective == Collective::ReduceScatter ? "recv == send + rank * recvCount"
                                                                           : "send == recv") +
                ")");
  }
  if (needsSend) checkDeviceMemory(call.send, call.sendElements() * esize, "send buffer", device, call.stream, bad);
  if (needsRecv) checkDeviceMemory(call.recv, call.recvElements() * esize, "recv buffer", device, call.stream, bad);
}

void validatePreMul(const CollectiveCall& call, const PreMulSum& op, int device) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::InvalidUsage, describe(call) + " with a PreMulSum op: " + what);
  };
  if (op.factor == nullptr) throw bad("the factor is null (it points to one element of the call's type)");
  if (op.onDevice) {
    checkDeviceMemory(op.factor, call.elementBytes(), "the factor (onDevice)", device, call.stream, bad);
  } else if (mayAskAboutPointers(device, call.stream)) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, op.factor) != cudaSuccess) (void)cudaGetLastError();
    if (attr.type == cudaMemoryTypeDevice)
      throw bad(
          "the factor is device memory but onDevice is false; set onDevice to read it when the call runs");
  }
}

std::string describe(const PeerCall& call) {
  return "rank " + std::to_string(call.rank) + (call.isSend ? ": send to rank " : ": recv from rank ") +
         std::to_string(call.peer);
}

void validatePeerCall(const PeerCall& call, int device) {
  auto bad = [&](const std::string& what) { return Error(ErrorCode::InvalidUsage, describe(call) + ": " + what); };
  if (!isValid(call.type))
    throw bad("datatype " + std::to_string(static_cast<int>(call.type)) + " is not a ferry::DataType");
  if (call.peer < 0 || call.peer >= call.worldSize)
    throw bad("peer " + std::to_string(call.peer) + " is out of range [0, " + std::to_string(call.worldSize) + ")");
  const std::size_t esize = sizeOf(call.type);
  if (call.count > std::numeric_limits<std::size_t>::max() / esize)
    throw bad("count " + std::to_string(call.count) + " is too large (its byte size overflows)");
  if (call.count == 0) return;
  if (call.buffer == nullptr) throw bad("buffer is null");
  if (reinterpret_cast<std::uintptr_t>(call.buffer) % esize != 0)
    throw bad("buffer " + hexString(call.buffer) + " is not aligned to the element size " + std::to_string(esize));
  checkDeviceMemory(call.buffer, call.count * esize, "buffer", device, call.stream, bad);
}

}  // namespace ferry
