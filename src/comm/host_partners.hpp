#pragma once
// A rank's partners across hosts: the ranks of its local index on every host, one per host, in host
// order (docs/multi-node.md, "Partners"). Every pair is joined by Ethernet connections with two
// PortChannels each way (data and acks) and a scratch buffer registered for Ethernet; the
// cross-host phase of the hierarchical collectives runs on them (collectives/partner_exchange.hpp).
// Nothing of a partner is mapped, so partners may be on any hosts.
//
//   // every partner, with a bootstrap of the partners alone (rank = host index)
//   HostPartners partners(partnerBootstrap, 64 << 20);
//   partners.allReduce(buf, count, DataType::Float32, ReduceOp::Sum, 1, stream);
#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/partner_exchange.hpp"
#include "comm/partners.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/communicator.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/semaphore.hpp"

namespace ferry {

// (onFailure runs on the proxy thread, also when the proxy stopped on another error.)
using HostPartnersOptions = PartnersOptions;

class HostPartners final : public Partners {
 public:
  // Collective over `partners` (one rank per host, at most kMaxHosts). `scratchBytes` of device
  // memory on the current device receive the partners' parts, a slot per partner; a call larger
  // than a slot runs in rounds. Errors name this rank, the partner and what to do.
  //
  // A partner that goes away (its process ends, its host becomes unreachable) while a call runs is
  // noticed by the proxy within a millisecond or so of its connection failing: the kernels' waits
  // give up at once (their results are then garbage), options.onFailure runs, failed() becomes
  // true, and every later call throws Error(RemoteError) naming the partner.
  HostPartners(std::shared_ptr<Bootstrap> partners, std::uint64_t scratchBytes, HostPartnersOptions options = {});
  // @pre no call of it is still running on a stream (its kernels use the proxy it stops).
  ~HostPartners() override;
  HostPartners(const HostPartners&) = delete;
  HostPartners& operator=(const HostPartners&) = delete;

  int host() const override { return bootstrap_->rank(); }
  int hosts() const override { return bootstrap_->size(); }

  // In place on `stream`: buf[0, count) becomes `op` over the partners' buffers, in host order
  // (Avg: the sum divided by `divisor`: the ranks the sums span). Every partner calls it alike.
  void allReduce(void* buf, std::size_t count, DataType type, ReduceOp op, int divisor, cudaStream_t stream);
  // Any exchange on `stream` (partner_exchange.hpp); every partner calls it with agreeing masks.
  void exchange(const PartnerExchange& exchange, DataType type, ReduceOp op, cudaStream_t stream) override;

  // Makes the waits of this rank's running and later kernels give up (Comm::abort).
  void abort() override;
  bool failed() const override;
  [[noreturn]] void throwFailure() const override;
  const char* network() const override { return "ferry"; }

 private:
  const PartnerChannels* start();
  std::uint32_t everyOtherHost() const;  // the mask of every partner but this rank
  int worldRankOf(int host) const;
  std::string who() const;  // "rank W (host h)"
  std::string mismatchText() const;  // the error of a partner whose call differed (words_[2])
  // On the proxy thread, at most every millisecond: whether the connection of the partner a kernel
  // waits for has failed (a failure the proxy's own requests would not meet: a wait for data).
  void watch();

  std::shared_ptr<Bootstrap> bootstrap_;
  Communicator comm_;
  std::shared_ptr<void> scratch_;
  RegisteredMemory scratchRegistration_;  // (destroyed after the connections that write into it)
  std::uint64_t slotBytes_ = 0;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::vector<std::shared_ptr<Host2DeviceSemaphore>> data_, acks_;
  HostPartnersOptions options_;
  // Host memory the GPU maps: [0] the hosts whose partner a kernel waits for (the kernel writes
  // it: PartnerChannels::waitingOn), [1] raised on a failure or abort (the kernels' waits give up
  // on it), [2] 1 + the host whose exchange differed from this rank's (PartnerChannels::mismatch),
  // [3] the hosts whose partner a kernel waits for acknowledgements from (waitingOnAcks).
  std::uint32_t* words_ = nullptr;
  std::uint32_t* wordsDevice_ = nullptr;
  std::chrono::steady_clock::time_point nextWatch_;  // (the proxy thread's)
  PortChannelService service_;
  PartnerChannels* device_ = nullptr;
};

}  // namespace ferry
