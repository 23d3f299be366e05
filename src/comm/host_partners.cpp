#include "comm/host_partners.hpp"

#include <future>
#include <string>

#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "platform/cuda_check.hpp"
#include "platform/device_upload.hpp"

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

HostPartners::HostPartners(std::shared_ptr<Bootstrap> partners, std::uint64_t scratchBytes,
                           HostPartnersOptions options)
    : bootstrap_(checkedPartners(std::move(partners))),
      comm_(bootstrap_),
      options_(std::move(options)),
      // (The proxy starts at the first call, once the members its callbacks read are set.)
      service_(512, std::chrono::microseconds(20), [this] { watch(); },
               [this] {
                 __atomic_store_n(&words_[1], 1u, __ATOMIC_RELEASE);
                 if (options_.onFailure) options_.onFailure();
               }) {
  const int me = host(), n = hosts();
  if (!options_.worldRanks.empty() && static_cast<int>(options_.worldRanks.size()) != n)
    throw Error(ErrorCode::InternalError, "HostPartners: " + std::to_string(options_.worldRanks.size()) +
                                              " world ranks for " + std::to_string(n) + " hosts");
  const std::string who = this->who() + ": HostPartners: ";
  slotBytes_ = scratchBytes / static_cast<std::uint64_t>(n) / 16 * 16;
  // A put lands in its sender's slot of the receiver's scratch: every partner must cut the same
  // slots (ranks given different FERRY_SCRATCH_BYTES would write across each other's).
  std::vector<std::uint64_t> slots(static_cast<std::size_t>(n));
  slots[static_cast<std::size_t>(me)] = slotBytes_;
  bootstrap_->allGather(slots.data(), sizeof(std::uint64_t));
  for (int p = 0; p < n; ++p)
    if (slots[static_cast<std::size_t>(p)] != slotBytes_)
      throw Error(ErrorCode::InvalidUsage, who + "its slots are " + std::to_string(slotBytes_) +
                                               " bytes and those of rank " + std::to_string(worldRankOf(p)) +
                                               " (host " + std::to_string(p) + ") " +
                                               std::to_string(slots[static_cast<std::size_t>(p)]) +
                                               "; give every rank the same FERRY_SCRATCH_BYTES");
  if (slotBytes_ == 0)
    throw Error(ErrorCode::InvalidUsage, who + std::to_string(scratchBytes) +
                                             " bytes of scratch leave no 16-byte slot per host; give more");
  // FERRY_PARTNER_SCRATCH=host: page-locked host memory the GPU maps (hostAlloc), which the
  // connection's receiver writes straight from the socket and the kernel reads over PCIe (faster
  // than any network); device: GPU memory, each chunk copied in through page-locked buffers.
  const std::uint64_t scratchSize = partnerScratchBytes(slotBytes_, n);  // (the slots, then the digests)
  scratch_ = env().partnerScratch == "host" ? hostAlloc(scratchSize) : gpuAlloc(scratchSize);
  // Kept for the object's life: a registration lives while a copy of it does here, and the
  // partners' puts name it (the descriptors they hold do not keep it alive in this process).
  scratchRegistration_ = comm_.registerMemory(scratch_.get(), scratchSize, Transport::Ethernet);
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
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words_), 4 * sizeof(std::uint32_t),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  words_[0] = words_[1] = words_[2] = words_[3] = 0;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&wordsDevice_), words_, 0));
  // The channels' waits name world ranks in their timeout reports, and give up at once on a
  // failure or an abort (words_[1]) instead of at their timeout.
  auto named = [&](PortChannelDeviceHandle h, int p) {
    h.semaphore.wait_.rank = h.fifo.wait.rank = worldRankOf(me);
    h.semaphore.wait_.peer = worldRankOf(p);
    h.fifo.wait.peer = -1;  // (the FIFO waits for this rank's own proxy)
    h.semaphore.wait_.abortFlag = h.fifo.wait.abortFlag = wordsDevice_ + 1;
    return h;
  };
  PartnerChannels channels;
  channels.waitingOn = wordsDevice_;
  channels.waitingOnAcks = wordsDevice_ + 3;
  channels.mismatch = wordsDevice_ + 2;
  channels.scratch = static_cast<char*>(scratch_.get());
  channels.slotBytes = slotBytes_;
  channels.host = me;
  channels.hosts = n;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    channels.scratchOf[p] = service_.addMemory(theirs[p].get());
    data_[p]->awaitPeer();  // here, not on the proxy thread at its first signal
    acks_[p]->awaitPeer();
    channels.data[p] = named(service_.addChannel(data_[p]).deviceHandle(), p);
    channels.ack[p] = named(service_.addChannel(acks_[p]).deviceHandle(), p);
  }
  preloadPartnerExchange();
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), sizeof(PartnerChannels)));
  try {
    uploadNow(device_, &channels, sizeof(PartnerChannels));  // (the caller's stream reads it)
  } catch (...) {
    (void)cudaFree(device_);
    throw;
  }
}

HostPartners::~HostPartners() {
  try {
    service_.stop();
  } catch (const std::exception& e) {
    FERRY_LOG(Warn, Collectives) << who() << ": the partners' proxy had failed: " << e.what();
  }
  (void)cudaFree(device_);
  if (words_ != nullptr) (void)cudaFreeHost(words_);
}

std::string HostPartners::who() const {
  return "rank " + std::to_string(worldRankOf(host())) + " (host " + std::to_string(host()) + ")";
}

int HostPartners::worldRankOf(int h) const {
  if (h == host() && options_.worldRank >= 0) return options_.worldRank;
  return options_.worldRanks.empty() ? h : options_.worldRanks[static_cast<std::size_t>(h)];
}

void HostPartners::watch() {
  const auto now = std::chrono::steady_clock::now();
  if (now < nextWatch_) return;
  nextWatch_ = now + std::chrono::milliseconds(1);
  // A partner whose exchange differed from this rank's: the calls cannot go on (their results are
  // garbage); failing the proxy tells this host's other ranks and makes every wait give up.
  if (__atomic_load_n(&words_[2], __ATOMIC_ACQUIRE) != 0) throw Error(ErrorCode::InvalidUsage, mismatchText());
  // Only the partner a kernel waits for: one that closes its connection when nothing more is needed
  // of it is done (its Comm went first at the end of a job, or at the end of a call it has no more
  // part in), not a failure.
  const std::uint32_t waited =
      __atomic_load_n(&words_[0], __ATOMIC_ACQUIRE) | __atomic_load_n(&words_[3], __ATOMIC_ACQUIRE);
  if (waited == 0) return;
  for (int p = 0; p < hosts(); ++p) {
    if (p == host() || (waited >> p & 1u) == 0) continue;
    if (std::string why = connections_[p]->failure(); !why.empty())
      throw Error(ErrorCode::RemoteError, why);  // (throwFailure names the partner)
  }
}

void HostPartners::abort() { __atomic_store_n(&words_[1], 1u, __ATOMIC_RELEASE); }

bool HostPartners::failed() const { return __atomic_load_n(&words_[1], __ATOMIC_ACQUIRE) != 0; }

std::string HostPartners::mismatchText() const {
  const int p = static_cast<int>(__atomic_load_n(&words_[2], __ATOMIC_ACQUIRE)) - 1;
  return partnerMismatchText(who(), worldRankOf(p), p);
}

void HostPartners::throwFailure() const {
  if (__atomic_load_n(&words_[2], __ATOMIC_ACQUIRE) != 0) throw Error(ErrorCode::InvalidUsage, mismatchText());
  std::exception_ptr failed = service_.error();
  if (!failed) throw Error(ErrorCode::InvalidUsage, who() + ": the calls across hosts were aborted; destroy the Comm");
  std::string why;
  try {
    std::rethrow_exception(failed);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an unknown error";
  }
  // The connections name partners by host; the world's rank is what the caller knows. (With two
  // hosts the partner is known even before its connection's receiver has seen it go.)
  for (int p = 0; p < hosts(); ++p)
    if (p != host() && (hosts() == 2 || !connections_[p]->failure().empty()))
      throw Error(ErrorCode::RemoteError, who() + ": rank " + std::to_string(worldRankOf(p)) + " (host " +
                                              std::to_string(p) + "), this rank's partner, went away during a call " +
                                              "across hosts (" + why + "; the connection counts hosts as ranks" +
                                              "); this Comm cannot go on: destroy it on every rank that is left");
  throw Error(ErrorCode::RemoteError, who() + ": the partners' proxy failed during a call across hosts (" + why +
                                          "); this Comm cannot go on: destroy it on every rank");
}

const PartnerChannels* HostPartners::start() {
  if (failed()) throwFailure();
  if (!service_.running()) {
    // (A proxy that has just failed, before its onFailure raised the word: not restarted.)
    if (service_.error()) throwFailure();
    service_.start();
  }
  return device_;
}

void HostPartners::allReduce(void* buf, std::size_t count, DataType type, ReduceOp op, int divisor,
                             cudaStream_t stream) {
  if (count == 0) return;
  if (divisor < 1)
    throw Error(ErrorCode::InvalidUsage, who() + ": HostPartners::allReduce: divisor " +
                                             std::to_string(divisor) +
                                             " (the ranks an average spans) must be positive");
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
    throw Error(ErrorCode::InternalError, who() + ": HostPartners::exchange names a host that is not a partner");
  launchPartnerExchange(start(), slotBytes_, x, type, op, stream);
}

}  // namespace ferry
