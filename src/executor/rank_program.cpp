// Flattening a plan for one rank (rank_program.hpp). Flag rows: channel c of rank r, the k-th of
// its type to peer p, uses row 1 + 2k (memory) or 2 + 2k (port) in p's flags, cell r; its pair on
// p is also the k-th of that type to r, so both ends name the same row, and a row is written by
// one thread block of one rank only, which keeps its values rising (device_context.hpp).
#include "executor/rank_program.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "ferry/device/packet.hpp"

namespace ferry::executor {
namespace {

using i64 = std::int64_t;

bool isPacketOp(OpKind k) {
  return k == OpKind::PutPackets || k == OpKind::UnpackPackets || k == OpKind::ReducePackets;
}

class Compiler {
 public:
  Compiler(const Plan& plan, int rank) : plan_(plan), rank_(rank), me_(plan.ranks.at(static_cast<std::size_t>(rank))) {}

  RankProgram run() {
    assignSlots();
    findPacketSenders();
    const auto& tbs = me_.threadBlocks;
    if (tbs.size() > static_cast<std::size_t>(kMaxThreadBlocks))
      fail("ranks[" + std::to_string(rank_) + "].thread_blocks",
           std::to_string(tbs.size()) + " thread blocks; the executor runs at most " +
               std::to_string(kMaxThreadBlocks),
           -1, -1);
    for (std::size_t b = 0; b < tbs.size(); ++b) {
      out_.tbFirst.push_back(static_cast<std::uint32_t>(out_.ops.size()));
      for (std::size_t i = 0; i < tbs[b].ops.size(); ++i) out_.ops.push_back(compile(tbs[b].ops[i], static_cast<i64>(b), static_cast<i64>(i)));
    }
    out_.tbFirst.push_back(static_cast<std::uint32_t>(out_.ops.size()));
    out_.ll = plan_.protocol == Protocol::LL;
    for (const RankPlan& r : plan_.ranks) {
      out_.widestRank = std::max(out_.widestRank, static_cast<int>(r.threadBlocks.size()));
      for (const Channel& ch : r.channels)
        out_.planHasPortChannels = out_.planHasPortChannels || ch.type == ChannelType::Port;
    }
    return std::move(out_);
  }

 private:
  struct ChannelUse {
    i64 signalTb = -1, waitTb = -1;
    std::uint32_t signals = 0, waits = 0;
  };

  [[noreturn]] void fail(const std::string& path, const std::string& message, i64 tb, i64 op) const {
    throw PlanError(path, message + " (a limit of the executor, not of the format)", rank_, tb, op, "malformed");
  }
  std::string opPath(i64 tb, i64 op) const {
    return "ranks[" + std::to_string(rank_) + "].thread_blocks[" + std::to_string(tb) + "].ops[" + std::to_string(op) + "]";
  }

  void assignSlots() {
    std::map<std::pair<ChannelType, i64>, int> seen;
    for (std::size_t c = 0; c < me_.channels.size(); ++c) {
      const Channel& ch = me_.channels[c];
      const std::string path = "ranks[" + std::to_string(rank_) + "].channels[" + std::to_string(c) + "]";
      if (ch.type == ChannelType::Switch)
        fail(path, "a switch channel (NVLink multicast), which the executor never runs", -1, -1);
      const int k = seen[{ch.type, ch.peer}]++;
      const int row = 1 + 2 * k + (ch.type == ChannelType::Port ? 1 : 0);
      if (row > kMaxChannelSlots)
        fail(path, "more than " + std::to_string(kMaxChannelSlots / 2) + " channels of one type to rank " +
                       std::to_string(ch.peer),
             -1, -1);
      slots_.push_back(static_cast<std::uint16_t>(row));
    }
    uses_.resize(me_.channels.size());
  }

  // LL: who fills each of this rank's scratch chunks, and that every receiver of this rank's
  // packets gets each chunk once. Looks at every rank, so all ranks refuse a plan alike.
  void findPacketSenders() {
    if (plan_.protocol != Protocol::LL) return;
    // (receiver, chunk) -> sender rank
    std::map<std::pair<i64, i64>, i64> sender;
    for (const RankPlan& rp : plan_.ranks)
      for (std::size_t b = 0; b < rp.threadBlocks.size(); ++b)
        for (std::size_t i = 0; i < rp.threadBlocks[b].ops.size(); ++i) {
          const Op& op = rp.threadBlocks[b].ops[i];
          if (op.kind != OpKind::PutPackets) continue;
          const i64 to = rp.channels[static_cast<std::size_t>(op.channel)].peer;
          for (i64 k = op.dst.index; k < op.dst.index + op.dst.count; ++k)
            if (!sender.emplace(std::pair{to, k}, rp.rank).second)
              throw PlanError("ranks[" + std::to_string(rp.rank) + "].thread_blocks[" + std::to_string(b) + "].ops[" +
                                  std::to_string(i) + "]",
                              "scratch chunk " + std::to_string(k) + " of rank " + std::to_string(to) +
                                  " receives packets more than once per call (a limit of the executor, not "
                                  "of the format)",
                              rp.rank, static_cast<i64>(b), static_cast<i64>(i), "malformed");
        }
    for (const auto& [key, from] : sender)
      if (key.first == rank_) packetSender_[key.second] = from;
  }

  ExecRef ref(const ChunkRef& c, int rank) {
    ExecRef r;
    r.buffer = static_cast<std::int8_t>(c.buffer);
    r.rank = static_cast<std::int8_t>(rank);
    r.index = static_cast<std::int32_t>(c.index);
    r.count = static_cast<std::int32_t>(c.count);
    if (rank != kLocal && c.buffer != BufferKind::Scratch)
      out_.touchesPeerBuffers = out_.finalExchange = true;
    return r;
  }
  int peerOf(i64 channel) const { return static_cast<int>(me_.channels[static_cast<std::size_t>(channel)].peer); }

  // A reference to scratch outside the packet ops of an LL plan, or a packet op in a Simple plan.
  void checkProtocol(const Op& op, i64 tb, i64 i) const {
    const bool ll = plan_.protocol == Protocol::LL;
    if (!ll && isPacketOp(op.kind)) fail(opPath(tb, i), "a packet op in a Simple-protocol plan", tb, i);
    if (!ll || isPacketOp(op.kind)) return;
    bool scratch = op.src.present() && op.src.buffer == BufferKind::Scratch;
    scratch = scratch || (op.dst.present() && op.dst.buffer == BufferKind::Scratch);
    for (const ChunkRef& s : op.srcs) scratch = scratch || s.buffer == BufferKind::Scratch;
    for (const Send& s : op.sends) scratch = scratch || s.dst.buffer == BufferKind::Scratch;
    if (scratch) fail(opPath(tb, i), "an LL plan's scratch holds packets only; this op uses it otherwise", tb, i);
  }

  void countUse(i64 channel, bool isSignal, ExecOp& e, i64 tb, i64 i) {
    ChannelUse& u = uses_[static_cast<std::size_t>(channel)];
    i64& owner = isSignal ? u.signalTb : u.waitTb;
    if (owner >= 0 && owner != tb)
      fail(opPath(tb, i),
           std::string(isSignal ? "signals" : "waits on") + " channel " + std::to_string(channel) +
               ", which thread block " + std::to_string(owner) + " also " + (isSignal ? "signals" : "waits on") +
               "; give each thread block its own channels",
           tb, i);
    owner = tb;
    std::uint32_t& n = isSignal ? u.signals : u.waits;
    if (++n >= (1u << 17)) fail(opPath(tb, i), "more than 2^17 - 1 signals or waits on one channel", tb, i);
    e.seq = n;
    e.slot = slots_[static_cast<std::size_t>(channel)];
  }

  ExecOp compile(const Op& op, i64 tb, i64 i) {
    checkProtocol(op, tb, i);
    ExecOp e;
    e.kind = static_cast<std::uint8_t>(op.kind);
    if (op.channel != kNoChannel) {
      e.peer = static_cast<std::int8_t>(peerOf(op.channel));
      const bool port = me_.channels[static_cast<std::size_t>(op.channel)].type == ChannelType::Port;
      if (port && (op.kind == OpKind::Put || op.kind == OpKind::Signal || op.kind == OpKind::Flush)) {
        e.proxy = 1;
        out_.usesPortChannels = true;
      }
    }
    switch (op.kind) {
      case OpKind::Put:
      case OpKind::PutPackets:
        e.src = ref(op.src, kLocal);
        e.dst = ref(op.dst, peerOf(op.channel));
        break;
      case OpKind::Get:
        e.src = ref(op.src, peerOf(op.channel));
        e.dst = ref(op.dst, kLocal);
        break;
      case OpKind::Signal:
      case OpKind::Wait:
        countUse(op.channel, op.kind == OpKind::Signal, e, tb, i);
        break;
      case OpKind::Flush:
      case OpKind::Barrier: break;
      case OpKind::Copy:
        e.src = ref(op.src, kLocal);
        e.dst = ref(op.dst, kLocal);
        break;
      case OpKind::UnpackPackets:
      case OpKind::ReducePackets: {
        e.src = ref(op.src, kLocal);
        e.dst = ref(op.dst, kLocal);
        i64 from = -1;
        for (i64 k = op.src.index; k < op.src.index + op.src.count; ++k) {
          const auto it = packetSender_.find(k);
          if (it == packetSender_.end())
            fail(opPath(tb, i), "reads packets of scratch chunk " + std::to_string(k) + ", which no rank sends", tb, i);
          if (from >= 0 && it->second != from)
            fail(opPath(tb, i), "reads packets from ranks " + std::to_string(from) + " and " +
                                    std::to_string(it->second) + " in one op",
                 tb, i);
          from = it->second;
        }
        e.peer = static_cast<std::int8_t>(from);
        break;
      }
      case OpKind::Reduce:
      case OpKind::ReadReduceCopySend: {
        if (op.srcs.size() > static_cast<std::size_t>(kMaxOpSources))
          fail(opPath(tb, i) + ".srcs", std::to_string(op.srcs.size()) + " sources; at most " +
                                            std::to_string(kMaxOpSources),
               tb, i);
        if (op.sends.size() + 1 > static_cast<std::size_t>(kMaxOpDestinations))
          fail(opPath(tb, i) + ".sends", std::to_string(op.sends.size()) + " sends; at most " +
                                             std::to_string(kMaxOpDestinations - 1),
               tb, i);
        e.dst = ref(op.dst, kLocal);
        e.firstRef = static_cast<std::uint32_t>(out_.refs.size());
        e.nsrcs = static_cast<std::uint16_t>(op.srcs.size());
        e.nsends = static_cast<std::uint16_t>(op.sends.size());
        for (const ChunkRef& s : op.srcs) out_.refs.push_back(ref(s, s.channel == kNoChannel ? kLocal : peerOf(s.channel)));
        for (const Send& s : op.sends) {
          // The kernel stores a send through the peer's mapping: a port channel's peer may have none
          // (another host), and its signal orders the proxy's copies, not stores.
          if (me_.channels[static_cast<std::size_t>(s.channel)].type == ChannelType::Port)
            fail(opPath(tb, i) + ".sends", "a send on a port channel; sends go on memory channels", tb, i);
          out_.refs.push_back(ref(s.dst, peerOf(s.channel)));
        }
        break;
      }
    }
    return e;
  }

  const Plan& plan_;
  int rank_;
  const RankPlan& me_;
  std::vector<std::uint16_t> slots_;
  std::vector<ChannelUse> uses_;
  std::map<i64, i64> packetSender_;  // this rank's scratch chunk -> the rank whose packets fill it
  RankProgram out_;
};

}  // namespace

RankProgram compileRankProgram(const Plan& plan, int rank) { return Compiler(plan, rank).run(); }

int planLanes(const RankProgram& program, std::uint64_t bytes, int maxLanes, int maxBlocks, bool portsOnProxy) {
  if (program.planHasPortChannels && portsOnProxy) return 1;
  const auto fit = static_cast<std::uint64_t>(std::min(maxBlocks, kMaxThreadBlocks) / program.widestRank);
  const std::uint64_t want = std::max<std::uint64_t>(1, bytes / (program.ll ? kLaneBytesLL : kLaneBytes));
  const std::uint64_t most = std::min<std::uint64_t>(
      {static_cast<std::uint64_t>(std::max(1, maxLanes)), static_cast<std::uint64_t>(kMaxLanes), fit});
  return static_cast<int>(std::max<std::uint64_t>(1, std::min(want, most)));
}

bool peersWaitOutAccesses(const std::vector<RankProgram>& programs) {
  auto waitedFor = [&](int waiter, int signaller, const ExecOp& signal) {
    for (const ExecOp& op : programs[static_cast<std::size_t>(waiter)].ops)
      if (static_cast<OpKind>(op.kind) == OpKind::Wait && op.peer == signaller && op.slot == signal.slot &&
          op.seq == signal.seq)
        return true;
    return false;
  };
  for (std::size_t me = 0; me < programs.size(); ++me) {
    const RankProgram& prog = programs[me];
    for (int tb = 0; tb < prog.threadBlocks(); ++tb) {
      // Per peer: this block has touched its input or output since its last waited-for signal to
      // it; and a port-channel put into it has not been flushed yet (only a port channel's signal
      // or flush flushes the channel; a memory channel's signal does not).
      std::vector<char> unsignalled(programs.size(), 0), unflushed(programs.size(), 0);
      for (std::uint32_t i = prog.tbFirst[static_cast<std::size_t>(tb)];
           i < prog.tbFirst[static_cast<std::size_t>(tb) + 1]; ++i) {
        const ExecOp& op = prog.ops[i];
        const auto kind = static_cast<OpKind>(op.kind);
        auto note = [&](const ExecRef& r) {
          if (r.rank == kLocal || r.buffer == static_cast<std::int8_t>(BufferKind::Scratch)) return;
          unsignalled[static_cast<std::size_t>(r.rank)] = 1;
          if (op.proxy) unflushed[static_cast<std::size_t>(r.rank)] = 1;
        };
        note(op.src);
        note(op.dst);
        for (std::uint32_t k = 0; k < static_cast<std::uint32_t>(op.nsrcs + op.nsends); ++k) note(prog.refs[op.firstRef + k]);
        if (op.peer < 0) continue;
        const auto peer = static_cast<std::size_t>(op.peer);
        if ((kind == OpKind::Flush || kind == OpKind::Signal) && op.proxy) unflushed[peer] = 0;
        if (kind == OpKind::Signal && !unflushed[peer] && waitedFor(op.peer, static_cast<int>(me), op))
          unsignalled[peer] = 0;
      }
      for (char left : unsignalled)
        if (left) return false;
    }
  }
  return true;
}

ChunkGeometry chunkGeometry(const Plan& plan, std::uint64_t count, std::uint64_t elements) {
  ChunkGeometry g;
  g.groupElements = elements;
  g.groupStride = count;
  switch (plan.collective) {
    case Collective::ReduceScatter: g.groupChunks = static_cast<std::uint64_t>(plan.chunks.output); break;
    case Collective::AllToAll:
      g.groupChunks = static_cast<std::uint64_t>(plan.chunks.input / plan.worldSize);
      break;
    default: g.groupChunks = static_cast<std::uint64_t>(plan.chunks.input); break;
  }
  g.chunkElements = (elements + g.groupChunks - 1) / g.groupChunks;
  return g;
}

ChunkGeometry chunkGeometry(const Plan& plan, std::uint64_t count) {
  return chunkGeometry(plan, count, count);
}

PlanRounds planRounds(const Plan& plan, std::uint64_t count, std::uint64_t elementBytes, std::uint64_t room) {
  const auto scratch = static_cast<std::uint64_t>(plan.chunks.scratch);
  const ChunkGeometry whole = chunkGeometry(plan, count);
  const std::uint64_t chunkBytes = whole.chunkElements * elementBytes;
  const bool ll = plan.protocol == Protocol::LL;
  const std::uint64_t need = scratch * (ll ? packetBufferBytes<LL16Packet>(chunkBytes) : chunkBytes);
  if (need <= room) return {count, 1};
  // The longest scratch chunk that fits, in whole 16-byte grains (chunks then start aligned in
  // every round, as lanes want them).
  const std::uint64_t perChunk = room / scratch;
  const std::uint64_t dataBytes = ll ? perChunk / sizeof(LL16Packet) * LL16Packet::kDataBytes : perChunk;
  const std::uint64_t grain = std::max<std::uint64_t>(16 / elementBytes, 1);
  const std::uint64_t chunkElements = dataBytes / elementBytes / grain * grain;
  if (chunkElements == 0) return {0, 0};
  const std::uint64_t elements = chunkElements * whole.groupChunks;
  return {elements, (count + elements - 1) / elements};
}

}  // namespace ferry::executor
