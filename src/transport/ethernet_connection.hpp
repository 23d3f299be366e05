#pragma once
// EthernetConnection: two ranks on any hosts, over TCP. The peer's memory is not mapped here:
// write() sends the bytes with the peer's registration (id and token, from its descriptor), and the
// peer's receiver (a thread of the peer's own EthernetConnection to this rank) finds that live
// registration, checks that it was registered for Ethernet and that the range is inside it, and
// copies the bytes in: host memory straight from the socket, device memory 4 MiB at a time through
// two page-locked buffers, so that the GPU copy of one chunk overlaps the socket transfer of the
// next (the sender stages device sources the same way; pinned_staging.hpp). updateAndSync sends
// the word after the data on the same stream; the receiver applies frames in order, so it stores
// the word (a release store, or a copy after the earlier copies for device memory) only after
// every earlier write landed. flush sends a marker the receiver answers once everything before it
// landed. A receiver that refuses a frame answers with its reason and closes: the sender's next
// flush throws it, naming the peer.
//
// Setup (Communicator::connect): each side listens on an ephemeral port of the interface the
// bootstrap would use (FERRY_SOCKET_IFNAME) and sends, in its connect hello over the bootstrap,
// that address and a fresh 128-bit key. Each side then connects to the other's listener and proves
// it holds the key the listener's side sent (an HMAC over both ranks; the key itself never
// travels on this socket); the listener turns away every connection without that proof, until
// FERRY_CONNECTION_TIMEOUT. What travels after setup is not authenticated frame by frame (the
// bootstrap's frames are; docs/security.md): on an untrusted network, tunnel it.
//
// Lanes (FERRY_ETHERNET_LANES, the smaller of both sides'): that many socket pairs, each proven
// alone, each with a receiver thread. A write of host memory into host memory from kStripeBytes up
// is cut into one slice per lane, sent side by side, so that several TCP flows (and receiver
// threads) carry it. Stores, flushes, device memory and smaller writes use lane 0. Before a store
// or a flush that follows striped writes, the sender puts a fence (a numbered marker) on every
// lane; lane 0's receiver applies the store or answers the flush only once every lane's receiver
// has reached that fence, so the ordering contract holds across lanes.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap_wire.hpp"
#include "core/socket.hpp"
#include "ferry/connection.hpp"
#include "transport/pinned_staging.hpp"

namespace ferry {

class EthernetConnection final : public Connection {
 public:
  // This side's half of the setup, made before the hello is sent.
  struct Endpoint {
    Socket listener;
    SocketAddress address;  // what the peer connects to
    wire::Nonce key{};      // what the peer must prove it holds
    static Endpoint open();
  };

  static constexpr int kMaxLanes = 16;
  static constexpr std::uint64_t kStripeBytes = 1u << 20;

  // Connects `lanes` times to the peer's listener and accepts the peer's `lanes` connections on
  // ours (each proven), within `timeout`. Throws TimeoutError naming both ranks when the peer does
  // not come.
  static std::shared_ptr<EthernetConnection> establish(int rank, int remoteRank, Endpoint mine,
                                                       const SocketAddress& theirAddress,
                                                       const wire::Nonce& theirKey, int lanes,
                                                       std::chrono::duration<double> timeout);
  // @pre out.size() == in.size() >= 1: lane l is (out[l], in[l]).
  EthernetConnection(int rank, int remoteRank, std::vector<Socket> out, std::vector<Socket> in);
  int lanes() const noexcept { return static_cast<int>(outs_.size()); }
  ~EthernetConnection() override;

  bool readsLocalPointers() const override { return true; }
  std::string failure() const override;

 protected:
  bool mapsPeerMemory() const override { return false; }
  void doWrite(void* dst, const void* src, std::uint64_t bytes) override;
  void doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t newValue) override;
  void doWriteTo(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src,
                 std::uint64_t bytes) override;
  void doUpdateAndSyncTo(const RegisteredMemory& dst, std::uint64_t dstOffset,
                         std::uint64_t newValue) override;
  void doFlush(std::chrono::duration<double> timeout) override;
  std::uint64_t doBeginFlush() override;
  bool doFlushComplete(std::uint64_t ticket) override;

 private:
  void send(std::span<const std::byte> bytes);  // on lane 0
  // A write cut into one slice per lane, the lanes' sockets fed side by side.
  void sendStriped(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src,
                   std::uint64_t bytes);
  // After striped writes, before a store or a flush: a fence on every lane.
  void fenceLanes();
  // Lane 0's receiver: waits until every other lane's receiver has passed fence `fence`; false when
  // this side is closing. Throws the failure of a lane that ended.
  // Reads the receiver's answers that have arrived (waiting until `deadline` for one at least);
  // throws what the receiver refused.
  void readAnswers(Clock::time_point deadline);
  bool waitForLanes(std::uint64_t fence);
  void receive(
      std::size_t lane);  // a lane's receiver thread: applies the peer's frames to this process's memory
  void serveFrame(std::size_t lane, const std::byte* header);
  void answer(std::uint64_t kind, std::uint64_t value, const std::string& text = {});
  // The receiver thread ended for another reason than this side's close: records why (the first).
  void fail(std::string why);

  std::vector<Socket> outs_;  // to the peer: frames out (lane 0: answers back)
  std::vector<Socket> ins_;   // from the peer: its frames in (lane 0: answers back)
  std::vector<std::thread> receivers_;
  std::atomic<bool> stopping_{false};
  bool striped_ = false;          // striped writes since the last fence (sender)
  std::uint64_t fencesSent_ = 0;  // sender
  std::mutex laneMu_;
  std::condition_variable laneCv_;
  std::vector<std::uint64_t> laneFence_;  // the last fence each lane's receiver passed (guarded by laneMu_)
  std::atomic<bool> failed_{false};
  mutable std::mutex failureMu_;
  std::string failure_;  // guarded by failureMu_
  std::uint64_t ticketsSent_ = 0, ticketsAnswered_ = 0;
  std::vector<std::byte> answerBuffer_;
  // Device memory crosses through page-locked buffers, per device: the sender's (device sources)
  // and lane 0's receiver's (device destinations).
  std::map<int, std::unique_ptr<PinnedStaging>> sendStaging_, receiveStaging_;
  // Device copies run on non-blocking streams of their own (one per device, each side's), never on
  // the legacy default stream: a copy there would wait for a kernel on a blocking stream that may
  // be the very kernel spinning on this connection's signal.
  std::map<int, cudaStream_t> sendStreams_, receiveStreams_;
};

}  // namespace ferry
