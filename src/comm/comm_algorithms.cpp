// Comm's algorithm registry (ferry/algorithm.hpp): listing, forcing, adding and removing algorithms
// and plans at run time, every change agreed by all ranks; the selector's answer for a call shape.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "comm/across_hosts_algorithms.hpp"
#include "comm/comm_impl.hpp"

namespace ferry {

void Comm::setAlgorithm(Collective c, std::string_view name) {
  // An algorithm across hosts names a way of composing the phases of a Comm across hosts; on one
  // host there is none to force.
  if (!impl_->partners && parseAcrossHostsAlgorithm(name))
    throw Error(ErrorCode::InvalidUsage, impl_->who("setAlgorithm") + ": '" + std::string(name) +
                                             "' is an algorithm of a Comm across hosts; this one's ranks share a host");
  impl_->selector.force(c, name);
}

std::vector<AlgorithmInfo> Comm::algorithms() const {
  CommLimits limits;
  limits.worldSize = worldSize();
  if (impl_->resources) limits = impl_->resources->limits();
  std::vector<AlgorithmInfo> out;
  for (const auto& e : impl_->selector.registry().entries()) {
    const Algorithm& a = *e.algorithm;
    out.push_back({a.name(), a.collective(), e.kind, a.constraints(limits),
                   impl_->selector.forced(a.collective()) == a.name(), a.reducesInRankOrder(),
                   a.sumsInFloat32()});
  }
  return out;
}

void Comm::addPlan(const Plan& plan) {
  Impl& I = *impl_;
  I.checkNotAborted("addPlan");
  const std::string name = plan.algorithmName();
  if (plan.worldSize() != worldSize())
    throw Error(ErrorCode::InvalidUsage, I.who("addPlan") + ": " + name + " is a plan for " +
                                             std::to_string(plan.worldSize()) + " ranks; this Comm has " +
                                             std::to_string(worldSize()));
  I.agree("addPlan", name);
  const auto& algorithm = executor::algorithmOf(plan);
  I.withContext("addPlan", [&] {
    if (I.selector.registry().find(name) != nullptr)
      throw Error(ErrorCode::InvalidUsage, "an algorithm named '" + name + "' is already registered");
    if (I.plans) {
      DeviceGuard scope(I.device);
      I.plans->add(&algorithm.forWorldSize(worldSize())->programs[static_cast<std::size_t>(rank())]);
      I.states.reserve(algorithm);
    }
    I.selector.add(&algorithm, AlgorithmKind::Plan, plan.impl());
  });
}

void Comm::addAlgorithm(std::shared_ptr<NativeAlgorithm> algorithm) {
  Impl& I = *impl_;
  I.checkNotAborted("addAlgorithm");
  std::shared_ptr<NativeAlgorithmAdapter> adapter;
  I.withContext("addAlgorithm", [&] { adapter = std::make_shared<NativeAlgorithmAdapter>(std::move(algorithm)); });
  const std::string name = adapter->name();
  I.agree("addAlgorithm", name);
  I.withContext("addAlgorithm", [&] {
    if (I.selector.registry().find(name) != nullptr)
      throw Error(ErrorCode::InvalidUsage, "an algorithm named '" + name + "' is already registered");
  });
  // Registered only where setup succeeded on every rank, so the registries stay alike.
  std::string failure;
  try {
    DeviceGuard scope(I.device);
    adapter->user().setup(*this);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::vector<char> ok(static_cast<std::size_t>(worldSize()));
  ok[static_cast<std::size_t>(rank())] = failure.empty() ? 1 : 0;
  I.bootstrap->allGather(ok.data(), 1);
  std::string failed;
  for (int r = 0; r < worldSize(); ++r)
    if (!ok[static_cast<std::size_t>(r)]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    throw Error(ErrorCode::InvalidUsage, I.who("addAlgorithm") + " '" + name + "': setup failed on rank(s) " +
                                             failed + (failure.empty() ? "" : ", here: " + failure) +
                                             "; the algorithm was not added on any rank");
  I.selector.add(adapter.get(), AlgorithmKind::Native, adapter);
}

void Comm::removeAlgorithm(std::string_view name) {
  Impl& I = *impl_;
  I.agree("removeAlgorithm", std::string(name));
  I.withContext("removeAlgorithm", [&] { I.retired.push_back(I.selector.remove(name).owner); });
}

std::string Comm::algorithmFor(Collective c, std::size_t bytes, DataType type, bool registered) const {
  if (worldSize() == 1) return "local_copy";
  CollectiveCall call;
  call.collective = c;
  call.type = type;
  call.rank = rank();
  call.worldSize = worldSize();
  const std::size_t esize = sizeOf(type);
  // bytes is the larger buffer: per-rank counts are a worldSize-th of it.
  const bool perRank = c == Collective::AllGather || c == Collective::ReduceScatter || c == Collective::AllToAll;
  call.count = esize ? bytes / esize / (perRank ? static_cast<std::size_t>(worldSize()) : 1) : 0;
  if (registered) call.sendId = call.recvId = 1;
  // Across hosts, one of the algorithms of across_hosts_algorithms.hpp, named with what carries the
  // cross-host phase where that is NCCL's network (_nccl) or both by size (_sized).
  if (impl_->partners) {
    const std::string name = toString(selectAcrossHosts(impl_->selector.rows(), impl_->selector.forcedAcrossHosts(c),
                                                        call, impl_->hostLayout, rank(), "algorithmFor"));
    const std::string net = impl_->partners->network();
    return net == "ferry" ? name : name + "_" + net;
  }
  // Distinct addresses, so that the call is not taken for an in-place one.
  call.send = reinterpret_cast<const void*>(std::uintptr_t{1} << 40);
  call.recv = reinterpret_cast<void*>(std::uintptr_t{2} << 40);
  return impl_->selector.select(call, impl_->resources->limits()).name();
}

std::vector<std::string> Comm::algorithmNames(Collective c) {
  std::vector<std::string> names;
  for (const Algorithm* a : allAlgorithms())
    if (a->collective() == c) names.emplace_back(a->name());
  return names;
}

}  // namespace ferry
