#pragma once
// Connection: one link to one peer over one transport, made by Communicator::connect. The host side
// of the data plane: the proxy (PortChannel) performs a GPU's requests through it.
//
// Ordering contract: operations on one Connection complete at the destination in the order they
// were issued from one thread. updateAndSync(dst, off, src, v) makes v visible in the peer's word
// only after every byte of every earlier write() on this connection is visible there, so a peer that
// reads the word with acquire semantics and sees v also sees the data. flush() returns once every
// earlier write() and updateAndSync() has completed at the destination.
//
// Arguments are checked in one place (here, before the transport sees them): dst must be the
// remote rank's memory (received with recvMemory) and mapped in this process (CudaIpc, HostMemory)
// or registered for the transport (Ethernet, which copies the bytes over TCP and has the owner's
// side check them again), src memory this rank registered, offsets and sizes within both, the
// updateAndSync word 8-byte aligned; for HostMemory both must be host memory. A bad argument is Error(InvalidUsage) naming this rank, the
// peer and the operation.
//
// A Connection is not thread-safe: one thread (usually the proxy) issues its operations.
//
// Example (rank 0 puts 1 KiB into rank 1's buffer, then bumps rank 1's flag word):
//   auto conn = comm.connect(1, ferry::Transport::CudaIpc).get();
//   conn->write(theirBuf, /*dstOffset=*/0, myBuf, /*srcOffset=*/0, 1024);
//   conn->updateAndSync(theirFlags, /*dstOffset=*/0, &myOutboundCounter, ++count);
//   conn->flush(std::chrono::seconds(5));  // both have landed, or TimeoutError naming rank 1
// Wrong: passing a RegisteredMemory of a third rank as dst, or the peer's memory as src.
#include <chrono>
#include <cstdint>
#include <string>

#include "ferry/api.hpp"
#include "ferry/registered_memory.hpp"
#include "ferry/transport.hpp"

namespace ferry {

class FERRY_API Connection {
 public:
  virtual ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int rank() const noexcept { return rank_; }
  int remoteRank() const noexcept { return remoteRank_; }
  Transport transport() const noexcept { return transport_; }

  // Copies bytes from src+srcOffset (local) to dst+dstOffset (the peer's). Asynchronous: complete
  // at the destination after a later flush() or when a later updateAndSync's value is seen there.
  // bytes == 0 is a no-op (the offsets are still checked).
  void write(RegisteredMemory dst, std::uint64_t dstOffset, RegisteredMemory src, std::uint64_t srcOffset,
             std::uint64_t bytes);

  // The same from src, an address in this process rather than a registration, where the transport
  // can read such addresses (readsLocalPointers(); CudaIpc: any GPU memory of this process); and dst
  // may also be this rank's own memory: a copy within this rank, in order with the other writes.
  // Error(InvalidUsage) where the transport cannot.
  void write(RegisteredMemory dst, std::uint64_t dstOffset, const void* src, std::uint64_t bytes);
  virtual bool readsLocalPointers() const { return false; }

  // Stores newValue into *src (a local word, e.g. a semaphore's outbound counter; host memory the
  // caller owns), then writes newValue into the peer's 8-byte word at dst+dstOffset, ordered after
  // every earlier write() on this connection (see the ordering contract).
  // @pre dstOffset % 8 == 0 and dstOffset + 8 <= dst.size(); src non-null and 8-byte aligned.
  void updateAndSync(RegisteredMemory dst, std::uint64_t dstOffset, std::uint64_t* src,
                     std::uint64_t newValue);

  // Returns when every earlier write()/updateAndSync() has completed at the destination; throws
  // TimeoutError naming this rank and the peer if that takes longer than timeout. flush() without an
  // argument waits at most FERRY_CONNECTION_TIMEOUT.
  void flush(std::chrono::duration<double> timeout);
  void flush();
  // flush() without waiting, for a proxy that serves other channels meanwhile: beginFlush() marks
  // the point after every earlier write() and updateAndSync() and returns a ticket;
  // flushComplete(ticket) is true once everything before that point has completed at the
  // destination. It never blocks; tickets complete in the order they were given.
  std::uint64_t beginFlush();
  bool flushComplete(std::uint64_t ticket);

  // Why this connection no longer carries the peer's operations to this rank (the peer closed it,
  // was killed, or its host became unreachable); empty while it works. Transports whose peer
  // cannot go away under a live mapping (CudaIpc, HostMemory) always return empty. A host-side
  // wait for the peer (Host2HostSemaphore::wait) reads it to fail at once instead of timing out.
  virtual std::string failure() const { return {}; }

 protected:
  Connection(int rank, int remoteRank, Transport transport);
  // The checked operations; the arguments are valid when these run.
  virtual void doWrite(void* dst, const void* src, std::uint64_t bytes) = 0;
  // dstInHostMemory: the word is host memory mapped here, which a host thread may store to directly.
  virtual void doUpdateAndSync(std::uint64_t* dst, bool dstInHostMemory, std::uint64_t newValue) = 0;
  virtual void doFlush(std::chrono::duration<double> timeout) = 0;
  // The defaults suit transports whose operations complete before they return.
  virtual std::uint64_t doBeginFlush() { return 0; }
  virtual bool doFlushComplete(std::uint64_t /*ticket*/) { return true; }
  // Transports that copy rather than map (Ethernet) return false, and get the peer's registration
  // itself instead of an address here: doWriteTo and doUpdateAndSyncTo replace doWrite and
  // doUpdateAndSync for them (src is memory of this process, registered or not, host or device).
  virtual bool mapsPeerMemory() const { return true; }
  virtual void doWriteTo(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src, std::uint64_t bytes);
  virtual void doUpdateAndSyncTo(const RegisteredMemory& dst, std::uint64_t dstOffset, std::uint64_t newValue);
  // "rank 0 -> rank 1 (CudaIpc)", for messages.
  std::string describe() const;

 private:
  int rank_;
  int remoteRank_;
  Transport transport_;
};

}  // namespace ferry
