#pragma once
// Partners whose exchanges run on NCCL's network (FERRY_PARTNER_NET=nccl, or auto where the host
// has InfiniBand or RoCE devices; docs/multi-node.md, "The cross-host phase on NCCL's network"):
// one NCCL communicator of the partners (rank = host index, made through the partners' bootstrap),
// each exchange one group of ncclSend and ncclRecv on the caller's stream. A copy receives straight
// into its destination; a reduce receives into slots of a buffer made once (so a CUDA graph can
// capture it), a round of slot size at a time, and reduces there in host order, so that every
// partner gets the same bits as with HostPartners. NCCL brings its own transports (IB verbs, RoCE,
// its sockets, a net plugin); ferry keeps the phases on each host.
//
// A partner that goes away: a watchdog thread polls ncclCommGetAsyncError every millisecond (as
// PyTorch's does); on an error it runs options.onFailure (a Comm across hosts ends its host's calls)
// and aborts the NCCL communicator, whose kernels then end; every later call throws
// Error(RemoteError) with NCCL's reason. Comm::abort aborts it too. A partner that stays silent
// without its connection failing is NCCL's to bound (it has no bound by default): Comm::abort ends
// such a wait.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/partners.hpp"
#include "ferry/bootstrap.hpp"
#include "platform/nccl_net.hpp"

namespace ferry {

class NcclPartners final : public Partners {
 public:
  // Collective over `partners` (one rank per host, at most kMaxHosts), on the current device, with
  // `scratchBytes` of device memory for a reduce's received parts (a slot per host).
  NcclPartners(std::shared_ptr<Bootstrap> partners, std::uint64_t scratchBytes, PartnersOptions options = {});
  // @pre no call of it is still running on a stream.
  ~NcclPartners() override;
  NcclPartners(const NcclPartners&) = delete;
  NcclPartners& operator=(const NcclPartners&) = delete;

  int host() const override { return bootstrap_->rank(); }
  int hosts() const override { return bootstrap_->size(); }
  void exchange(const PartnerExchange& exchange, DataType type, ReduceOp op, cudaStream_t stream) override;
  void abort() override;
  bool failed() const override;
  [[noreturn]] void throwFailure() const override;
  const char* network() const override { return "nccl"; }

 private:
  std::string who() const;  // "rank W (host h)"
  int worldRankOf(int host) const;
  // An Error naming the NCCL call `what` (to or from partner `peer`, in `context`) unless `result`
  // is success.
  void check(int result, const char* what, const char* context = nullptr, int peer = -1) const;
  // One group of sends and recvs of `bytes` each.
  template <class Calls>
  void group(Calls&& calls, const char* what);
  // The watchdog's loop; and what it and abort() share: records `why` (the first), aborts NCCL.
  void watch();
  void end(const std::string& why, bool failure);
  void abortComm();  // ncclCommAbort, logged; @pre ncclMu_ held, or no other thread uses the communicator

  std::shared_ptr<Bootstrap> bootstrap_;
  PartnersOptions options_;
  const nccl_net::Library* nccl_ = nullptr;
  nccl_net::Comm comm_ = nullptr;
  std::shared_ptr<void> scratch_;
  std::uint64_t slotBytes_ = 0;
  // The call check (partner_exchange.hpp): device memory, [0] this rank's digest of the exchange
  // in flight, [1 + h] host h's as it came; host memory (mapped), 1 + the host whose digest
  // differed (0: none), which the watchdog reads.
  std::shared_ptr<void> digests_;
  std::uint32_t* mismatch_ = nullptr;
  std::shared_ptr<void> mismatchMemory_;  // frees it (after the watchdog has stopped)
  std::uint32_t* mismatchDevice_ = nullptr;
  std::atomic<int> mismatchHost_{-1};  // set with the failure it caused
  // Set once the NCCL communicator is aborted (by the watchdog on a failure, or abort()): no NCCL
  // call on it may follow. failed_ tells a partner's failure from an abort.
  std::atomic<bool> aborted_{false}, failed_{false};
  std::atomic<bool> abortPending_{false};  // end() could not take ncclMu_: the group holding it aborts
  std::mutex ncclMu_;  // the watchdog's polls of the communicator, its abort, and the queueing of a group
  mutable std::mutex whyMu_;
  std::string why_;  // NCCL's reason for the failure (under whyMu_)
  std::atomic<bool> stopping_{false};
  std::thread watchdog_;  // last: started once everything it reads is set
};

}  // namespace ferry
