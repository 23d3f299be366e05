#include "comm/native_algorithm.hpp"

#include "ferry/errors.hpp"

namespace ferry {

CollectiveArgs argsOf(const CollectiveCall& call) {
  CollectiveArgs a;
  a.collective = call.collective;
  a.send = call.usesSend() ? call.send : nullptr;
  a.recv = call.usesRecv() ? call.recv : nullptr;
  a.count = call.count;
  a.type = call.type;
  a.op = call.op;
  a.root = call.root;
  a.stream = call.stream;
  a.rank = call.rank;
  a.worldSize = call.worldSize;
  a.registered = call.registered();
  a.inPlace = call.inPlace();
  a.bytes = call.bytes();
  return a;
}

namespace {

std::shared_ptr<NativeAlgorithm> checked(std::shared_ptr<NativeAlgorithm> a) {
  if (!a) throw Error(ErrorCode::InvalidUsage, "addAlgorithm: the algorithm is null");
  const std::string name = a->name();
  if (name.empty() || name.rfind("plan:", 0) == 0)
    throw Error(ErrorCode::InvalidUsage, "addAlgorithm: '" + name +
                                             "' is not a name for a native algorithm (empty, or starts with "
                                             "\"plan:\", which is the plans'); give it a name of its own");
  return a;
}

}  // namespace

NativeAlgorithmAdapter::NativeAlgorithmAdapter(std::shared_ptr<NativeAlgorithm> algorithm)
    : algorithm_(checked(std::move(algorithm))), name_(algorithm_->name()), collective_(algorithm_->collective()) {}

std::string NativeAlgorithmAdapter::whyNot(const CollectiveCall& call, const CommLimits&) const {
  return algorithm_->whyNot(argsOf(call));
}

void NativeAlgorithmAdapter::launch(const CollectiveCall& call, const CollectiveContext&, void*) const {
  algorithm_->launch(argsOf(call));
}

std::string NativeAlgorithmAdapter::constraints(const CommLimits&) const { return algorithm_->constraints(); }

}  // namespace ferry
