#include "comm/host_partners.hpp"

#include <future>
#include <string>

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {
namespace {

// The partners' own tags: their connections, the data channels' semaphores, the acks' semaphores.
constexpr int kConnectTag = 0x7061, kDataTag = 0x7062, kAckTag = 0x7063;

std::shared_ptr<Bootstrap> checkedPartners(std::shared_ptr<Bootstrap> b) {
  if (!b) throw Error(ErrorCode::InvalidUsage, "HostPartners: the partners' bootstrap is null");
  if (b->size() > kMaxHosts)
    throw Error(ErrorCode::NotSupported, "rank " + std::to_string(b->rank()) + ": HostPartners: " +
                                             std::to_string(b->size()) + " hosts; at most " +
                                             std::to_string(kMaxHosts) + " are supported");
  return b;
}

}  // namespace

HostPartners::HostPartners(std::shared_ptr<Bootstrap> partners, std::uint64_t scratchBytes)
    : bootstrap_(checkedPartners(std::move(partners))), comm_(bootstrap_), service_(512, std::chrono::microseconds(20)) {
  const int me = host(), n = hosts();
  const std::string who = "host " + std::to_string(me) + " of " + std::to_string(n) + ": HostPartners: ";
  slotBytes_ = scratchBytes / static_cast<std::uint64_t>(n) / 16 * 16;
  if (slotBytes_ == 0)
    throw Error(ErrorCode::InvalidUsage, who + std::to_string(scratchBytes) +
                                             " bytes of scratch leave no 16-byte slot per host; give more");
  scratch_ = gpuAlloc(slotBytes_ * static_cast<std::uint64_t>(n));
  // Kept for the object's life: a registration lives while a copy of it does here, and the
  // partners' puts name it (the descriptors they hold do not keep it alive in this process).
  scratchRegistration_ = comm_.registerMemory(scratch_.get(), slotBytes_ * n, Transport::Ethernet);
  const RegisteredMemory& mine = scratchRegistration_;
  // Everything posted first, then received: one round of bootstrap traffic (communicator.hpp).
  std::vector<std::shared_future<std::shared_ptr<Connection>>> pending(static_cast<std::size_t>(n));
  std::vector<std::shared_future<RegisteredMemory>> theirs(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    pending[p] = comm_.connect(p, Transport::Ethernet, kConnectTag);
    comm_.sendMemory(mine, p, kConnectTag);
    theirs[p] = comm_.recvMemory(p, kConnectTag);
  }
  connections_.resize(static_cast<std::size_t>(n));
  data_.resize(static_cast<std::size_t>(n));
  acks_.resize(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    connections_[p] = pending[p].get();
    data_[p] = std::make_shared<Host2DeviceSemaphore>(comm_, connections_[p], kDataTag);
    acks_[p] = std::make_shared<Host2DeviceSemaphore>(comm_, connections_[p], kAckTag);
  }
  PartnerChannels channels;
  channels.scratch = static_cast<char*>(scratch_.get());
  channels.slotBytes = slotBytes_;
  channels.host = me;
  channels.hosts = n;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    channels.scratchOf[p] = service_.addMemory(theirs[p].get());
    data_[p]->awaitPeer();  // here, not on the proxy thread at its first signal
    acks_[p]->awaitPeer();
    channels.data[p] = service_.addChannel(data_[p]).deviceHandle();
    channels.ack[p] = service_.addChannel(acks_[p]).deviceHandle();
  }
  preloadPartnerExchange();
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), sizeof(PartnerChannels)));
  try {
    FERRY_CUDA_CHECK(cudaMemcpy(device_, &channels, sizeof(PartnerChannels), cudaMemcpyHostToDevice));
  } catch (...) {
    (void)cudaFree(device_);
    throw;
  }
}

HostPartners::~HostPartners() {
  try {
    service_.stop();
  } catch (const std::exception& e) {
    FERRY_LOG(Error, Collectives) << "host " << host() << ": the partners' proxy had failed: " << e.what();
  }
  (void)cudaFree(device_);
}

const PartnerChannels* HostPartners::start() {
  if (service_.running()) return device_;
  if (std::exception_ptr failed = service_.error()) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::RemoteError, "host " + std::to_string(host()) +
                                              ": the partners' proxy failed on an earlier call (" + e.what() +
                                              "); make new HostPartners");
    }
  }
  service_.start();
  return device_;
}

void HostPartners::allReduce(void* buf, std::size_t count, DataType type, ReduceOp op, int divisor,
                             cudaStream_t stream) {
  if (count == 0) return;
  if (divisor < 1)
    throw Error(ErrorCode::InvalidUsage, "host " + std::to_string(host()) + ": HostPartners::allReduce: divisor " +
                                             std::to_string(divisor) + " (the ranks an average spans) must be positive");
  PartnerExchange x;
  x.src = static_cast<const char*>(buf);
  x.dst = static_cast<char*>(buf);
  x.count = count;
  x.sendTo = x.recvFrom = everyOtherHost();
  x.reduce = true;
  x.divisor = divisor;
  exchange(x, type, op, stream);
}

std::uint32_t HostPartners::everyOtherHost() const {
  return ((1u << hosts()) - 1u) & ~(1u << host());  // (hosts() <= kMaxHosts < 32)
}

void HostPartners::exchange(const PartnerExchange& x, DataType type, ReduceOp op, cudaStream_t stream) {
  if (x.count == 0) return;
  const std::uint32_t others = everyOtherHost();
  if ((x.sendTo & ~others) != 0 || (x.recvFrom & ~others) != 0)
    throw Error(ErrorCode::InternalError, "host " + std::to_string(host()) +
                                              ": HostPartners::exchange names a host that is not a partner");
  launchPartnerExchange(start(), slotBytes_, x, type, op, stream);
}

}  // namespace ferry
