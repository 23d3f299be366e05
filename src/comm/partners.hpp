#pragma once
// A rank's partners across hosts (docs/multi-node.md, "Partners"): the ranks that carry the same
// column on every host, one per host, in host order, and the network between them. Two kinds run
// the same exchanges (collectives/partner_exchange.hpp): HostPartners, ferry's own PortChannels on
// Ethernet connections (the default), and NcclPartners, NCCL's network (InfiniBand or RoCE where
// a cluster has them; FERRY_PARTNER_NET). A Comm across hosts holds one per column it carries.
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "collectives/partner_exchange.hpp"
#include "ferry/datatype.hpp"

namespace ferry {

struct PartnersOptions {
  // The world's ranks of this rank and of each host's partner (by host), for errors and the
  // device's timeout reports; unset: the host indices.
  int worldRank = -1;
  std::vector<int> worldRanks;
  // Called once a partner's connection has failed (from the thread that saw it), after this rank's
  // waits for partners have been told to give up: a Comm across hosts ends its host's calls there
  // too. It must not block for long or throw.
  std::function<void()> onFailure;
};

class Partners {
 public:
  virtual ~Partners() = default;

  // This rank's host (its index among the partners) and how many hosts there are.
  virtual int host() const = 0;
  virtual int hosts() const = 0;
  // Any exchange on `stream` (partner_exchange.hpp); every partner calls it with agreeing masks.
  virtual void exchange(const PartnerExchange& exchange, DataType type, ReduceOp op, cudaStream_t stream) = 0;
  // Makes this rank's running and later waits for partners give up (Comm::abort).
  virtual void abort() = 0;
  // A partner failed, or abort() was called: no call can run any more.
  virtual bool failed() const = 0;
  // Throws what failed() means: Error(RemoteError) naming the failure, or Error(InvalidUsage) after
  // abort(). @pre failed()
  [[noreturn]] virtual void throwFailure() const = 0;
  // "ferry" or "nccl": what carries the exchanges (ferry-bench's algorithm column).
  virtual const char* network() const = 0;
};

// The error of a rank (`who`: "rank W (host h)") whose partner, world rank `partnerRank` on host
// `partnerHost`, made another exchange than its own (both kinds of partners compare digests).
std::string partnerMismatchText(const std::string& who, int partnerRank, int partnerHost);

}  // namespace ferry
