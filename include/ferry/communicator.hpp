#pragma once
// Communicator: sets up the data plane on top of a Bootstrap. It registers memory, exchanges
// RegisteredMemory descriptors with peers and makes Connections.
//
// Batching: the bootstrap's send is buffered, and recvMemory/connect return futures that do their
// receiving only when get() is called. Post every sendMemory/recvMemory/connect first, then get the
// futures: setting up N peers then costs one round of bootstrap traffic, not N sequential rounds.
//
//   ferry::Communicator comm(bootstrap);
//   auto buf = ferry::gpuAlloc(bytes);
//   ferry::RegisteredMemory mine = comm.registerMemory(buf.get(), bytes, ferry::Transport::CudaIpc);
//   std::vector<std::shared_future<std::shared_ptr<ferry::Connection>>> conns;
//   std::vector<std::shared_future<ferry::RegisteredMemory>> theirs;
//   for (int peer : peers) {
//     conns.push_back(comm.connect(peer, ferry::Transport::CudaIpc));
//     comm.sendMemory(mine, peer);
//     theirs.push_back(comm.recvMemory(peer));
//   }
//   for (auto& c : conns) c.get();   // one round of traffic for all peers
//   for (auto& m : theirs) m.get();
// Wrong: `comm.connect(peer, t).get()` inside the loop: each get() waits for that peer before the
// next peer's request is even sent (N rounds, and a deadlock if two ranks loop in opposite orders
// over blocking calls of their own).
//
// Tags: sendMemory(m, peer, tag) matches recvMemory(sender, tag) on the peer, in order per
// (sender, tag); connect(peer, t, tag) matches the peer's connect(me, t, tag). Tags must be in
// [0, kMaxTag]. The Communicator sends its messages on bootstrap tags at or above kBootstrapTagBase;
// code that uses the same Bootstrap directly must stay below it.
//
// Errors: bad arguments (a peer out of range, connecting to self, a tag out of range, a null or
// empty registration) are Error(InvalidUsage) at the call. A connection with CudaIpc or HostMemory
// to a peer on another host is Error(InvalidUsage) naming both hosts, and a peer that asked for a
// different transport is Error(InvalidUsage) naming both; both come from the future's get().
// Waiting is bounded by the bootstrap's timeout.
//
// Thread safety: one thread uses a Communicator at a time (a future's get() counts as a use).
#include <cstddef>
#include <future>
#include <memory>

#include "ferry/api.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/connection.hpp"
#include "ferry/registered_memory.hpp"
#include "ferry/transport.hpp"

namespace ferry {

class FERRY_API Communicator {
 public:
  static constexpr int kMaxTag = (1 << 27) - 1;
  static constexpr int kBootstrapTagBase = 1 << 30;

  // @pre bootstrap non-null.
  explicit Communicator(std::shared_ptr<Bootstrap> bootstrap);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::shared_ptr<Bootstrap>& bootstrap() const noexcept;

  // Registers [ptr, ptr+size) for the given transports. Device or host memory is told apart by
  // asking CUDA (host memory when there is no GPU). Memory from gpuAlloc/hostAlloc must lie within
  // one allocation, and stays allocated while the RegisteredMemory lives. Other host memory is
  // registered with CUDA (cudaHostRegister) when a GPU is present and CudaIpc is asked for.
  // Registering other device memory for CudaIpc needs a legacy IPC handle of its allocation
  // (cudaIpcGetMemHandle); memory that has none (cudaMallocAsync pools, foreign VMM allocations)
  // is Error(NotSupported). Managed memory is Error(NotSupported).
  // @pre ptr non-null, size > 0, transports non-empty.
  RegisteredMemory registerMemory(void* ptr, std::size_t size, TransportFlags transports);

  // Sends the descriptor to peer (buffered: returns without waiting for the peer).
  void sendMemory(const RegisteredMemory& memory, int peer, int tag = 0);
  // The next descriptor peer sends with tag, deserialized (and mapped) on get().
  std::shared_future<RegisteredMemory> recvMemory(int peer, int tag = 0);

  // Sends this rank's half of the handshake now; get() receives the peer's half, checks that both
  // ends agree and are on one host where the transport needs it, and makes the Connection. CudaIpc
  // connections use the CUDA device current when connect() is called. Ethernet connects ranks on
  // any hosts over TCP (the interface FERRY_SOCKET_IFNAME names, as the bootstrap's): both ends set
  // it up together, on a thread of its own from connect() on, within FERRY_CONNECTION_TIMEOUT;
  // memory it writes must be registered for Ethernet by its owner. InfiniBand is
  // Error(NotSupported) for now.
  std::shared_future<std::shared_ptr<Connection>> connect(int peer, Transport transport, int tag = 0);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
