#pragma once
// A bootstrap of two ranks of a larger one (docs/multi-node.md, "send and recv across hosts"): the
// ranks of a send/recv pair on different hosts make their link (HostPartners of two "hosts") at
// their first matched call, when both are in it, without a collective split of the world.
// Its rank 0 is the lower world rank; each is a host of its own. Messages go through the world
// bootstrap, with tags moved by kPairTagBase (modulo 2^31, so that every tag maps to one tag of the
// world's), matched by sender, so any number of pairs share the world's bootstrap.
#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/bootstrap.hpp"

namespace ferry {

class PairBootstrap final : public Bootstrap {
 public:
  static constexpr int kPairTagBase = 0x50000000;
  // @pre world's ranks `world->rank()` and `peer` differ; world outlives this.
  PairBootstrap(std::shared_ptr<Bootstrap> world, int peer);

  int rank() const override { return me_; }
  int size() const override { return 2; }
  const std::vector<int>& hostRanks() const override { return hostRanks_; }
  int node() const override { return me_; }
  int numNodes() const override { return 2; }
  void send(const void* data, std::size_t bytes, int peer, int tag) override;
  void recv(void* data, std::size_t bytes, int peer, int tag) override;
  std::vector<std::byte> recv(int peer, int tag) override;
  void allGather(void* allData, std::size_t bytesPerRank) override;
  void barrier() override;

  // The world rank of pair rank r.
  int worldRank(int r) const { return r == me_ ? world_->rank() : peer_; }

 private:
  int toWorld(int peer, const char* what) const;
  static int tagOf(int tag) {
    return static_cast<int>((static_cast<std::uint32_t>(tag) + static_cast<std::uint32_t>(kPairTagBase)) & 0x7fffffffu);
  }

  std::shared_ptr<Bootstrap> world_;
  int peer_;
  int me_;
  std::vector<int> hostRanks_;
};

}  // namespace ferry
