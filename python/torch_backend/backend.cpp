// ferry as a torch.distributed backend: c10d::Backend on ferry::Comm (docs/pytorch.md). Built only
// where torch is installed, against that torch (its headers, its pybind11, its ABI flags), as the
// module ferry._torch; python/ferry/torch registers it as the backend "ferry".
//
// The stream contract is ProcessGroupNCCL's: an op runs on the backend's own stream after that
// stream waits (an event, no host sync) for the caller's current stream; its tensors are marked
// in use on the backend's stream (the caching allocator does not hand their memory out again until
// the op is done), and Work::wait() makes the caller's current stream wait for the op's end event.
// Nothing here blocks the host, so an op can be captured in a CUDA graph.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/python.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "ferry/errors.hpp"

namespace ferry::torch_backend {
namespace {

DataType dataTypeOf(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::Uint8;
    case at::kBool: return DataType::Uint8;
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    case at::kHalf: return DataType::Float16;
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kFloat8_e4m3fn: return DataType::Fp8E4M3;
    case at::kFloat8_e5m2: return DataType::Fp8E5M2;
    default:
      TORCH_CHECK(false, "ferry backend: ", op, ": no ferry data type for ", t.scalar_type());
  }
}

void checkTensor(const at::Tensor& t, int device, const char* op) {
  TORCH_CHECK(t.is_cuda(), "ferry backend: ", op, ": tensors must be on a CUDA device, not ", t.device());
  TORCH_CHECK(t.get_device() == device, "ferry backend: ", op, ": a tensor on cuda:", t.get_device(),
              " for a process group on cuda:", device);
  TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()) && t.is_non_overlapping_and_dense(),
              "ferry backend: ", op, ": tensors must be dense (pass tensor.contiguous())");
}

// The reduce op, or (for PREMUL_SUM) nullopt with the factor in `premul`.
std::optional<ReduceOp> reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& like, const char* name,
                                   at::Tensor& factorHolder, PreMulSum& premul) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Prod;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PREMUL_SUM: {
      // NCCLPreMulSumSupplement: the name in every torch (2.15 renames it PreMulSumSupplement and keeps this one).
      const auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "ferry backend: ", name, ": PREMUL_SUM without its factor");
      if (s->tensor_factor.defined()) {
        // One element of the call's type on the call's device, read when the op runs.
        factorHolder = s->tensor_factor.to(like.device(), like.scalar_type()).contiguous();
        premul = PreMulSum{factorHolder.data_ptr(), /*onDevice=*/true};
      } else {
        // A host scalar of the call's type: the Comm reads it before the call returns.
        factorHolder = at::scalar_tensor(s->double_factor, at::TensorOptions().dtype(like.scalar_type()));
        premul = PreMulSum{factorHolder.data_ptr(), /*onDevice=*/false};
      }
      return std::nullopt;
    }
    default:
      TORCH_CHECK(false, "ferry backend: ", name, ": reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM are)");
  }
}

// One op's completion: an event recorded on the backend's stream after the op.
class FerryWork : public c10d::Work {
 public:
  FerryWork(int rank, c10d::OpType type, c10::Device device, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), device_(device), outputs_(std::move(outputs)) {}

  void recordEnd(const c10::cuda::CUDAStream& stream) {
    end_.record(stream);
    future_ = c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                      std::vector<c10::Device>{device_});
    c10::cuda::CUDAStreamGuard guard(stream);
    future_->markCompleted(c10::IValue(outputs_));
  }

  bool isCompleted() override { return end_.query(); }
  bool isSuccess() const override { return true; }
  // The caller's current stream waits for the op; the host does not.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    end_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
    return true;
  }
  void synchronize() override { wait(::kNoTimeout); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::Device device_;
  std::vector<at::Tensor> outputs_;
  at::cuda::CUDAEvent end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class FerryBackend : public c10d::Backend {
 public:
  // Joins the ranks of a UniqueId (in hex: ferry.UniqueId.hex()) and makes the Comm on `device`.
  FerryBackend(const std::string& idHex, int rank, int size, int device, double timeoutSeconds)
      : c10d::Backend(rank, size), device_(device) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    TcpBootstrap::Options o;
    o.timeout = std::chrono::duration<double>(timeoutSeconds);
    comm_ = std::make_unique<Comm>(TcpBootstrap::create(UniqueId::fromHex(idHex), rank, size, o));
    stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device));
  }

  const std::string getBackendName() const override { return "ferry"; }
  bool supportsCoalescing() const override { return true; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return run(c10d::OpType::ALLREDUCE, tensors, tensors, [&] {
      for (auto& t : tensors) reduce(t, t, opts.reduceOp, "allreduce", -1);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return run(c10d::OpType::ALLREDUCE_COALESCED, tensors, tensors, [&] {
      for (auto& t : tensors) reduce(t, t, opts.reduceOp, "allreduce_coalesced", -1);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return run(c10d::OpType::BROADCAST, tensors, tensors, [&] {
      for (auto& t : tensors) {
        check(t, "broadcast");
        comm_->broadcast(t.data_ptr(), t.data_ptr(), t.numel(), dataTypeOf(t, "broadcast"),
                         static_cast<int>(opts.rootRank), stream_.stream());
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return run(c10d::OpType::REDUCE, tensors, tensors, [&] {
      for (auto& t : tensors) reduce(t, t, opts.reduceOp, "reduce", static_cast<int>(opts.rootRank));
    });
  }

  // Into one tensor of size * input.numel() elements.
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    std::vector<at::Tensor> in{input}, out{output};
    return run(c10d::OpType::_ALLGATHER_BASE, in, out, [&] {
      check(input, "all_gather_into_tensor");
      check(output, "all_gather_into_tensor");
      TORCH_CHECK(output.numel() == input.numel() * size_,
                  "ferry backend: all_gather_into_tensor: the output has ", output.numel(), " elements, expected ",
                  input.numel() * size_);
      sameType(input, output, "all_gather_into_tensor");
      comm_->allGather(input.data_ptr(), output.data_ptr(), input.numel(), dataTypeOf(input, "all_gather"),
                       stream_.stream());
    });
  }

  // Into a list of size tensors: through one flat buffer, copied out on the backend's stream.
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "ferry backend: allgather takes one input and a list of world_size outputs");
    std::vector<at::Tensor> outs = outputs[0];
    return run(c10d::OpType::ALLGATHER, inputs, outs, [&] {
      at::Tensor& input = inputs[0];
      check(input, "all_gather");
      at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
      comm_->allGather(input.data_ptr(), flat.data_ptr(), input.numel(), dataTypeOf(input, "all_gather"),
                       stream_.stream());
      for (int r = 0; r < size_; ++r) {
        TORCH_CHECK(outs[r].numel() == input.numel(), "ferry backend: all_gather: output ", r, " has ",
                    outs[r].numel(), " elements, the input ", input.numel());
        outs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()), /*non_blocking=*/true);
      }
      keep(flat);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> in{input}, out{output};
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, in, out, [&] {
      TORCH_CHECK(input.numel() == output.numel() * size_,
                  "ferry backend: reduce_scatter_tensor: the input has ", input.numel(), " elements, expected ",
                  output.numel() * size_);
      reduceScatter(input, output, opts.reduceOp, "reduce_scatter_tensor");
    });
  }

  // From a list of size tensors: flattened on the backend's stream, then one reduce-scatter.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "ferry backend: reduce_scatter takes one output and a list of world_size inputs");
    std::vector<at::Tensor> ins = inputs[0];
    return run(c10d::OpType::REDUCE_SCATTER, ins, outputs, [&] {
      at::Tensor& output = outputs[0];
      at::Tensor flat = at::empty({size_ * output.numel()}, output.options());
      for (int r = 0; r < size_; ++r) {
        TORCH_CHECK(ins[r].numel() == output.numel(), "ferry backend: reduce_scatter: input ", r, " has ",
                    ins[r].numel(), " elements, the output ", output.numel());
        flat.narrow(0, r * output.numel(), output.numel()).copy_(ins[r].reshape({-1}), /*non_blocking=*/true);
      }
      reduceScatter(flat, output, opts.reduceOp, "reduce_scatter");
      keep(flat);
    });
  }

  // all_to_all_single: equal splits through allToAll, uneven ones as one group of sends and recvs.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& /*opts*/) override {
    std::vector<at::Tensor> in{input}, out{output};
    return run(c10d::OpType::ALLTOALL_BASE, in, out, [&] {
      check(input, "all_to_all_single");
      check(output, "all_to_all_single");
      sameType(input, output, "all_to_all_single");
      const DataType type = dataTypeOf(input, "all_to_all_single");
      if (outputSplits.empty() && inputSplits.empty()) {
        TORCH_CHECK(input.numel() == output.numel() && input.numel() % size_ == 0,
                    "ferry backend: all_to_all_single: input and output must hold the same number of elements, "
                    "a multiple of the world size");
        comm_->allToAll(input.data_ptr(), output.data_ptr(), input.numel() / size_, type, stream_.stream());
        return;
      }
      // Splits count rows of dimension 0.
      const int64_t row = input.dim() > 0 && input.size(0) > 0 ? input.numel() / input.size(0) : 1;
      auto offsets = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
        std::vector<int64_t> counts(size_), starts(size_);
        const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
        TORCH_CHECK(splits.empty() || static_cast<int>(splits.size()) == size_,
                    "ferry backend: all_to_all_single: one split per rank");
        int64_t at = 0;
        for (int r = 0; r < size_; ++r) {
          counts[r] = (splits.empty() ? rows / size_ : splits[r]) * row;
          starts[r] = at;
          at += counts[r];
        }
        TORCH_CHECK(at <= t.numel(), "ferry backend: all_to_all_single: the splits exceed the tensor");
        return std::pair{counts, starts};
      };
      auto [sendCounts, sendStarts] = offsets(inputSplits, input);
      auto [recvCounts, recvStarts] = offsets(outputSplits, output);
      const std::size_t elem = input.element_size();
      auto* src = static_cast<const char*>(input.data_ptr());
      auto* dst = static_cast<char*>(output.data_ptr());
      comm_->groupStart();
      try {
        for (int r = 0; r < size_; ++r) {
          if (sendCounts[r] > 0)
            comm_->send(src + sendStarts[r] * elem, sendCounts[r], type, r, stream_.stream());
          if (recvCounts[r] > 0)
            comm_->recv(dst + recvStarts[r] * elem, recvCounts[r], type, r, stream_.stream());
        }
      } catch (...) {
        comm_->groupEnd();
        throw;
      }
      comm_->groupEnd();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& /*opts*/) override {
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                "ferry backend: all_to_all takes world_size inputs and outputs");
    return run(c10d::OpType::ALLTOALL, inputs, outputs, [&] {
      comm_->groupStart();
      try {
        for (int r = 0; r < size_; ++r) {
          check(inputs[r], "all_to_all");
          check(outputs[r], "all_to_all");
          if (inputs[r].numel() > 0)
            comm_->send(inputs[r].data_ptr(), inputs[r].numel(), dataTypeOf(inputs[r], "all_to_all"), r,
                        stream_.stream());
          if (outputs[r].numel() > 0)
            comm_->recv(outputs[r].data_ptr(), outputs[r].numel(), dataTypeOf(outputs[r], "all_to_all"), r,
                        stream_.stream());
        }
      } catch (...) {
        comm_->groupEnd();
        throw;
      }
      comm_->groupEnd();
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int /*tag*/) override {
    return run(c10d::OpType::SEND, tensors, tensors, [&] {
      for (auto& t : tensors) {
        check(t, "send");
        comm_->send(t.data_ptr(), t.numel(), dataTypeOf(t, "send"), dstRank, stream_.stream());
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int /*tag*/) override {
    return run(c10d::OpType::RECV, tensors, tensors, [&] {
      for (auto& t : tensors) {
        check(t, "recv");
        comm_->recv(t.data_ptr(), t.numel(), dataTypeOf(t, "recv"), srcRank, stream_.stream());
      }
    });
  }

  // A one-element all-reduce on the device, as ProcessGroupNCCL's barrier; wait() then orders the
  // caller's stream after it, and `barrier()` in Python synchronizes the device.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    std::vector<at::Tensor> one{at::zeros({1}, at::TensorOptions().device(at::kCUDA, device_).dtype(at::kFloat))};
    return allreduce(one, c10d::AllreduceOptions());
  }

  // Between start and end, sends and recvs (batch_isend_irecv) form one ferry group.
  void startCoalescing() override {
    comm_->groupStart();
    ++coalescing_;
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_ > 0, "ferry backend: endCoalescing without startCoalescing");
    --coalescing_;
    std::vector<at::Tensor> none;
    return run(c10d::OpType::COALESCED, none, none, [&] { comm_->groupEnd(); });
  }

 private:
  template <class F>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor>& inputs,
                                     std::vector<at::Tensor>& outputs, F&& body) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    // Inside a coalescing block the ops join the group on the backend's stream; the order with the
    // caller's stream is taken once, at the first op of the block.
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(stream_);
    kept_.clear();
    try {
      c10::cuda::CUDAStreamGuard onStream(stream_);
      body();
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());
    }
    // The caching allocator must not reuse these tensors' memory before the op is done on stream_.
    for (auto* list : {&inputs, &outputs})
      for (auto& t : *list)
        if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    for (auto& t : kept_) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    kept_.clear();
    auto work = c10::make_intrusive<FerryWork>(rank_, type, c10::Device(at::kCUDA, device_), outputs);
    work->recordEnd(stream_);
    return work;
  }

  void check(const at::Tensor& t, const char* op) const { checkTensor(t, device_, op); }
  static void sameType(const at::Tensor& a, const at::Tensor& b, const char* op) {
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "ferry backend: ", op, ": input is ", a.scalar_type(),
                ", output ", b.scalar_type());
  }
  void keep(const at::Tensor& t) { kept_.push_back(t); }

  void reduce(at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op, const char* name, int root) {
    check(in, name);
    at::Tensor factor;
    PreMulSum premul;
    const DataType type = dataTypeOf(in, name);
    const auto plain = reduceOpOf(op, in, name, factor, premul);
    if (factor.defined() && factor.is_cuda()) keep(factor);
    if (root < 0) {
      if (plain) comm_->allReduce(in.data_ptr(), out.data_ptr(), in.numel(), type, *plain, stream_.stream());
      else comm_->allReduce(in.data_ptr(), out.data_ptr(), in.numel(), type, premul, stream_.stream());
    } else {
      if (plain) comm_->reduce(in.data_ptr(), out.data_ptr(), in.numel(), type, *plain, root, stream_.stream());
      else comm_->reduce(in.data_ptr(), out.data_ptr(), in.numel(), type, premul, root, stream_.stream());
    }
  }

  void reduceScatter(at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op, const char* name) {
    check(input, name);
    check(output, name);
    sameType(input, output, name);
    at::Tensor factor;
    PreMulSum premul;
    const DataType type = dataTypeOf(input, name);
    const auto plain = reduceOpOf(op, input, name, factor, premul);
    if (factor.defined() && factor.is_cuda()) keep(factor);
    if (plain)
      comm_->reduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type, *plain, stream_.stream());
    else
      comm_->reduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), type, premul, stream_.stream());
  }

  int device_;
  std::unique_ptr<Comm> comm_;
  c10::cuda::CUDAStream stream_ = c10::cuda::getDefaultCUDAStream();
  std::vector<at::Tensor> kept_;
  int coalescing_ = 0;
};

}  // namespace
}  // namespace ferry::torch_backend

PYBIND11_MODULE(_torch, m) {
  m.doc() = "ferry's torch.distributed backend (import ferry.torch, not this)";
  namespace py = pybind11;
  py::module_::import("torch.distributed");  // registers c10d::Backend with pybind11 first
  py::class_<ferry::torch_backend::FerryBackend, c10d::Backend,
             c10::intrusive_ptr<ferry::torch_backend::FerryBackend>>(m, "FerryBackend")
      .def(py::init<const std::string&, int, int, int, double>(), py::arg("unique_id_hex"), py::arg("rank"),
           py::arg("size"), py::arg("device"), py::arg("timeout_seconds"),
           py::call_guard<py::gil_scoped_release>());
}
