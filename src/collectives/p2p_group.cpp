#include "collectives/p2p_group.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "ferry/errors.hpp"

namespace ferry {
namespace {

Error bad(const PeerCall& c, const std::string& what) {
  return Error(ErrorCode::InvalidUsage, describe(c) + ": " + what);
}

// Water-filling: the narrowest streams first, each taking its need or an equal part of what is
// left, whichever is less; so no block goes to a stream that cannot use it.
void shareBlocks(P2PBatch& batch, const std::vector<int>& need, int residentBlocks, int maxBlocks,
                 const PeerCall& first) {
  const int n = batch.streams;
  if (n > residentBlocks)
    throw bad(first, "the group's " + std::to_string(n) +
                         " streams of sends, recvs and copies need a thread block " +
                         "each, more than fit on this GPU at once (" + std::to_string(residentBlocks) +
                         "); split it into smaller groups");
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return need[a] < need[b]; });
  int left = maxBlocks > 0 ? std::min(residentBlocks, std::max(maxBlocks, n)) : residentBlocks;
  for (int k = 0; k < n; ++k) {
    const int s = order[static_cast<std::size_t>(k)];
    batch.stream[s].blocks = std::min(need[static_cast<std::size_t>(s)], left / (n - k));
    left -= batch.stream[s].blocks;
  }
  for (int s = 0; s < n; ++s) {
    batch.stream[s].firstBlock = batch.blocks;
    batch.blocks += batch.stream[s].blocks;
  }
}

}  // namespace

P2PBatch planP2PGroup(const std::vector<PeerCall>& calls, int residentBlocks, int maxBlocks) {
  P2PBatch batch;
  if (calls.empty()) return batch;
  const PeerCall& first = calls.front();
  const int me = first.rank;
  std::vector<const PeerCall*> selfSends, selfRecvs;
  std::vector<std::vector<const PeerCall*>> byPeer(2 * static_cast<std::size_t>(first.worldSize));
  int toOthers = 0;
  for (const PeerCall& c : calls) {
    if (c.stream != first.stream)
      throw bad(c, "is on another stream than the group's first send/recv; one group uses one stream");
    if (c.peer == me) {
      (c.isSend ? selfSends : selfRecvs).push_back(&c);
      continue;
    }
    if (++toOthers > kP2PMaxOps)
      throw bad(c, "a group holds at most " + std::to_string(kP2PMaxOps) + " sends and recvs to other ranks");
    byPeer[2 * static_cast<std::size_t>(c.peer) + (c.isSend ? 1 : 0)].push_back(&c);
  }
  for (std::size_t i = 0; i < std::max(selfSends.size(), selfRecvs.size()); ++i) {
    if (i >= selfRecvs.size())
      throw bad(*selfSends[i], "has no matching recv from this rank in the same group");
    if (i >= selfSends.size())
      throw bad(*selfRecvs[i], "has no matching send from this rank in the same group");
    if (selfSends[i]->bytes() != selfRecvs[i]->bytes())
      throw bad(*selfRecvs[i], "receives " + std::to_string(selfRecvs[i]->bytes()) +
                                   " bytes but the matching send has " +
                                   std::to_string(selfSends[i]->bytes()));
  }
  if (selfSends.size() > static_cast<std::size_t>(kP2PMaxOps - toOthers))
    throw bad(*selfSends[static_cast<std::size_t>(kP2PMaxOps - toOthers)],
              "a group holds at most " + std::to_string(kP2PMaxOps) +
                  " sends and recvs to other ranks and pairs to itself");

  std::vector<int> need;  // blocks a stream can use: the lanes of its widest message
  auto open = [&](int peer, P2PKind kind) -> P2PStream& {
    P2PStream& st = batch.stream[batch.streams++];
    st.peer = peer;
    st.kind = kind;
    st.firstMessage = batch.messages;
    need.push_back(0);
    return st;
  };
  auto add = [&](P2PStream& st, P2PMessage m) {
    need.back() = std::max(need.back(), p2pLanes(m.bytes));
    batch.message[batch.messages++] = m;
    st.messages = batch.messages - st.firstMessage;
  };
  for (const auto& list : byPeer) {
    if (list.empty()) continue;
    P2PStream& st = open(list.front()->peer, list.front()->isSend ? P2PKind::Send : P2PKind::Recv);
    for (const PeerCall* c : list)
      add(st, {static_cast<char*>(const_cast<void*>(c->buffer)), nullptr, c->bytes()});
  }
  if (!selfSends.empty()) {
    P2PStream& st = open(me, P2PKind::Copy);
    for (std::size_t i = 0; i < selfSends.size(); ++i)
      add(st, {static_cast<char*>(const_cast<void*>(selfRecvs[i]->buffer)),
               static_cast<const char*>(selfSends[i]->buffer), selfSends[i]->bytes()});
  }
  shareBlocks(batch, need, residentBlocks, maxBlocks, first);
  return batch;
}

}  // namespace ferry
