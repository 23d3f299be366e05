#include "comm/comm_resources.hpp"

#include "kernels/registration.hpp"
#include "platform/cuda_check.hpp"
#include "ferry/env.hpp"
#include "core/text.hpp"
#include "core/deadline.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kAlign = 64 << 10;


}  // namespace

void raiseAbort(const CollectiveContext& context, cudaStream_t stream) {
  static const std::uint32_t kRaised = 1;
  for (int p = 0; p < context.nranks; ++p) {
    CallState* s = p == context.rank ? context.state : context.peerState[p];
    FERRY_CUDA_CHECK(cudaMemcpyAsync(&s->aborted, &kRaised, sizeof kRaised, cudaMemcpyHostToDevice, stream));
  }
  FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
}

CommResources::CommResources(Communicator& comm, std::uint64_t llSlotDataBytes, std::uint64_t scratchBytes) {
  const auto& boot = comm.bootstrap();
  const int rank = boot->rank(), size = boot->size();
  llSlotDataBytes = roundUp(std::max<std::uint64_t>(llSlotDataBytes, 8), 8);
  const std::uint64_t llSlotBytes = 2 * llSlotDataBytes;  // an LL16 packet carries half its bytes
  const std::uint64_t llHalf = roundUp(llSlotBytes * static_cast<std::uint64_t>(size), kAlign);
  const std::uint64_t scratchHalf = roundUp(std::max<std::uint64_t>(scratchBytes / 2, 16), kAlign);

  const std::uint64_t flagsOffset = roundUp(sizeof(CallState), 256);  // the call state first
  const std::uint64_t descriptorsOffset = roundUp(flagsOffset + sizeof(std::uint64_t) * kFlagSlots * kMaxRanks, 256);
  const std::uint64_t llOffset = roundUp(descriptorsOffset + sizeof(DirectDescriptor) * 2 * kMaxRanks, kAlign);
  const std::uint64_t scratchOffset = llOffset + 2 * llHalf;
  const std::uint64_t total = scratchOffset + 2 * scratchHalf;

  constexpr int kTag = 0x6c6c;  // the Comm's own tag for this exchange
  memory_ = std::make_unique<PeerMemory>(comm, total, kTag, "the collectives' buffers");

  char* base = memory_->local();
  context_.rank = rank;
  context_.nranks = size;
  context_.state = reinterpret_cast<CallState*>(base);
  context_.flags = reinterpret_cast<std::uint64_t*>(base + flagsOffset);
  context_.descriptors = reinterpret_cast<DirectDescriptor*>(base + descriptorsOffset);
  context_.ll = base + llOffset;
  context_.scratch = base + scratchOffset;
  for (int p = 0; p < size; ++p) {
    char* peerBase = memory_->peer(p);
    context_.peerState[p] = reinterpret_cast<CallState*>(peerBase);
    context_.peerFlags[p] = reinterpret_cast<std::uint64_t*>(peerBase + flagsOffset);
    context_.peerDescriptors[p] = reinterpret_cast<DirectDescriptor*>(peerBase + descriptorsOffset);
    context_.peerLl[p] = peerBase + llOffset;
    context_.peerScratch[p] = peerBase + scratchOffset;
  }
  context_.llHalfBytes = llHalf;
  context_.llSlotBytes = llSlotBytes;
  context_.scratchHalfBytes = scratchHalf;
  context_.timeoutNs = timeoutNanoseconds(env().deviceTimeout);
  // Programmatic dependent launch came with compute capability 9.0.
  int device = 0, major = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  context_.earlyLaunch = env().launchPdl && major >= 9;
  if (env().phaseStamps) {
    stamps_ = std::make_unique<PhaseStamps>(rank);
    context_.stamps = stamps_->ring();
  }

  limits_.worldSize = size;
  limits_.llSlotDataBytes = llSlotDataBytes;
  limits_.scratchHalfBytes = scratchHalf;
}

}  // namespace ferry
