#pragma once
// TcpBootstrap::fromEnvironment with the environment passed in, so tests need not change the
// process's (parsed once) environment.
#include <memory>

#include "ferry/bootstrap.hpp"
#include "ferry/env.hpp"

namespace ferry {
std::shared_ptr<TcpBootstrap> createFromEnv(const Env& e, const TcpBootstrap::Options& options);
}  // namespace ferry
