// The ops of the ferry backend: each checks its tensors, then queues ferry::Comm calls on the
// stream run() picked (backend.hpp says which). Collectives map one to one onto the Comm's; the
// list forms go through one flat tensor; gather, scatter and all-to-all with lists or uneven
// splits are one ferry group of sends and receives.
#include <c10/util/Exception.h>

#include "backend.hpp"

namespace ferry::torch_backend {

namespace {

using Tensors = std::vector<at::Tensor>;

std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

}  // namespace

void FerryBackend::reduceInto(at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op, const char* name,
                              int root) {
  check(in, name);
  check(out, name);
  checkSameType(in, out, name);
  ReduceSpec spec = reduceSpecOf(op, in, name);
  if (spec.factor.defined() && spec.factor.is_cuda()) keep(spec.factor);
  const DataType type = dataTypeOf(in, name);
  Comm& c = comm(name);
  if (root < 0) {
    if (spec.plain) c.allReduce(in.data_ptr(), out.data_ptr(), count(in), type, *spec.plain, stream());
    else c.allReduce(in.data_ptr(), out.data_ptr(), count(in), type, spec.premul, stream());
  } else {
    if (spec.plain) c.reduce(in.data_ptr(), out.data_ptr(), count(in), type, *spec.plain, root, stream());
    else c.reduce(in.data_ptr(), out.data_ptr(), count(in), type, spec.premul, root, stream());
  }
}

void FerryBackend::reduceScatterInto(at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op,
                                     const char* name) {
  check(input, name);
  check(output, name);
  checkSameType(input, output, name);
  TORCH_CHECK(input.numel() == output.numel() * size_, "ferry backend: ", name, ": the input has ", input.numel(),
              " elements, expected world_size x output = ", output.numel() * size_);
  ReduceSpec spec = reduceSpecOf(op, input, name);
  if (spec.factor.defined() && spec.factor.is_cuda()) keep(spec.factor);
  const DataType type = dataTypeOf(input, name);
  if (spec.plain)
    comm(name).reduceScatter(input.data_ptr(), output.data_ptr(), count(output), type, *spec.plain, stream());
  else
    comm(name).reduceScatter(input.data_ptr(), output.data_ptr(), count(output), type, spec.premul, stream());
}

void FerryBackend::reduceScatterInFloat32(at::Tensor& input, at::Tensor& output, bool average, const char* name) {
  Tensors in{input}, out{output};
  run(c10d::OpType::_REDUCE_SCATTER_BASE, name, in, out, Mode::Sync, [&] {
    check(input, name);
    check(output, name);
    checkSameType(input, output, name);
    TORCH_CHECK(input.numel() == output.numel() * size_, "ferry backend: ", name, ": the input has ", input.numel(),
                " elements, expected world_size x output = ", output.numel() * size_);
    comm(name).reduceScatter(input.data_ptr(), output.data_ptr(), count(output), dataTypeOf(input, name),
                             average ? ReduceOp::Avg : ReduceOp::Sum, Accumulation::Float32, stream());
  });
}

void FerryBackend::allGatherInto(at::Tensor& input, at::Tensor& output, const char* name) {
  check(input, name);
  check(output, name);
  checkSameType(input, output, name);
  TORCH_CHECK(output.numel() == input.numel() * size_, "ferry backend: ", name, ": the output has ", output.numel(),
              " elements, expected world_size x input = ", input.numel() * size_);
  comm(name).allGather(input.data_ptr(), output.data_ptr(), count(input), dataTypeOf(input, name), stream());
}

void FerryBackend::exchange(const std::vector<std::pair<at::Tensor, int>>& sends,
                            const std::vector<std::pair<at::Tensor, int>>& recvs, const char* name) {
  Comm& c = comm(name);
  c.groupStart();
  try {
    for (const auto& [t, peer] : sends)
      if (peer >= 0 && t.numel() > 0) c.send(t.data_ptr(), count(t), dataTypeOf(t, name), peer, stream());
    for (const auto& [t, peer] : recvs)
      if (peer >= 0 && t.numel() > 0) c.recv(t.data_ptr(), count(t), dataTypeOf(t, name), peer, stream());
  } catch (...) {
    c.groupEnd();  // balance this group; the error names the call
    throw;
  }
  c.groupEnd();
}

c10::intrusive_ptr<c10d::Work> FerryBackend::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  return run(c10d::OpType::ALLREDUCE, "all_reduce", tensors, tensors, modeOf(opts.asyncOp), [&] {
    for (auto& t : tensors) reduceInto(t, t, opts.reduceOp, "all_reduce", -1);
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::allreduce_coalesced(Tensors& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return run(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, tensors, modeOf(opts.asyncOp), [&] {
    for (auto& t : tensors) reduceInto(t, t, opts.reduceOp, "all_reduce_coalesced", -1);
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  return run(c10d::OpType::BROADCAST, "broadcast", tensors, tensors, modeOf(opts.asyncOp), [&] {
    for (auto& t : tensors) {
      check(t, "broadcast");
      comm("broadcast").broadcast(t.data_ptr(), t.data_ptr(), count(t), dataTypeOf(t, "broadcast"),
                                  static_cast<int>(opts.rootRank), stream());
    }
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  return run(c10d::OpType::REDUCE, "reduce", tensors, tensors, modeOf(opts.asyncOp), [&] {
    for (auto& t : tensors) reduceInto(t, t, opts.reduceOp, "reduce", static_cast<int>(opts.rootRank));
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  Tensors in{input}, out{output};
  return run(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", in, out, modeOf(opts.asyncOp),
             [&] { allGatherInto(input, output, "all_gather_into_tensor"); });
}

// Into a list of world_size tensors: through one flat tensor, copied out on the op's stream.
c10::intrusive_ptr<c10d::Work> FerryBackend::allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "ferry backend: all_gather takes one input and a list of world_size outputs");
  Tensors outs = outputs[0];
  return run(c10d::OpType::ALLGATHER, "all_gather", inputs, outs, modeOf(opts.asyncOp), [&] {
    at::Tensor& input = inputs[0];
    at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
    allGatherInto(input, flat, "all_gather");
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(outs[r].numel() == input.numel() && outs[r].scalar_type() == input.scalar_type(),
                  "ferry backend: all_gather: output ", r, " is ", outs[r].numel(), " x ", outs[r].scalar_type(),
                  ", the input ", input.numel(), " x ", input.scalar_type());
      outs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()), /*non_blocking=*/true);
    }
    keep(flat);
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "ferry backend: all_gather_into_tensor_coalesced: ", inputs.size(),
              " inputs, ", outputs.size(), " outputs");
  return run(c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", inputs, outputs, modeOf(opts.asyncOp), [&] {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      allGatherInto(inputs[i], outputs[i], "all_gather_into_tensor_coalesced");
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  Tensors in{input}, out{output};
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", in, out, modeOf(opts.asyncOp),
             [&] { reduceScatterInto(input, output, opts.reduceOp, "reduce_scatter_tensor"); });
}

// From a list of world_size tensors: gathered into one flat tensor on the op's stream first.
c10::intrusive_ptr<c10d::Work> FerryBackend::reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "ferry backend: reduce_scatter takes one output and a list of world_size inputs");
  Tensors ins = inputs[0];
  return run(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", ins, outputs, modeOf(opts.asyncOp), [&] {
    at::Tensor& output = outputs[0];
    at::Tensor flat = at::empty({size_ * output.numel()}, output.options());
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(ins[r].numel() == output.numel() && ins[r].scalar_type() == output.scalar_type(),
                  "ferry backend: reduce_scatter: input ", r, " is ", ins[r].numel(), " x ", ins[r].scalar_type(),
                  ", the output ", output.numel(), " x ", output.scalar_type());
      flat.narrow(0, r * output.numel(), output.numel()).copy_(ins[r].reshape({-1}), /*non_blocking=*/true);
    }
    reduceScatterInto(flat, output, opts.reduceOp, "reduce_scatter");
    keep(flat);
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "ferry backend: reduce_scatter_tensor_coalesced: ", inputs.size(),
              " inputs, ", outputs.size(), " outputs");
  return run(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", inputs, outputs, modeOf(opts.asyncOp), [&] {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      reduceScatterInto(inputs[i], outputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced");
  });
}

// all_to_all_single: equal splits through allToAll, uneven ones as one group of sends and recvs.
c10::intrusive_ptr<c10d::Work> FerryBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const c10d::AllToAllOptions& opts) {
  static constexpr const char* kName = "all_to_all_single";
  Tensors in{input}, out{output};
  return run(c10d::OpType::ALLTOALL_BASE, kName, in, out, modeOf(opts.asyncOp), [&] {
    check(input, kName);
    check(output, kName);
    checkSameType(input, output, kName);
    if (outputSplits.empty() && inputSplits.empty()) {
      TORCH_CHECK(input.numel() == output.numel() && input.numel() % size_ == 0, "ferry backend: ", kName,
                  ": input and output must hold the same number of elements, a multiple of the world size (",
                  input.numel(), " and ", output.numel(), " on ", size_, " ranks)");
      comm(kName).allToAll(input.data_ptr(), output.data_ptr(), count(input) / size_, dataTypeOf(input, kName),
                           stream());
      return;
    }
    // Splits count rows of dimension 0; no splits: equal rows.
    auto blocks = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
      const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
      const int64_t row = rows > 0 ? t.numel() / rows : 1;
      TORCH_CHECK(splits.empty() || static_cast<int>(splits.size()) == size_, "ferry backend: ", kName, ": ", which,
                  "_split_sizes has ", splits.size(), " entries, one per rank (", size_, ") expected");
      std::vector<std::pair<at::Tensor, int>> list;
      int64_t at = 0;
      for (int r = 0; r < size_; ++r) {
        const int64_t n = splits.empty() ? rows / size_ : splits[r];
        TORCH_CHECK(n >= 0 && at + n <= rows, "ferry backend: ", kName, ": ", which,
                    "_split_sizes exceed the tensor's ", rows, " rows");
        list.emplace_back(t.view({-1}).narrow(0, at * row, n * row), r);
        at += n;
      }
      return list;
    };
    exchange(blocks(inputSplits, input, "input"), blocks(outputSplits, output, "output"), kName);
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::alltoall(Tensors& outputs, Tensors& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "ferry backend: all_to_all takes world_size inputs and outputs");
  return run(c10d::OpType::ALLTOALL, "all_to_all", inputs, outputs, modeOf(opts.asyncOp), [&] {
    std::vector<std::pair<at::Tensor, int>> sends, recvs;
    for (int r = 0; r < size_; ++r) {
      check(inputs[r], "all_to_all");
      check(outputs[r], "all_to_all");
      sends.emplace_back(inputs[r], r);
      recvs.emplace_back(outputs[r], r);
    }
    exchange(sends, recvs, "all_to_all");
  });
}

// Every rank sends its input to the root; the root copies its own.
c10::intrusive_ptr<c10d::Work> FerryBackend::gather(std::vector<Tensors>& outputs, Tensors& inputs,
                                                    const c10d::GatherOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(inputs.size() == 1, "ferry backend: gather takes one input tensor");
  TORCH_CHECK(rank_ != root || (outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_),
              "ferry backend: gather: the root takes a list of world_size outputs");
  Tensors outs = rank_ == root ? outputs[0] : Tensors{};
  return run(c10d::OpType::GATHER, "gather", inputs, outs, modeOf(opts.asyncOp), [&] {
    check(inputs[0], "gather");
    std::vector<std::pair<at::Tensor, int>> sends, recvs;
    if (rank_ != root) sends.emplace_back(inputs[0], root);
    for (int r = 0; r < static_cast<int>(outs.size()); ++r) {
      check(outs[r], "gather");
      checkSameType(inputs[0], outs[r], "gather");
      TORCH_CHECK(outs[r].numel() == inputs[0].numel(), "ferry backend: gather: output ", r, " has ",
                  outs[r].numel(), " elements, the input ", inputs[0].numel());
      if (r == rank_) outs[r].copy_(inputs[0], /*non_blocking=*/true);
      else recvs.emplace_back(outs[r], r);
    }
    exchange(sends, recvs, "gather");
  });
}

// The root sends input r to rank r and copies its own; every rank receives into its output.
c10::intrusive_ptr<c10d::Work> FerryBackend::scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(outputs.size() == 1, "ferry backend: scatter takes one output tensor");
  TORCH_CHECK(rank_ != root || (inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_),
              "ferry backend: scatter: the root takes a list of world_size inputs");
  Tensors ins = rank_ == root ? inputs[0] : Tensors{};
  return run(c10d::OpType::SCATTER, "scatter", ins, outputs, modeOf(opts.asyncOp), [&] {
    check(outputs[0], "scatter");
    std::vector<std::pair<at::Tensor, int>> sends, recvs;
    if (rank_ != root) recvs.emplace_back(outputs[0], root);
    for (int r = 0; r < static_cast<int>(ins.size()); ++r) {
      check(ins[r], "scatter");
      checkSameType(ins[r], outputs[0], "scatter");
      TORCH_CHECK(ins[r].numel() == outputs[0].numel(), "ferry backend: scatter: input ", r, " has ", ins[r].numel(),
                  " elements, the output ", outputs[0].numel());
      if (r == rank_) outputs[0].copy_(ins[r], /*non_blocking=*/true);
      else sends.emplace_back(ins[r], r);
    }
    exchange(sends, recvs, "scatter");
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::send(Tensors& tensors, int dstRank, int /*tag*/) {
  return run(c10d::OpType::SEND, "send", tensors, tensors, Mode::Async, [&] {
    for (auto& t : tensors) {
      check(t, "send");
      comm("send").send(t.data_ptr(), count(t), dataTypeOf(t, "send"), dstRank, stream());
    }
  });
}

c10::intrusive_ptr<c10d::Work> FerryBackend::recv(Tensors& tensors, int srcRank, int /*tag*/) {
  return run(c10d::OpType::RECV, "recv", tensors, tensors, Mode::Async, [&] {
    for (auto& t : tensors) {
      check(t, "recv");
      comm("recv").recv(t.data_ptr(), count(t), dataTypeOf(t, "recv"), srcRank, stream());
    }
  });
}

}  // namespace ferry::torch_backend
