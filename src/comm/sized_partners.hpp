#pragma once
// Partners on two networks at once (FERRY_PARTNER_NET=sized; docs/multi-node.md, "The cross-host
// phase on NCCL's network"): an exchange whose parts are at most `ncclBytes` each goes on NCCL's network
// (NcclPartners), a larger one on ferry's Ethernet connections (HostPartners). On sockets NCCL's
// send/recv ended small calls sooner (41-48 us up to 16 KiB across 2 hosts of 1 H200, where ferry's
// connections took 81-88) and ferry's connections moved large ones faster (from 256 KiB; 1.4-1.5x
// at 4-64 MiB), 2026-11-27 (docs/measurements/h200-2026-11-27-across-hosts-nccl-net.md).
//
// Every partner picks the same network for an exchange: the part's size comes from the call, which
// partners agree on (their exchanges' digests compare it), and every rank takes the same ncclBytes
// (the largest any rank asked for). Each network keeps its own order of exchanges, so exchanges on
// the two may overlap (a pipelined call's pieces on side streams). The cost: partners whose calls
// differ in size across the line wait on different networks, so they do not get the digests'
// mismatch error; ferry's side ends at FERRY_DEVICE_TIMEOUT, NCCL's at Comm::abort.
#include <atomic>
#include <cstdint>
#include <memory>

#include "comm/partners.hpp"

namespace ferry {

class SizedPartners final : public Partners {
 public:
  // small: NCCL's network (NcclPartners); large: ferry's connections (HostPartners); both made
  // over the same partners. @pre both non-null, of the same host and hosts.
  SizedPartners(std::unique_ptr<Partners> small, std::unique_ptr<Partners> large, std::uint64_t ncclBytes);

  int host() const override { return large_->host(); }
  int hosts() const override { return large_->hosts(); }
  void exchange(const PartnerExchange& exchange, DataType type, ReduceOp op, cudaStream_t stream) override;
  // Both networks' waits give up.
  void abort() override;
  // Either network failed (a partner that went away fails both, each in its own time).
  bool failed() const override;
  // The error of the network seen failing first (an abort after a failure does not hide it).
  [[noreturn]] void throwFailure() const override;
  const char* network() const override { return "sized"; }

 private:
  // The network that carries an exchange whose parts are `partBytes` each.
  Partners& carrierOf(std::uint64_t partBytes) { return partBytes <= ncclBytes_ ? *small_ : *large_; }

  std::unique_ptr<Partners> small_, large_;
  std::uint64_t ncclBytes_;
  mutable std::atomic<int> first_{-1};  // the network seen failing first: 0 small, 1 large
};

}  // namespace ferry
