#pragma once
// A user's NativeAlgorithm (ferry/algorithm.hpp) as one of the Comm's algorithms: the selector and
// the Comm's call path see it like any built-in one; it gets the checked call as CollectiveArgs.
#include <memory>
#include <string>

#include "ferry/algorithm.hpp"
#include "kernels/algorithm.hpp"

namespace ferry {

// The public view of a checked call.
CollectiveArgs argsOf(const CollectiveCall& call);

class NativeAlgorithmAdapter final : public Algorithm {
 public:
  // Error(InvalidUsage) for a null algorithm, an empty name or one starting with "plan:".
  explicit NativeAlgorithmAdapter(std::shared_ptr<NativeAlgorithm> algorithm);

  const char* name() const override { return name_.c_str(); }
  Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall& call, const CommLimits& limits) const override;
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override;
  std::string constraints(const CommLimits& limits) const override;
  bool reducesInRankOrder() const override { return algorithm_->reducesInRankOrder(); }
  NativeAlgorithm& user() const { return *algorithm_; }

 private:
  std::shared_ptr<NativeAlgorithm> algorithm_;
  std::string name_;  // read once: the registry and error messages hold on to it
  Collective collective_;
};

}  // namespace ferry
