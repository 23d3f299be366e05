#pragma once
// FakeBootstrap: ranks of one process that talk through an in-memory hub, for unit tests of code
// that sits on a Bootstrap (Communicator). recv of a message that was never sent throws
// TimeoutError at once instead of waiting.
//
//   auto hub = std::make_shared<FakeBootstrap::Hub>();
//   auto r0 = std::make_shared<FakeBootstrap>(hub, 0, 2), r1 = std::make_shared<FakeBootstrap>(hub, 1, 2);
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "ferry/bootstrap.hpp"
#include "ferry/errors.hpp"

namespace ferry::test {

class FakeBootstrap : public Bootstrap {
 public:
  struct Hub {
    std::mutex mutex;
    std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> queues;  // (from, to, tag)
  };

  FakeBootstrap(std::shared_ptr<Hub> hub, int rank, int size)
      : hub_(std::move(hub)), rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) hostRanks_.push_back(r);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& hostRanks() const override { return hostRanks_; }
  int node() const override { return 0; }
  int numNodes() const override { return 1; }

  void send(const void* data, std::size_t bytes, int peer, int tag) override {
    std::lock_guard lock(hub_->mutex);
    auto* p = static_cast<const std::byte*>(data);
    hub_->queues[{rank_, peer, tag}].emplace_back(p, p + bytes);
  }
  void recv(void* data, std::size_t bytes, int peer, int tag) override {
    auto m = recv(peer, tag);
    if (m.size() != bytes) throw Error(ErrorCode::InvalidUsage, "FakeBootstrap: size mismatch");
    std::memcpy(data, m.data(), bytes);
  }
  std::vector<std::byte> recv(int peer, int tag) override {
    std::lock_guard lock(hub_->mutex);
    auto& q = hub_->queues[{peer, rank_, tag}];
    if (q.empty())
      throw TimeoutError("FakeBootstrap: rank " + std::to_string(rank_) + ": nothing from rank " +
                         std::to_string(peer) + " with tag " + std::to_string(tag));
    auto m = std::move(q.front());
    q.pop_front();
    return m;
  }
  void allGather(void*, std::size_t) override {
    throw Error(ErrorCode::NotSupported, "FakeBootstrap::allGather");
  }
  void barrier() override {}

  std::size_t pending() const {
    std::lock_guard lock(hub_->mutex);
    std::size_t n = 0;
    for (auto& [key, q] : hub_->queues) n += q.size();
    return n;
  }

 private:
  std::shared_ptr<Hub> hub_;
  int rank_;
  int size_;
  std::vector<int> hostRanks_;
};

}  // namespace ferry::test
