#pragma once
// The errors ferry throws. Every message names the failure family (the code), the operation that
// failed and where (file:line), so that a log line alone tells what to look at.
//
// Example:
//   try { bootstrap->barrier(); }
//   catch (const ferry::TimeoutError& e) { /* e.what(): "ferry Timeout: rank 0: barrier ... */ }
#include <stdexcept>
#include <string>
#include <string_view>

#include "ferry/api.hpp"

namespace ferry {

// Where an error was raised. Like std::source_location, but built on builtins that every compiler
// we support has (clang 14 with libstdc++ cannot compile <source_location>).
struct SourceLocation {
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) noexcept {
    return SourceLocation{file, line};
  }
  const char* file;
  int line;
};

enum class ErrorCode : int {
  InternalError = 1,  // a bug in ferry
  InvalidUsage,       // a bad argument or a call in the wrong state: the caller must change something
  SystemError,        // an OS call failed (errno attached)
  CudaError,          // a CUDA runtime or driver call failed
  Timeout,            // a bounded wait expired (a peer never arrived, a signal never came)
  RemoteError,        // a peer failed, closed its connection or aborted
  ProtocolError,      // a malformed or unauthenticated message
  NotSupported,       // valid, but not available on this machine or build
};

FERRY_API std::string_view toString(ErrorCode code);

class FERRY_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, SourceLocation where = SourceLocation::current());
  ErrorCode code() const noexcept { return code_; }
  // The message without the "ferry <family>:" prefix and the location.
  const std::string& detail() const noexcept { return detail_; }

 private:
  ErrorCode code_;
  std::string detail_;
};

// An OS call failed; errnum() is the errno it left.
class FERRY_API SysError : public Error {
 public:
  SysError(const std::string& message, int errnum, SourceLocation where = SourceLocation::current());
  int errnum() const noexcept { return errnum_; }

 private:
  int errnum_;
};

// A CUDA runtime (cudaError_t) or driver (CUresult) call failed; cudaCode() is the raw value.
class FERRY_API CudaError : public Error {
 public:
  CudaError(const std::string& message, int cudaCode, SourceLocation where = SourceLocation::current());
  int cudaCode() const noexcept { return cudaCode_; }

 private:
  int cudaCode_;
};

class FERRY_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message, SourceLocation where = SourceLocation::current());
};

}  // namespace ferry
