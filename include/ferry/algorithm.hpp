#pragma once
// Algorithms are values of a Comm. Every Comm owns a registry of the algorithms it may run: the
// built-in ones and the plans of FERRY_PLAN_DIR when it is made, then whatever the program adds at
// run time (a Plan, or a NativeAlgorithm of its own), removes, or forces for a collective.
//
//   ferry::Plan plan = ferry::Plan::fromFile("allreduce_ring.json");   // checked, compiled once
//   comm.addPlan(plan);                                                // every rank; runs as "plan:allreduce_ring"
//   comm.addAlgorithm(std::make_shared<MyAllReduce>());                // every rank
//   comm.setAlgorithm(ferry::Collective::AllReduce, "my_allreduce");  // or leave the choice to the selector
//   for (const auto& a : comm.algorithms()) std::cout << a.name << ": " << a.constraints << "\n";
//   comm.removeAlgorithm("plan:allreduce_ring");                       // every rank
//
// Adding and removing are collective (every rank, same algorithm, same order; a rank that differs
// gets Error(InvalidUsage) naming both), so every rank's selector keeps choosing alike. An added
// algorithm is preferred over the tuning table for every call it says it can run (whyNot empty),
// the most recently added first. Forcing is local, as NCCL's per-communicator settings are.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/collective.hpp"
#include "ferry/datatype.hpp"

namespace ferry {

class Comm;

// One collective call as an algorithm sees it: the arguments of the Comm call, checked.
struct CollectiveArgs {
  Collective collective = Collective::AllReduce;
  const void* send = nullptr;  // null where this rank reads no input (a broadcast off the root)
  void* recv = nullptr;        // null where this rank writes no output (a reduce off the root)
  // As the Comm call takes it: per rank for allGather (sendCount) and reduceScatter (recvCount), per
  // peer for allToAll, the whole buffer otherwise.
  std::size_t count = 0;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  cudaStream_t stream = nullptr;
  int rank = 0;
  int worldSize = 1;
  bool registered = false;  // every buffer this rank uses lies in a Comm::registerBuffer range
  bool inPlace = false;
  std::size_t bytes = 0;  // the larger of the send and recv buffers
};

// An algorithm written by the user: any CUDA code that runs the collective on call.stream, usually
// through channels made in setup() (ferry/memory_channel.hpp, ferry/port_channel.hpp).
//
//   class MyAllReduce : public ferry::NativeAlgorithm {
//     std::string name() const override { return "my_allreduce"; }
//     ferry::Collective collective() const override { return ferry::Collective::AllReduce; }
//     void setup(ferry::Comm& comm) override { /* connect, register, make channels (collective) */ }
//     std::string whyNot(const ferry::CollectiveArgs& c) const override {
//       return c.bytes <= (1 << 20) ? "" : "more than 1 MiB";
//     }
//     void launch(const ferry::CollectiveArgs& c) override { myKernel<<<8, 512, 0, c.stream>>>(...); }
//   };
class FERRY_API NativeAlgorithm {
 public:
  virtual ~NativeAlgorithm() = default;
  // Unique within a Comm; "plan:" names are the plans'.
  virtual std::string name() const = 0;
  virtual Collective collective() const = 0;
  // Called once, on every rank, when the algorithm is added to `comm` (after the ranks agreed on
  // it); collective work such as connecting channels belongs here (through comm.communicator(),
  // on tags below 0x1000: the Comm's own exchanges use higher ones). An exception on any rank
  // fails the add on every rank.
  virtual void setup(Comm& comm) { (void)comm; }
  // Empty when the algorithm can run `call`; otherwise why not, as a phrase. It must depend only on
  // the call's shape (collective, count, type, op, root, registered, inPlace): the Comm remembers
  // the answer for each shape instead of asking on every call.
  virtual std::string whyNot(const CollectiveArgs& call) const {
    (void)call;
    return {};
  }
  // Queues the call on call.stream. @pre whyNot(call) is empty.
  virtual void launch(const CollectiveArgs& call) = 0;
  // A short description of what the algorithm can run, for Comm::algorithms().
  virtual std::string constraints() const { return {}; }
  // True only if a reduction it runs equals the one taken in rank order (rank 0's value first), bit
  // for bit: tests and ferry-bench then compare floats exactly, and otherwise with the tolerance of
  // a sum in another order.
  virtual bool reducesInRankOrder() const { return false; }
};

// A collective program (docs/executor.md): loaded, checked against the executor's rules and
// compiled for every rank once, then added to any number of Comms of its world size. Copies share
// one compiled program.
class FERRY_API Plan {
 public:
  // Error(InvalidUsage) naming the file (or `source`) and what is wrong.
  static Plan fromFile(const std::string& path);
  static Plan fromJson(std::string_view json, std::string_view source = "a JSON string");

  // The plan's own name; it runs as the algorithm "plan:" + name().
  const std::string& name() const;
  std::string algorithmName() const;
  Collective collective() const;
  int worldSize() const;
  bool inPlace() const;
  // Input bytes per rank it accepts.
  std::size_t minBytes() const;
  std::size_t maxBytes() const;

  struct Impl;
  explicit Plan(std::shared_ptr<const Impl> impl);
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

enum class AlgorithmKind : int { Builtin, Plan, Native };
FERRY_API std::string_view toString(AlgorithmKind kind) noexcept;

// What Comm::algorithms() lists.
struct AlgorithmInfo {
  std::string name;
  Collective collective = Collective::AllReduce;
  AlgorithmKind kind = AlgorithmKind::Builtin;
  std::string constraints;  // what it can run, in words ("registered buffers only", ...)
  bool forced = false;      // forced for its collective (Comm::setAlgorithm, FERRY_ALGO)
  // A reduction it runs equals the one in rank order bit for bit (NativeAlgorithm::reducesInRankOrder);
  // false for rings and plans, whose sums start elsewhere: compare their floats with a tolerance.
  bool reducesInRankOrder = true;
  // It runs calls that ask for float32 accumulation (ferry/datatype.hpp, Accumulation::Float32);
  // the selector keeps the others off them.
  bool sumsInFloat32 = false;
};

}  // namespace ferry
