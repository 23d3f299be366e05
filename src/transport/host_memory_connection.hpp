#pragma once
// HostMemoryConnection: same host, host memory on both ends (the peer's hostAlloc memory mapped
// here). write is a memcpy; updateAndSync a release store of the word after it, so a thread that
// reads the word with acquire semantics and sees the value also sees every earlier write's bytes.
// Both are complete when they return, so flush has nothing to wait for.
#include "ferry/connection.hpp"

namespace ferry {

class HostMemoryConnection final : public Connection {
 public:
  HostMemoryConnection(int rank, int remoteRank) : Connection(rank, remoteRank, Transport::HostMemory) {}

 protected:
  void doWrite(void* dst, const void* src, std::uint64_t bytes) override;
  void doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t newValue) override;
  void doFlush(std::chrono::duration<double> timeout) override;
};

}  // namespace ferry
