// Uses the installed ferry through its public headers and libferry.so only.
// Usage: ferry_consumer EXPECTED_BOOTSTRAP_TIMEOUT_SECONDS
#include <cstdio>
#include <cstdlib>
#include <ferry/env.hpp>
#include <ferry/errors.hpp>
#include <ferry/version.hpp>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EXPECTED_BOOTSTRAP_TIMEOUT_SECONDS\n", argv[0]);
    return 2;
  }
  if (ferry::toString(ferry::ErrorCode::Timeout) != "Timeout") {
    std::fprintf(stderr, "toString(Timeout) is wrong\n");
    return 1;
  }
  const ferry::Env& env = ferry::env();
  if (env.bootstrapTimeout.count() != std::strtod(argv[1], nullptr)) {
    std::fprintf(stderr, "env().bootstrapTimeout is %g, expected %s\n", env.bootstrapTimeout.count(),
                 argv[1]);
    return 1;
  }
  // The error types are exported: one thrown here is caught through its base classes.
  try {
    throw ferry::TimeoutError("consumer check");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("ferry Timeout: consumer check") == std::string::npos) {
      std::fprintf(stderr, "unexpected what(): %s\n", e.what());
      return 1;
    }
  }
  std::printf("ferry %s found: toString(Timeout)=%s, FERRY_BOOTSTRAP_TIMEOUT=%g s\n", FERRY_VERSION_STRING,
              std::string(ferry::toString(ferry::ErrorCode::Timeout)).c_str(), env.bootstrapTimeout.count());
  return 0;
}
