#pragma once
// Results and errors of the NCCL API: every exported function runs its body through guarded(),
// so that nothing crosses the C boundary as an exception. A failure's message is kept per thread
// (ncclGetLastError) and logged.
#include <string>
#include <utility>

#include "nccl.h"

namespace ferry::nccl {

// An argument or state error raised by the checks (checks.hpp), with the result it maps to.
struct ApiError {
  ncclResult_t result;
  std::string message;
};

// Records `message` as this thread's last error and returns `result`.
ncclResult_t fail(ncclResult_t result, const std::string& message);
const char* lastError();
const char* resultString(ncclResult_t result);

// Runs body() (returning ncclResult_t); maps ApiError, ferry::Error (by its code), CUDA errors
// and anything else to a result, with `api` in front of the message.
ncclResult_t guardedImpl(const char* api, ncclResult_t (*body)(void*), void* context);

template <class Body>
ncclResult_t guarded(const char* api, Body&& body) {
  return guardedImpl(
      api, [](void* b) -> ncclResult_t { return (*static_cast<std::remove_reference_t<Body>*>(b))(); }, &body);
}

}  // namespace ferry::nccl
