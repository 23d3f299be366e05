// A bootstrap of two ranks of a larger one (pair_bootstrap.hpp).
#include "comm/pair_bootstrap.hpp"

#include <cstring>
#include <string>

#include "ferry/errors.hpp"

namespace ferry {
namespace {

constexpr int kAllGatherTag = 0x7fff0, kBarrierTag = 0x7fff1;

}  // namespace

PairBootstrap::PairBootstrap(std::shared_ptr<Bootstrap> world, int peer)
    : world_(std::move(world)), peer_(peer), me_(world_->rank() < peer ? 0 : 1), hostRanks_{me_} {
  if (peer == world_->rank() || peer < 0 || peer >= world_->size())
    throw Error(ErrorCode::InternalError, "rank " + std::to_string(world_->rank()) +
                                              ": PairBootstrap with peer " + std::to_string(peer));
}

int PairBootstrap::toWorld(int peer, const char* what) const {
  if (peer != 1 - me_)
    throw Error(ErrorCode::InternalError, "rank " + std::to_string(world_->rank()) + ": PairBootstrap::" + what +
                                              " to pair rank " + std::to_string(peer) + " (its peer is " +
                                              std::to_string(1 - me_) + ")");
  return peer_;
}

void PairBootstrap::send(const void* data, std::size_t bytes, int peer, int tag) {
  world_->send(data, bytes, toWorld(peer, "send"), tagOf(tag));
}

void PairBootstrap::recv(void* data, std::size_t bytes, int peer, int tag) {
  world_->recv(data, bytes, toWorld(peer, "recv"), tagOf(tag));
}

std::vector<std::byte> PairBootstrap::recv(int peer, int tag) {
  return world_->recv(toWorld(peer, "recv"), tagOf(tag));
}

void PairBootstrap::allGather(void* allData, std::size_t bytesPerRank) {
  auto* slots = static_cast<char*>(allData);
  // (A send is buffered: both send first, then receive.)
  send(slots + static_cast<std::size_t>(me_) * bytesPerRank, bytesPerRank, 1 - me_, kAllGatherTag);
  recv(slots + static_cast<std::size_t>(1 - me_) * bytesPerRank, bytesPerRank, 1 - me_, kAllGatherTag);
}

void PairBootstrap::barrier() {
  const char token = 1;
  char got = 0;
  send(&token, 1, 1 - me_, kBarrierTag);
  recv(&got, 1, 1 - me_, kBarrierTag);
}

}  // namespace ferry
