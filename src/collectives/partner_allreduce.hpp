#pragma once
// The cross-host phase of a hierarchical allreduce (docs/multi-node.md, "Partners"): the ranks of
// one local index on every host, one per host in host order, reduce a buffer among themselves over
// PortChannels only. Nothing of a partner is mapped: every byte and every signal goes through the
// host proxy and the channel's Connection (Ethernet between hosts), so the kernel runs alike
// whatever carries it.
//
// A call moves the buffer in rounds of slotBytes. In each round every rank puts its part into its
// slot of every partner's scratch (put with signal), flushes those puts (the proxy reads the source
// after the kernel has gone on, and the reduce below overwrites it), waits for every partner's part,
// reduces the parts in host order into its buffer, then tells every partner that its slot is free
// (the ack channel) and waits for the same from each before the next round reuses their slots.
// Every rank ends a call with all its signals consumed, so calls follow each other on any stream.
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
  char* scratch = nullptr;                  // this rank's: `hosts` slots of slotBytes, by sender
  std::uint64_t slotBytes = 0;              // a multiple of 16
  int host = 0;
  int hosts = 1;
};

// In place: buf[0, count) becomes `op` over the partners' buffers in host order (Avg: their sum
// divided by `divisor`, the ranks the caller's sum spans). `channels` is device memory.
void launchPartnerAllReduce(const PartnerChannels* channels, std::uint64_t slotBytes, void* buf, std::size_t count,
                            DataType type, ReduceOp op, int divisor, cudaStream_t stream);
// Loads every type and op of the kernel into the current context now (launch.hpp's preloadKernel:
// a first launch queued behind a waiting kernel would otherwise wait for it).
void preloadPartnerAllReduce();

}  // namespace ferry
