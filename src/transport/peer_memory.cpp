#include "transport/peer_memory.hpp"

#include <future>

#include "ferry/errors.hpp"
#include "ferry/memory.hpp"

namespace ferry {

PeerMemory::PeerMemory(Communicator& comm, std::uint64_t bytes, int tag, const std::string& what) : bytes_(bytes) {
  const auto& boot = comm.bootstrap();
  const int rank = boot->rank(), size = boot->size();
  memory_ = gpuAlloc(bytes);  // zeroed: every counter in it starts at 0
  // Ethernet too: the Comm's port channels may run over connections that copy (CommOptions::connect
  // with Transport::Ethernet), whose owner side writes only into registrations made for them.
  RegisteredMemory local = comm.registerMemory(memory_.get(), bytes, Transport::CudaIpc | Transport::Ethernet);
  std::vector<std::shared_future<RegisteredMemory>> futures(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    comm.sendMemory(local, p, tag);
    futures[p] = comm.recvMemory(p, tag);
  }
  peers_.resize(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    peers_[p] = p == rank ? local : futures[p].get();
    if (!peers_[p].data() || peers_[p].size() != bytes)
      throw Error(ErrorCode::NotSupported,
                  "rank " + std::to_string(rank) + ": " + what + " of rank " + std::to_string(p) +
                      " could not be mapped here (" + std::to_string(peers_[p].size()) + " of " +
                      std::to_string(bytes) +
                      " bytes); every rank must be on one host with the same FERRY_SCRATCH_BYTES and FERRY_LL_BYTES");
  }
}

}  // namespace ferry
