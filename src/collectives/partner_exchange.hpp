#pragma once
// The cross-host phase of the hierarchical collectives (docs/multi-node.md, "Partners"): the ranks of
// one local index on every host, one per host in host order, exchange parts of buffers among
// themselves over PortChannels only. Nothing of a partner is mapped: every byte and every signal
// goes through the host proxy and the channel's Connection (Ethernet between hosts), so the kernel
// runs alike whatever carries it.
//
// One exchange serves every collective: each host sends a part to the hosts of `sendTo` and
// receives one from the hosts of `recvFrom` (allreduce, allgather, alltoall: everyone to everyone;
// broadcast: the root's host to the others; reduce: the others to the root's host). What arrives
// is either reduced with this host's own part, in host order, or copied where the call says.
//
// A call moves the parts in rounds of slotBytes. In each round a sender puts its part into its slot
// of every receiver's scratch (put with signal) and waits until its proxy has handled those puts
// (the FIFO's sync: the proxy reads the source after the kernel has gone on, and a reduce may
// overwrite it; an Ethernet write has read its source when it returns, so no round trip to the
// receiver, as a flush takes, is needed); a receiver waits for every sender's part, reduces or
// copies them, then tells each sender that its slot is free (the ack channel); a sender waits for
// those acks before the next round reuses the slots. Every rank ends a call with all its signals
// consumed, so calls follow each other on any stream.
//
// Partners check that they make the same exchange: before its first part, a sender puts the
// exchange's digest (PartnerExchange::digest) into its cell of each receiver's scratch, and a
// receiver puts its own into its cell of each sender's with its first acknowledgement; each compares
// the partners' with its own once the part or acknowledgement has arrived, and on a difference,
// after that round's acknowledgements have left, names the partner in PartnerChannels::mismatch
// (the host code then fails the partners, naming it). So partners whose calls differ, on either
// side of an exchange, get an error at their next call; the call that differed ends with garbage.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ferry/datatype.hpp"
#include "ferry/device/port_channel.hpp"

namespace ferry {

inline constexpr int kMaxHosts = 8;

// What the kernel reads, in device memory (HostPartners fills it once).
struct PartnerChannels {
  PortChannelDeviceHandle data[kMaxHosts];  // puts into the partner's scratch, each with a signal
  PortChannelDeviceHandle ack[kMaxHosts];   // signals only: "your slot in my scratch is read"
  MemoryId scratchOf[kMaxHosts] = {};       // each partner's scratch, as this rank's proxy names it
  // This rank's: `hosts` slots of slotBytes, by sender, then `hosts` cells of kDigestBytes (each
  // partner's digest as it came with a part, then as it came with an acknowledgement; this rank's
  // own cell holds what it puts).
  char* scratch = nullptr;
  std::uint64_t slotBytes = 0;              // a multiple of 16
  int host = 0;
  int hosts = 1;
  // Host memory: bit h while the kernel waits for host h's partner, so that the proxy watches that
  // partner's connection then (one that goes away mid-call ends the waits through the channels'
  // abort word); a partner that closes when the kernel needs nothing more of it is not a failure.
  // The waits for data set this word, those for acknowledgements waitingOnAcks (where given): a link
  // of send/recv across hosts runs a send's kernel and a recv's at once, and neither may clear what
  // the other set.
  std::uint32_t* waitingOn = nullptr;
  std::uint32_t* waitingOnAcks = nullptr;
  // Host memory: 1 + the host whose exchange's digest differed from this rank's (0: none).
  std::uint32_t* mismatch = nullptr;
};

inline constexpr std::uint64_t kDigestBytes = 16;
// The bytes of a partner scratch of `hosts` slots of slotBytes with its digest cells.
inline std::uint64_t partnerScratchBytes(std::uint64_t slotBytes, int hosts) {
  return (slotBytes + kDigestBytes) * static_cast<std::uint64_t>(hosts);
}

// One exchange among the partners; every partner passes masks that agree with the others' (host p
// is in my sendTo exactly when I am in p's recvFrom).
struct PartnerExchange {
  const char* src = nullptr;               // the part for host p: src + srcOffset[p] (bytes)
  char* dst = nullptr;                     // reduce: the result; copy: host h's part to dst + dstOffset[h]
  std::uint64_t srcOffset[kMaxHosts] = {};  // (reduce: this host's own part at src + srcOffset[host])
  std::uint64_t dstOffset[kMaxHosts] = {};
  std::uint64_t count = 0;                 // elements in each part
  std::uint32_t sendTo = 0, recvFrom = 0;  // bit h: host h
  bool reduce = false;                     // reduce the received parts with the own one, or copy them
  int divisor = 1;                         // Avg: the ranks the reduced sums span
  std::uint64_t digest = 0;                // what this exchange is of which call: partners compare
};

// Runs `exchange` on `stream` (`channels` is device memory). `op` matters only when it reduces.
void launchPartnerExchange(const PartnerChannels* channels, std::uint64_t slotBytes, const PartnerExchange& exchange,
                           DataType type, ReduceOp op, cudaStream_t stream);
// dst[0, count) = op over parts[0..nparts) (in the order given; Avg: the sum divided by `divisor`),
// on `stream`: the reduce of an exchange whose parts another network brought (NcclPartners).
void launchPartnerReduce(char* dst, const char* const* parts, int nparts, std::uint64_t count, DataType type,
                         ReduceOp op, int divisor, cudaStream_t stream);
// The partners' call check where another network brings the parts (NcclPartners): `digest` into
// own[0] (device memory) on `stream`, for the network to send; then, once the partners' digests have
// arrived in theirs[h] (device memory), each host h of `hosts` whose digest differs from `digest`:
// the first one named in *mismatch (host memory, mapped), as 1 + h, unless a difference is there
// already.
void launchPartnerDigestWrite(std::uint64_t* own, std::uint64_t digest, cudaStream_t stream);
void launchPartnerDigestCheck(const std::uint64_t* theirs, std::uint32_t hosts, std::uint64_t digest,
                              std::uint32_t* mismatch, cudaStream_t stream);
// Loads every type and op of the kernel into the current context now (launch.hpp's preloadKernel:
// a first launch queued behind a waiting kernel would otherwise wait for it).
void preloadPartnerExchange();

}  // namespace ferry
