// Fusing runs of a thread block's ops (rank_program.hpp, fuseRankProgram). The interpreter pays for
// each op: a block barrier after it, its references resolved again, its source loaded again; and a
// reduce_packets waits for one sender's packets before the next op asks for the next sender's, so an
// all-pairs packet allreduce written op by op waited R - 1 memory round trips where the native
// kernel waits one (readPackets); and the waits on several peers' signals, one thread after the
// other, cost a flag round trip each where the native kernels wait on every peer at once. A fused
// op does the run's work word by word, in the run's order; the waits, all at once.
#include <cstddef>
#include <vector>

#include "executor/rank_program.hpp"

namespace ferry::executor {
namespace {

OpKind kindOf(const ExecOp& op) { return static_cast<OpKind>(op.kind); }

bool sameRef(const ExecRef& a, const ExecRef& b) {
  return a.buffer == b.buffer && a.rank == b.rank && a.index == b.index && a.count == b.count;
}

bool isPutPackets(const ExecOp& op) { return kindOf(op) == OpKind::PutPackets && op.proxy == 0; }
bool isWait(const ExecOp& op) { return kindOf(op) == OpKind::Wait; }

// A reduce_packets into dst whose packets cover as many chunks as dst.
bool reducesPacketsInto(const ExecOp& op, const ExecRef& dst) {
  return kindOf(op) == OpKind::ReducePackets && sameRef(op.dst, dst) && op.src.count == dst.count && op.peer >= 0;
}

// A local copy whose source and destination are the same chunks of two buffers (so the copy's pieces
// and the reduces' pieces are the same elements, in every lane) and not the packet region.
bool copiesInPlaceOf(const ExecOp& op) {
  const auto scratch = static_cast<std::int8_t>(BufferKind::Scratch);
  return kindOf(op) == OpKind::Copy && op.src.rank == kLocal && op.dst.rank == kLocal && op.src.buffer != scratch &&
         op.dst.buffer != scratch && op.src.index == op.dst.index && op.src.count == op.dst.count;
}

class Fuser {
 public:
  explicit Fuser(RankProgram& program) : p_(program) {}

  void run() {
    std::vector<ExecOp> ops;
    std::vector<std::uint32_t> first;
    for (int tb = 0; tb < p_.threadBlocks(); ++tb) {
      first.push_back(static_cast<std::uint32_t>(ops.size()));
      const std::size_t end = p_.tbFirst[static_cast<std::size_t>(tb) + 1];
      for (std::size_t i = p_.tbFirst[static_cast<std::size_t>(tb)]; i < end;) i = next(i, end, ops);
    }
    first.push_back(static_cast<std::uint32_t>(ops.size()));
    p_.ops = std::move(ops);
    p_.tbFirst = std::move(first);
  }

 private:
  // Appends the op (or fused run) that starts at i; returns the index after it.
  std::size_t next(std::size_t i, std::size_t end, std::vector<ExecOp>& out) {
    const std::vector<ExecOp>& ops = p_.ops;
    const ExecOp& op = ops[i];
    if (isWait(op)) {
      std::size_t j = i + 1;
      while (j < end && j - i < static_cast<std::size_t>(kMaxWaitRun) && isWait(ops[j])) ++j;
      if (j - i < 2) return keep(op, i, out);
      ExecOp f;
      f.kind = static_cast<std::uint8_t>(FusedKind::WaitOnMany);
      f.firstRef = static_cast<std::uint32_t>(p_.refs.size());
      f.nsrcs = static_cast<std::uint16_t>(j - i);
      for (std::size_t k = i; k < j; ++k) {
        ExecRef wait;  // (rank_program.hpp, WaitOnMany)
        wait.rank = ops[k].peer;
        wait.count = static_cast<std::int32_t>(ops[k].slot);
        wait.index = static_cast<std::int32_t>(ops[k].seq);
        p_.refs.push_back(wait);
      }
      out.push_back(f);
      return j;
    }
    if (isPutPackets(op)) {
      std::size_t j = i + 1;
      while (j < end && j - i < static_cast<std::size_t>(kMaxFusedRun) && isPutPackets(ops[j]) &&
             sameRef(ops[j].src, op.src) && ops[j].dst.count == op.dst.count)
        ++j;
      if (j - i < 2) return keep(op, i, out);
      ExecOp f;
      f.kind = static_cast<std::uint8_t>(FusedKind::PutPacketsToMany);
      f.src = op.src;
      f.dst = op.dst;
      f.firstRef = static_cast<std::uint32_t>(p_.refs.size());
      f.nsends = static_cast<std::uint16_t>(j - i);
      for (std::size_t k = i; k < j; ++k) p_.refs.push_back(ops[k].dst);
      out.push_back(f);
      return j;
    }
    // A copy then reduces into its destination, or reduces into one destination (from itself).
    const bool copy = copiesInPlaceOf(op);
    const ExecRef dst = op.dst;
    std::size_t j = copy ? i + 1 : i;
    while (j < end && j - i - (copy ? 1 : 0) < static_cast<std::size_t>(kMaxFusedRun) &&
           reducesPacketsInto(ops[j], dst))
      ++j;
    const std::size_t reduces = j - i - (copy ? 1 : 0);
    if (reduces < (copy ? 1u : 2u)) return keep(op, i, out);
    ExecOp f;
    f.kind = static_cast<std::uint8_t>(FusedKind::ReducePacketsFromMany);
    f.src = copy ? op.src : dst;
    f.dst = dst;
    f.firstRef = static_cast<std::uint32_t>(p_.refs.size());
    f.nsrcs = static_cast<std::uint16_t>(reduces);
    for (std::size_t k = j - reduces; k < j; ++k) {
      ExecRef packets = ops[k].src;  // this rank's scratch; `rank` carries the sender from here on
      packets.rank = ops[k].peer;
      p_.refs.push_back(packets);
    }
    out.push_back(f);
    return j;
  }

  static std::size_t keep(const ExecOp& op, std::size_t i, std::vector<ExecOp>& out) {
    out.push_back(op);
    return i + 1;
  }

  RankProgram& p_;
};

}  // namespace

void fuseRankProgram(RankProgram& program) { Fuser(program).run(); }

}  // namespace ferry::executor
