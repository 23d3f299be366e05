#include "collectives/p2p_collectives.hpp"

#include <string>

#include "collectives/p2p.hpp"
#include "collectives/p2p_group.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

class P2PCollective final : public Algorithm {
 public:
  P2PCollective(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string constraints(const CommLimits&) const override {
    return collective_ == Collective::AllToAll ? "out of place only" : "";
  }
  std::string whyNot(const CollectiveCall& call, const CommLimits&) const override {
    if (call.collective == Collective::AllToAll && call.inPlace())
      return "an all-to-all in place would receive into what its sends still read";
    return {};
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    if (context.p2p == nullptr || context.p2p->context == nullptr)
      throw Error(ErrorCode::NotSupported, describe(call) + ": " + name_ + " needs the Comm's send/recv inboxes");
    const P2PBatch batch = planP2PGroup(p2pCallsOf(call), context.p2p->residentBlocks, context.p2p->maxBlocks);
    launchP2P(batch, *context.p2p->context, call.stream, context.p2p->early);
  }
  void preload() const override { preloadP2P(); }

 private:
  const char* name_;
  Collective collective_;
};

}  // namespace

std::vector<PeerCall> p2pCallsOf(const CollectiveCall& call) {
  const int R = call.worldSize, r = call.rank;
  const std::size_t bytes = call.count * call.elementBytes();
  const auto* send = static_cast<const char*>(call.send);
  auto* recv = static_cast<char*>(call.recv);
  const bool toAll = call.collective == Collective::AllToAll;
  const bool broadcast = call.collective == Collective::Broadcast;
  std::vector<PeerCall> calls;
  if (toAll && call.inPlace()) return calls;
  const auto add = [&](bool isSend, const void* buffer, int peer) {
    calls.push_back(PeerCall{isSend, buffer, call.count, call.type, peer, call.stream, r, R});
  };
  // What goes to peer p, and where what comes from q lands.
  const auto source = [&](int p) -> const void* { return toAll ? send + p * bytes : send; };
  const auto dest = [&](int q) -> void* { return broadcast ? recv : recv + q * bytes; };
  // A broadcast's root only sends, every other rank only receives from it.
  for (int k = 1; k < R; ++k) {
    const int p = (r + k) % R, q = (r - k + R) % R;
    if (!broadcast || r == call.root) add(true, source(p), p);
    if (!broadcast || q == call.root) add(false, dest(q), q);
  }
  // This rank's own part, unless it is already in place (a broadcast's only on the root).
  if ((!broadcast || r == call.root) && !call.inPlace()) {
    add(true, source(r), r);
    add(false, dest(r), r);
  }
  return calls;
}

std::vector<const Algorithm*> p2pCollectiveAlgorithms() {
  static const P2PCollective allGather("allgather_p2p", Collective::AllGather);
  static const P2PCollective allToAll("alltoall_p2p", Collective::AllToAll);
  static const P2PCollective broadcast("broadcast_p2p", Collective::Broadcast);
  return {&allGather, &allToAll, &broadcast};
}

}  // namespace ferry
