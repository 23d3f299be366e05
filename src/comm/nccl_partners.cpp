#include "comm/nccl_partners.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {

NcclPartners::NcclPartners(std::shared_ptr<Bootstrap> partners, std::uint64_t scratchBytes, PartnersOptions options)
    : bootstrap_(std::move(partners)), options_(std::move(options)) {
  if (!bootstrap_) throw Error(ErrorCode::InvalidUsage, "NcclPartners: the partners' bootstrap is null");
  const int me = host(), n = hosts();
  if (n > kMaxHosts)
    throw Error(ErrorCode::NotSupported, who() + ": NcclPartners: " + std::to_string(n) + " hosts; at most " +
                                             std::to_string(kMaxHosts) + " are supported");
  if (!options_.worldRanks.empty() && static_cast<int>(options_.worldRanks.size()) != n)
    throw Error(ErrorCode::InternalError, "NcclPartners: " + std::to_string(options_.worldRanks.size()) +
                                              " world ranks for " + std::to_string(n) + " hosts");
  // Every partner learns whether every other one has NCCL and its slots before any of them starts
  // NCCL's collective init, so that a partner that cannot go on fails all of them alike, not a hang.
  std::string why;
  nccl_ = nccl_net::library(why);
  slotBytes_ = scratchBytes / static_cast<std::uint64_t>(n) / 16 * 16;
  struct Ready {
    std::uint64_t slotBytes;
    int ok;  // 1: NCCL opened (and, on host 0, the unique id made)
    int pad;
    nccl_net::UniqueId id;
  };
  std::vector<Ready> ready(static_cast<std::size_t>(n));
  Ready& mine = ready[static_cast<std::size_t>(me)];
  mine.slotBytes = slotBytes_;
  mine.ok = nccl_ != nullptr ? 1 : 0;
  if (nccl_ != nullptr && me == 0) {
    if (const int r = nccl_->getUniqueId(&mine.id); r != nccl_net::kSuccess) {
      mine.ok = 0;
      why = nccl_net::describe(*nccl_, nullptr, "ncclGetUniqueId", r);
    }
  }
  bootstrap_->allGather(ready.data(), sizeof(Ready));
  const std::string phase = ": the cross-host phase on NCCL's network (FERRY_PARTNER_NET): ";
  if (mine.ok == 0) throw Error(ErrorCode::NotSupported, who() + phase + "NVIDIA's NCCL cannot serve it: " + why);
  for (int p = 0; p < n; ++p) {
    const Ready& r = ready[static_cast<std::size_t>(p)];
    const std::string them = "rank " + std::to_string(worldRankOf(p)) + " (host " + std::to_string(p) + ")";
    if (r.ok == 0)
      throw Error(ErrorCode::NotSupported, who() + phase + them + " cannot open NVIDIA's NCCL or make its id; "
                                                             "it says why");
    // A round's sends and recvs must name the same bytes on both sides.
    if (r.slotBytes != slotBytes_)
      throw Error(ErrorCode::InvalidUsage, who() + phase + "its slots are " + std::to_string(slotBytes_) +
                                               " bytes and those of " + them + " " + std::to_string(r.slotBytes) +
                                               "; give every rank the same FERRY_SCRATCH_BYTES");
  }
  if (slotBytes_ == 0)
    throw Error(ErrorCode::InvalidUsage, who() + phase + std::to_string(scratchBytes) +
                                             " bytes of scratch leave no 16-byte slot per host; give more");
  scratch_ = gpuAlloc(slotBytes_ * static_cast<std::uint64_t>(n));
  digests_ = gpuAlloc(sizeof(std::uint64_t) * (1 + kMaxHosts));
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&mismatch_), sizeof(std::uint32_t),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  mismatchMemory_ = std::shared_ptr<void>(mismatch_, [](void* p) { (void)cudaFreeHost(p); });
  *mismatch_ = 0;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mismatchDevice_), mismatch_, 0));
  preloadPartnerExchange();  // (its reduce: a first launch behind NCCL's waiting kernel would wait for it)
  check(nccl_->commInitRank(&comm_, n, ready[0].id, me), "ncclCommInitRank", "the partners' communicator");
  watchdog_ = std::thread([this] { watch(); });
  FERRY_LOG(Info, Collectives) << who() << ": partners on NCCL " << nccl_->version << ", " << n << " hosts";
}

void NcclPartners::watch() {
  while (!stopping_.load(std::memory_order_acquire)) {
    // A partner whose exchange differed from this rank's: the calls cannot go on (their results are
    // garbage); ending the partners ends this host's calls too, and the next call throws.
    if (const std::uint32_t h = __atomic_load_n(mismatch_, __ATOMIC_ACQUIRE); h != 0) {
      mismatchHost_.store(static_cast<int>(h) - 1, std::memory_order_release);
      end(partnerMismatchText(who(), worldRankOf(static_cast<int>(h) - 1), static_cast<int>(h) - 1), true);
      return;
    }
    int async = nccl_net::kSuccess, r = nccl_net::kSuccess;
    {
      std::lock_guard lock(ncclMu_);  // (not while end() aborts the communicator)
      if (aborted_.load(std::memory_order_acquire)) return;
      r = nccl_->commGetAsyncError(comm_, &async);
    }
    if (r != nccl_net::kSuccess || (async != nccl_net::kSuccess && async != nccl_net::kInProgress)) {
      end(nccl_net::describe(*nccl_, comm_, "ncclCommGetAsyncError", r != nccl_net::kSuccess ? r : async), true);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void NcclPartners::end(const std::string& why, bool failure) {
  // Not while a group is queued (group() holds ncclMu_ for microseconds); but where NCCL blocks in
  // one (a partner that never comes to their first connection), that group aborts when it returns.
  std::unique_lock abortLock(ncclMu_, std::defer_lock);
  for (int tries = 0; tries < 1000 && !abortLock.try_lock(); ++tries)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    std::lock_guard lock(whyMu_);
    if (comm_ == nullptr || aborted_.load()) return;
    why_ = why;
    failed_.store(failure, std::memory_order_release);
    aborted_.store(true, std::memory_order_release);
  }
  // First this host's calls (their ranks may wait for this one in a phase on the host), then NCCL's
  // kernels, which its abort ends.
  if (failure && options_.onFailure) options_.onFailure();
  if (abortLock.owns_lock())
    abortComm();
  else
    abortPending_.store(true, std::memory_order_release);
}

void NcclPartners::abortComm() {
  if (const int r = nccl_->commAbort(comm_); r != nccl_net::kSuccess)
    FERRY_LOG(Warn, Collectives) << who() << ": " << nccl_net::describe(*nccl_, nullptr, "ncclCommAbort", r);
}

NcclPartners::~NcclPartners() {
  stopping_.store(true, std::memory_order_release);
  if (watchdog_.joinable()) watchdog_.join();
  if (abortPending_.exchange(false)) abortComm();  // (no group is queued any more)
  // (An aborted communicator is gone already.)
  if (comm_ != nullptr && !aborted_.load()) {
    if (const int r = nccl_->commDestroy(comm_); r != nccl_net::kSuccess)
      FERRY_LOG(Warn, Collectives) << who() << ": " << nccl_net::describe(*nccl_, nullptr, "ncclCommDestroy", r);
  }
}

std::string NcclPartners::who() const {
  return "rank " + std::to_string(worldRankOf(host())) + " (host " + std::to_string(host()) + ")";
}

int NcclPartners::worldRankOf(int h) const {
  if (h == host() && options_.worldRank >= 0) return options_.worldRank;
  return options_.worldRanks.empty() ? h : options_.worldRanks[static_cast<std::size_t>(h)];
}

void NcclPartners::check(int result, const char* what, const char* context, int peer) const {
  if (result == nccl_net::kSuccess) return;  // (the message is built only for an error: calls check every send)
  std::string call = what;
  if (peer >= 0) call += " rank " + std::to_string(worldRankOf(peer)) + " (host " + std::to_string(peer) + ")";
  if (context != nullptr) call += std::string(" (") + context + ")";
  // (In progress: NCCL_COMM_BLOCKING=0 returns before the work is queued, and a reduce would read
  // its slots too early.)
  const std::string hint = result == nccl_net::kInProgress
                               ? "; nonblocking NCCL communicators (NCCL_COMM_BLOCKING=0) are not supported here"
                               : "; if a partner went away, destroy the Comm on every rank that is left";
  throw Error(result == 6 /* ncclRemoteError */ ? ErrorCode::RemoteError : ErrorCode::InternalError,
              who() + ": the cross-host phase on NCCL's network: " +
                  nccl_net::describe(*nccl_, aborted_.load() ? nullptr : comm_, call, result) + hint);
}

template <class Calls>
void NcclPartners::group(Calls&& calls, const char* what) {
  // Not while the watchdog aborts the communicator (end()): after it, no NCCL call may use it.
  std::lock_guard lock(ncclMu_);
  if (aborted_.load(std::memory_order_acquire)) throwFailure();
  // An abort that came while NCCL blocked in this group: done now that it has returned.
  struct PendingAbort {
    NcclPartners& self;
    ~PendingAbort() {
      if (self.abortPending_.exchange(false)) self.abortComm();
    }
  } pending{*this};
  check(nccl_->groupStart(), "ncclGroupStart", what);
  try {
    calls();
  } catch (...) {
    (void)nccl_->groupEnd();  // (the group is closed either way; the first error is the one to report)
    throw;
  }
  check(nccl_->groupEnd(), "ncclGroupEnd", what);
}

void NcclPartners::exchange(const PartnerExchange& x, DataType type, ReduceOp op, cudaStream_t stream) {
  if (x.count == 0 || (x.sendTo == 0 && x.recvFrom == 0)) return;
  if (failed()) throwFailure();
  const int me = host(), n = hosts();
  if (((x.sendTo | x.recvFrom) >> n) != 0 || ((x.sendTo | x.recvFrom) >> me & 1u) != 0)
    throw Error(ErrorCode::InternalError, who() + ": NcclPartners: an exchange names hosts outside 0.." +
                                              std::to_string(n - 1) + " or this one");
  const std::uint64_t es = sizeOf(type), bytes = x.count * es;
  // The call check: the partners of either direction swap digests in a group of their own (both
  // sides compare, also one that only sends), and a kernel compares them, before the data: where
  // the calls differ in size, the data's sends and recvs do not match and never end, and the
  // watchdog's abort on the mismatch word ends them.
  const std::uint32_t pairs = x.sendTo | x.recvFrom;
  auto* digests = static_cast<std::uint64_t*>(digests_.get());
  launchPartnerDigestWrite(digests, x.digest, stream);
  group(
      [&] {
        for (int p = 0; p < n; ++p) {
          if (p == me || (pairs >> p & 1u) == 0) continue;
          check(nccl_->send(digests, sizeof(std::uint64_t), nccl_net::kInt8, p, comm_, stream), "ncclSend to",
                "the partners' call check", p);
          check(nccl_->recv(digests + 1 + p, sizeof(std::uint64_t), nccl_net::kInt8, p, comm_, stream),
                "ncclRecv from", "the partners' call check", p);
        }
      },
      "the partners' call check");
  launchPartnerDigestCheck(digests + 1, pairs, x.digest, mismatchDevice_, stream);
  auto sendsAndRecvs = [&](std::uint64_t at, std::uint64_t len, bool intoSlots) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (x.sendTo >> p & 1u)
        check(nccl_->send(x.src + x.srcOffset[p] + at, len, nccl_net::kInt8, p, comm_, stream), "ncclSend to",
              nullptr, p);
      if (x.recvFrom >> p & 1u) {
        char* into = intoSlots ? static_cast<char*>(scratch_.get()) + static_cast<std::uint64_t>(p) * slotBytes_
                               : x.dst + x.dstOffset[p] + at;
        check(nccl_->recv(into, len, nccl_net::kInt8, p, comm_, stream), "ncclRecv from", nullptr, p);
      }
    }
  };
  if (!x.reduce) {
    group([&] { sendsAndRecvs(0, bytes, false); }, "a copy between partners");
    return;
  }
  // In rounds of a slot: each round's reduce reads the slots the next round's recvs write, in
  // stream order; the own part is read before a reduce in place overwrites it.
  const std::uint64_t round = slotBytes_ / es * es;
  for (std::uint64_t at = 0; at < bytes; at += round) {
    const std::uint64_t len = std::min(round, bytes - at);
    group([&] { sendsAndRecvs(at, len, true); }, "a reduce between partners");
    if (x.recvFrom == 0) continue;
    const char* parts[kMaxHosts];
    int count = 0;
    for (int h = 0; h < n; ++h) {  // in host order, so that every host rounds alike
      if (h == me)
        parts[count++] = x.src + x.srcOffset[me] + at;
      else if (x.recvFrom >> h & 1u)
        parts[count++] = static_cast<const char*>(scratch_.get()) + static_cast<std::uint64_t>(h) * slotBytes_;
    }
    launchPartnerReduce(x.dst + at, parts, count, len / es, type, op, x.divisor, stream);
  }
}

void NcclPartners::abort() { end("aborted (Comm::abort)", false); }

bool NcclPartners::failed() const { return aborted_.load(std::memory_order_acquire); }

void NcclPartners::throwFailure() const {
  // A mismatch the kernel found is the cause, also where NCCL's own error (after a partner's abort)
  // ended the partners first.
  int h = mismatchHost_.load(std::memory_order_acquire);
  if (h < 0 && mismatch_ != nullptr) h = static_cast<int>(__atomic_load_n(mismatch_, __ATOMIC_ACQUIRE)) - 1;
  if (h >= 0) throw Error(ErrorCode::InvalidUsage, partnerMismatchText(who(), worldRankOf(h), h));
  if (!failed_.load(std::memory_order_acquire))
    throw Error(ErrorCode::InvalidUsage, who() + ": the calls across hosts were aborted; destroy the Comm");
  std::string why;
  {
    std::lock_guard lock(whyMu_);
    why = why_;
  }
  // NCCL does not say which partner went away: name them all.
  std::string partners;
  for (int p = 0; p < hosts(); ++p)
    if (p != host())
      partners += (partners.empty() ? "" : ", ") + std::string("rank ") + std::to_string(worldRankOf(p)) + " (host " +
                  std::to_string(p) + ")";
  throw Error(ErrorCode::RemoteError, who() + ": the NCCL communicator of this rank and its partners " + partners +
                                          " failed during a call across hosts (" + why +
                                          "); one of them went away, or the network failed; this Comm cannot go on: "
                                          "destroy it on every rank that is left");
}

}  // namespace ferry
