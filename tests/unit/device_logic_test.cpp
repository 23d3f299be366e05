// The device API's logic, run by host threads: the headers compile for the host too, so copy,
// packets and semaphores are checked here on every commit; the GPU tests check them on GPUs.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <chrono>
#include <thread>
#include <vector>

#include "ferry/device/copy.hpp"
#include "ferry/device/memory_channel.hpp"
#include "ferry/device/packet.hpp"
#include "ferry/device/port_channel.hpp"
#include "ferry/device/semaphore.hpp"

namespace ferry {
namespace {

std::vector<unsigned char> randomBytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Every (dst, src) misalignment, sizes around the vector widths, several thread counts: the bytes
// in range are copied and nothing outside them is touched.
TEST(DeviceCopy, AnySizeAndAlignment) {
  const auto src = randomBytes(4096, 1);
  for (std::uint32_t nthreads : {1u, 3u, 32u}) {
    for (std::size_t dOff = 0; dOff < 16; ++dOff) {
      for (std::size_t sOff = 0; sOff < 16; sOff += 3) {
        for (std::size_t bytes : {0, 1, 7, 15, 16, 17, 63, 64, 65, 1000, 2049}) {
          std::vector<unsigned char> dst(4096, 0xEE);
          for (std::uint32_t t = 0; t < nthreads; ++t)
            copy(dst.data() + dOff, src.data() + sOff, bytes, t, nthreads);
          for (std::size_t i = 0; i < dst.size(); ++i) {
            bool inside = i >= dOff && i < dOff + bytes;
            ASSERT_EQ(dst[i], inside ? src[sOff + i - dOff] : 0xEE)
                << "byte " << i << " dOff " << dOff << " sOff " << sOff << " bytes " << bytes << " threads "
                << nthreads;
          }
        }
      }
    }
  }
}

template <class Packet>
void packetRoundTrip(std::size_t bytes, std::uint32_t nthreads) {
  auto data = randomBytes(bytes, static_cast<std::uint32_t>(bytes));
  std::vector<Packet> buffer(packetBufferBytes<Packet>(bytes) / sizeof(Packet) + 1);
  std::vector<unsigned char> out(bytes + 8, 0xEE);
  WaitContext ctx{0, 1, 5'000'000'000ull};
  for (std::uint32_t flag : {1u, 2u}) {  // a second round over the same buffer with a new flag
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < nthreads; ++t) {
      threads.emplace_back(
          [&, t] { unpackPackets(out.data(), buffer.data(), bytes, flag, t, nthreads, ctx); });
      threads.emplace_back([&, t] { putPackets(buffer.data(), data.data(), bytes, flag, t, nthreads); });
    }
    for (auto& th : threads) th.join();
    for (std::size_t i = 0; i < bytes; ++i) ASSERT_EQ(out[i], data[i]) << "byte " << i << " of " << bytes;
    for (std::size_t i = bytes; i < out.size(); ++i) ASSERT_EQ(out[i], 0xEE) << "wrote past the end at " << i;
  }
}

TEST(DevicePackets, LL16AndLL8CarryEveryByte) {
  for (std::size_t bytes : {1, 3, 4, 5, 8, 9, 1023, 4096, 100000}) {
    SCOPED_TRACE(bytes);
    packetRoundTrip<LL16Packet>(bytes, 4);
    packetRoundTrip<LL8Packet>(bytes, 3);
  }
  EXPECT_EQ(packetBufferBytes<LL16Packet>(9), 32u);
  EXPECT_EQ(packetBufferBytes<LL8Packet>(9), 24u);
}

TEST(DevicePackets, StaleFlagIsNotData) {
  LL16Packet p{};
  p.write(0x1122334455667788ull, 7);
  std::uint64_t v = 0;
  EXPECT_FALSE(p.tryRead(8, v));
  EXPECT_TRUE(p.tryRead(7, v));
  EXPECT_EQ(v, 0x1122334455667788ull);
  // A half-updated packet (one flag new, one old) is not data.
  reinterpret_cast<std::uint32_t*>(&p)[1] = 8;
  EXPECT_FALSE(p.tryRead(8, v));
}

// readPackets: the packets of several senders, arriving in any order and late, each with its own
// data; a sender outside the mask is never read; a round later, over the same slots, a new flag.
TEST(DevicePackets, ReadPacketsWaitsForEverySenderOfTheMask) {
  constexpr int kMax = 8;
  std::vector<LL16Packet> slots(kMax);
  const std::uint32_t from = 0b10110110;  // senders 1, 2, 4, 5, 7
  for (std::uint32_t flag : {1u, 2u}) {
    std::vector<std::thread> senders;
    std::mt19937 rng(flag);
    for (int q = 0; q < kMax; ++q) {
      if ((from >> q & 1u) == 0) continue;
      const auto delay = std::chrono::microseconds(rng() % 3000);
      senders.emplace_back([&, q, delay] {
        std::this_thread::sleep_for(delay);
        slots[q].write(0x0101010101010101ull * static_cast<std::uint64_t>(q) + flag, flag);
      });
    }
    std::uint64_t data[kMax] = {};
    data[0] = data[3] = 77;
    int contexts = 0;
    readPackets(
        from, flag, data, [&](int q) { return &slots[q]; },
        [&](int q) {
          ++contexts;
          return WaitContext{0, q, 5'000'000'000ull};
        });
    for (auto& t : senders) t.join();
    for (int q = 0; q < kMax; ++q) {
      const std::uint64_t want = (from >> q & 1u) != 0 ? 0x0101010101010101ull * static_cast<std::uint64_t>(q) + flag
                                 : q == 0 || q == 3    ? 77u
                                                       : 0u;
      EXPECT_EQ(data[q], want) << "sender " << q << " flag " << flag;
    }
    EXPECT_LE(contexts, 5);  // one bounded wait at most per late sender
  }
}

TEST(DevicePackets, ReadPacketsReturnsOnAbort) {
  LL16Packet slots[2] = {};
  slots[0].write(5, 9);  // sender 1 never writes
  const std::uint32_t aborted = 1;
  std::uint64_t data[2] = {};
  readPackets(
      0b11u, 9, data, [&](int q) { return &slots[q]; },
      [&](int q) { return WaitContext{0, q, 5'000'000'000ull, &aborted}; });
  EXPECT_EQ(data[0], 5u);
}

TEST(DevicePacketsDeathTest, ReadPacketsNamesTheSenderStillMissing) {
  LL16Packet slots[4] = {};
  slots[1].write(1, 3);
  slots[3].write(3, 3);  // sender 2 never writes
  std::uint64_t data[4] = {};
  EXPECT_DEATH(readPackets(
                   0b1110u, 3, data, [&](int q) { return &slots[q]; },
                   [&](int q) { return WaitContext{0, q, 50'000'000ull}; }),
               "rank 0: LL16 packet read waiting for rank 2 timed out");
}

// Two "GPUs" (threads), each with its counters, signalling through each other's inbound token:
// every wait sees the data written before the matching signal, over many rounds.
TEST(DeviceSemaphore, SignalOrdersDataAndCountsEveryRound) {
  struct Side {
    std::uint64_t inbound = 0, expected = 0, outbound = 0;
    std::vector<std::uint64_t> mailbox = std::vector<std::uint64_t>(64);
  } a, b;
  auto handle = [](Side& self, Side& peer) {
    SemaphoreDeviceHandle h;
    h.inbound = &self.inbound;
    h.expectedInbound = &self.expected;
    h.outbound = &self.outbound;
    h.remoteInbound = &peer.inbound;
    h.wait_ = {0, 1, 5'000'000'000ull};
    return h;
  };
  SemaphoreDeviceHandle ha = handle(a, b), hb = handle(b, a);
  constexpr int kRounds = 2000;
  std::thread pong([&] {
    for (int r = 1; r <= kRounds; ++r) {
      hb.wait();
      for (auto& w : b.mailbox)
        ASSERT_EQ(w, static_cast<std::uint64_t>(r));  // written by a before its signal
      for (auto& w : a.mailbox) w = r;                // plain writes, ordered by the signal below
      hb.signal();
    }
  });
  for (int r = 1; r <= kRounds; ++r) {
    for (auto& w : b.mailbox) w = r;
    ha.signal();
    ha.wait();
    for (auto& w : a.mailbox) ASSERT_EQ(w, static_cast<std::uint64_t>(r));
  }
  pong.join();
  EXPECT_EQ(a.outbound, static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(b.inbound, static_cast<std::uint64_t>(kRounds));
  EXPECT_FALSE(ha.poll());
}

TEST(DeviceSemaphoreDeathTest, WaitThatIsNeverSignalledReportsAndStops) {
  std::uint64_t inbound = 0, expected = 0, outbound = 0;
  SemaphoreDeviceHandle h{&inbound, &expected, &outbound, nullptr, {3, 5, 50'000'000ull}};
  EXPECT_DEATH(h.wait(), "rank 3: semaphore wait waiting for rank 5 timed out");
}

TEST(DeviceMemoryChannel, PutGetAndPacketsThroughTheHandle) {
  auto local = randomBytes(1000, 5);
  std::vector<unsigned char> remote(1000, 0), packets(4096, 0), back(1000, 0);
  std::uint64_t tokens[6] = {};
  MemoryChannelDeviceHandle ch;
  ch.dst = remote.data();
  ch.src = local.data();
  ch.packets = packets.data();
  ch.semaphore = {&tokens[0], &tokens[1], &tokens[2], &tokens[0], {0, 0, 1'000'000'000ull}};
  ch.put(10, 3, 500, 0, 1);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(remote[10 + i], local[3 + i]);
  ch.src = back.data();
  ch.get(10, 0, 500, 0, 1);  // back[0..500) = remote[10..510)
  for (int i = 0; i < 500; ++i) ASSERT_EQ(back[i], local[3 + i]);
  // Loopback packets: dst is our own packet buffer here.
  ch.dst = packets.data();
  ch.src = local.data();
  ch.putPackets(0, 8, 333, 9, 0, 1);
  std::vector<unsigned char> unpacked(333);
  ch.src = unpacked.data();
  ch.unpackPackets(0, 0, 333, 9, 0, 1);
  for (int i = 0; i < 333; ++i) ASSERT_EQ(unpacked[i], local[8 + i]);
  ch.signal();  // a channel to itself: its own wait consumes the signal
  ch.wait();
  EXPECT_EQ(tokens[0], 1u);
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(PortRequest, EncodeDecodeRoundTripAtTheLimits) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100000; ++i) {
    PortRequest r;
    r.kinds = static_cast<std::uint32_t>(1 + rng() % 7);  // never 0: that marks a PortPutRequest
    r.channel = static_cast<std::uint32_t>(rng() % PortRequest::kMaxChannels);
    r.dstOffset = rng() & PortRequest::kMaxOffset;
    r.srcOffset = rng() & PortRequest::kMaxOffset;
    r.bytes = rng() & PortRequest::kMaxBytes;
    if (i == 0)
      r = {7, PortRequest::kMaxChannels - 1, PortRequest::kMaxOffset, PortRequest::kMaxOffset,
           PortRequest::kMaxBytes};
    ProxyTrigger t = r.encode();
    ASSERT_EQ(t.fst & kTriggerFullBit, 0u) << "the encoding must leave the FIFO's bit alone";
    ASSERT_FALSE(PortPutRequest::isFirstHalf(t));
    PortRequest back = PortRequest::decode(t);
    ASSERT_EQ(back.kinds, r.kinds);
    ASSERT_EQ(back.channel, r.channel);
    ASSERT_EQ(back.dstOffset, r.dstOffset);
    ASSERT_EQ(back.srcOffset, r.srcOffset);
    ASSERT_EQ(back.bytes, r.bytes);
  }
}

TEST(PortPutRequest, EncodeDecodeRoundTripAtTheLimits) {
  std::mt19937_64 rng(12);
  for (int i = 0; i < 100000; ++i) {
    PortPutRequest r;
    r.kinds = static_cast<std::uint32_t>(PortRequest::Put | (rng() % 8 & 6));
    r.channel = static_cast<std::uint32_t>(rng() % PortRequest::kMaxChannels);
    r.dst = static_cast<MemoryId>(rng() % (PortPutRequest::kMaxMemory + 1));
    r.src = static_cast<MemoryId>(rng() % (PortPutRequest::kMaxMemory + 1));
    r.dstOffset = rng();
    r.srcOffset = rng();
    r.bytes = rng() & PortPutRequest::kMaxBytes;
    if (i == 0) r = {7, PortRequest::kMaxChannels - 1, kLocalPointer, kLocalPointer, ~0ull, ~0ull, PortPutRequest::kMaxBytes};
    ProxyTrigger first, second;
    r.encode(first, second);
    ASSERT_EQ(first.fst & kTriggerFullBit, 0u);
    ASSERT_EQ(second.fst & kTriggerFullBit, 0u);
    ASSERT_TRUE(PortPutRequest::isFirstHalf(first));
    const PortPutRequest back = PortPutRequest::decode(first, second);
    ASSERT_EQ(back.kinds, r.kinds);
    ASSERT_EQ(back.channel, r.channel);
    ASSERT_EQ(back.dst, r.dst);
    ASSERT_EQ(back.src, r.src);
    ASSERT_EQ(back.dstOffset, r.dstOffset);
    ASSERT_EQ(back.srcOffset, r.srcOffset);
    ASSERT_EQ(back.bytes, r.bytes);
  }
}

// Puts naming memories take two slots each, reserved at once: with four host threads pushing into a
// small FIFO, every pair reaches the consumer whole (its halves in consecutive slots), large puts
// are cut into 1 GiB parts, and only the last part carries the signal.
TEST(PortChannelHandle, NamedPutsArriveAsWholePairsFromManyProducers) {
  constexpr int kSize = 8, kThreads = 4, kPuts = 2000;
  std::vector<ProxyTrigger> slots(kSize);
  std::uint64_t head = 0, tail = 0, tailCache = 0;
  PortChannelDeviceHandle ch;
  ch.fifo = {slots.data(), &head, &tail, &tailCache, kSize, {0, 1, 5'000'000'000ull}};
  std::vector<PortPutRequest> seen;
  std::atomic<bool> stop{false};
  std::thread proxy([&] {
    ProxyTrigger first{};
    bool haveFirst = false;
    while (!stop) {
      ProxyTrigger& t = slots[tail % kSize];
      const std::uint64_t fst = atomicLoad(&t.fst, memory_order_acquire);
      if (!(fst & kTriggerFullBit)) continue;
      const ProxyTrigger got{fst & ~kTriggerFullBit, t.snd};
      if (haveFirst) {
        seen.push_back(PortPutRequest::decode(first, got));
        haveFirst = false;
      } else {
        ASSERT_TRUE(PortPutRequest::isFirstHalf(got));
        first = got;
        haveFirst = true;
      }
      atomicStore(&t.fst, std::uint64_t{0}, memory_order_relaxed);
      atomicStore(&tail, tail + 1, memory_order_release);
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kThreads; ++p)
    producers.emplace_back([&, p] {
      PortChannelDeviceHandle mine = ch;
      mine.channel = static_cast<std::uint32_t>(p);
      for (int i = 0; i < kPuts; ++i)
        mine.put(static_cast<MemoryId>(p + 1), static_cast<std::uint64_t>(i), kLocalPointer, static_cast<std::uint64_t>(i) * 3,
                 static_cast<std::uint64_t>(i) + 1);
    });
  for (auto& t : producers) t.join();
  ch.channel = 9;
  const std::uint64_t big = (std::uint64_t{2} << 30) + 5;  // three parts
  ch.putWithSignal(3, 10, 4, 20, big);
  while (atomicLoad(&tail, memory_order_acquire) < atomicLoad(&head, memory_order_relaxed)) std::this_thread::yield();
  stop = true;
  proxy.join();
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kThreads * kPuts + 3));
  std::vector<int> next(kThreads, 0);
  for (std::size_t k = 0; k < seen.size() - 3; ++k) {
    const PortPutRequest& r = seen[k];
    ASSERT_LT(r.channel, static_cast<std::uint32_t>(kThreads));
    const int i = next[r.channel]++;  // one producer's puts stay in its order
    EXPECT_EQ(r.dst, r.channel + 1);
    EXPECT_EQ(r.src, kLocalPointer);
    EXPECT_EQ(r.dstOffset, static_cast<std::uint64_t>(i));
    EXPECT_EQ(r.srcOffset, static_cast<std::uint64_t>(i) * 3);
    EXPECT_EQ(r.bytes, static_cast<std::uint64_t>(i) + 1);
    EXPECT_EQ(r.kinds, std::uint32_t{PortRequest::Put});
  }
  std::uint64_t covered = 0;
  for (std::size_t k = seen.size() - 3; k < seen.size(); ++k) {
    EXPECT_EQ(seen[k].channel, 9u);
    EXPECT_EQ(seen[k].dstOffset, 10 + covered);
    EXPECT_EQ(seen[k].srcOffset, 20 + covered);
    EXPECT_EQ(seen[k].kinds, k + 1 == seen.size() ? std::uint32_t{PortRequest::Put | PortRequest::Signal}
                                                  : std::uint32_t{PortRequest::Put});
    covered += seen[k].bytes;
  }
  EXPECT_EQ(covered, big);
}

// A PortChannel handle pushing into a host FIFO drained by a fake proxy thread: large puts are
// split into parts that tile the range exactly, the signal and flush ride only on the last part,
// and flush returns only after the proxy handled it.
TEST(PortChannelHandle, SplitsLargePutsAndFlushWaitsForTheProxy) {
  constexpr int kSize = 8;
  std::vector<ProxyTrigger> slots(kSize);
  std::uint64_t head = 0, tail = 0, tailCache = 0;
  PortChannelDeviceHandle ch;
  ch.fifo = {slots.data(), &head, &tail, &tailCache, kSize, {0, 1, 5'000'000'000ull}};
  ch.channel = 17;
  std::vector<PortRequest> seen;
  std::atomic<bool> stop{false};
  std::thread proxy([&] {
    while (!stop) {
      ProxyTrigger& t = slots[tail % kSize];
      std::uint64_t fst = atomicLoad(&t.fst, memory_order_acquire);
      if (!(fst & kTriggerFullBit)) continue;
      seen.push_back(PortRequest::decode({fst & ~kTriggerFullBit, t.snd}));
      atomicStore(&t.fst, std::uint64_t{0}, memory_order_relaxed);
      atomicStore(&tail, tail + 1, memory_order_release);
    }
  });
  const std::uint64_t big = (std::uint64_t{5} << 30) + 3;  // 5 GiB + 3: six parts
  ch.putWithSignalAndFlush(100, 200, big);
  std::size_t handled = seen.size();  // flush returned: the proxy has handled every part
  ch.flush();
  stop = true;
  proxy.join();
  ASSERT_EQ(handled, 6u);
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(seen[i].channel, 17u);
    EXPECT_EQ(seen[i].dstOffset, 100 + covered);
    EXPECT_EQ(seen[i].srcOffset, 200 + covered);
    EXPECT_EQ(seen[i].kinds,
              i < 5 ? std::uint32_t{PortRequest::Put}
                    : std::uint32_t{PortRequest::Put | PortRequest::Signal | PortRequest::Flush});
    covered += seen[i].bytes;
  }
  EXPECT_EQ(covered, big);
  ASSERT_EQ(seen.size(), 7u);
  EXPECT_EQ(seen[6].kinds, std::uint32_t{PortRequest::Flush});
}

// With the service's flushed words, flush() returns when the proxy publishes the flush's slot, not
// when the FIFO slot retires (the proxy may retire it long before the copies are done).
TEST(PortChannelHandle, FlushWaitsForTheFlushedWordOfItsChannel) {
  constexpr int kSize = 8;
  std::vector<ProxyTrigger> slots(kSize);
  std::uint64_t head = 0, tail = 0, tailCache = 0;
  std::vector<std::uint64_t> flushed(8, 0);
  PortChannelDeviceHandle ch;
  ch.fifo = {slots.data(), &head, &tail, &tailCache, kSize, {0, 1, 5'000'000'000ull}};
  ch.channel = 5;
  ch.flushed = flushed.data();
  std::atomic<bool> stop{false}, published{false};
  std::thread proxy([&] {
    while (!stop) {
      ProxyTrigger& t = slots[tail % kSize];
      const std::uint64_t fst = atomicLoad(&t.fst, memory_order_acquire);
      if (!(fst & kTriggerFullBit)) continue;
      const PortRequest r = PortRequest::decode({fst & ~kTriggerFullBit, t.snd});
      const std::uint64_t slot = tail;
      atomicStore(&t.fst, std::uint64_t{0}, memory_order_relaxed);
      atomicStore(&tail, tail + 1, memory_order_release);  // retired at once, as the service does
      if (r.kinds & PortRequest::Flush) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the copies take a while
        published = true;
        atomicStore(&flushed[r.channel], slot + 1, memory_order_release);
      }
    }
  });
  ch.put(0, 0, 100);
  ch.flush();
  EXPECT_TRUE(published.load()) << "flush returned before the proxy published it";
  published = false;
  ch.putWithSignalAndFlush(0, 0, 100);
  EXPECT_TRUE(published.load()) << "putWithSignalAndFlush returned before the proxy published it";
  stop = true;
  proxy.join();
  EXPECT_EQ(flushed[5], 3u);  // slots 0 (put), 1 (flush), 2 (put, signal, flush)
}

}  // namespace
}  // namespace ferry
