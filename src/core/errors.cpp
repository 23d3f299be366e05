#include "ferry/errors.hpp"

#include <cstring>

namespace ferry {

std::string_view toString(ErrorCode code) {
  switch (code) {
    case ErrorCode::InternalError: return "InternalError";
    case ErrorCode::InvalidUsage: return "InvalidUsage";
    case ErrorCode::SystemError: return "SystemError";
    case ErrorCode::CudaError: return "CudaError";
    case ErrorCode::Timeout: return "Timeout";
    case ErrorCode::RemoteError: return "RemoteError";
    case ErrorCode::ProtocolError: return "ProtocolError";
    case ErrorCode::NotSupported: return "NotSupported";
  }
  return "UnknownError";
}

namespace {
std::string compose(ErrorCode code, const std::string& message, const SourceLocation& where) {
  std::string file = where.file;
  if (auto slash = file.rfind('/'); slash != std::string::npos) file.erase(0, slash + 1);
  std::string out = "ferry ";
  out.append(toString(code)).append(": ").append(message);
  out.append(" [").append(file).append(":").append(std::to_string(where.line)).append("]");
  return out;
}
}  // namespace

Error::Error(ErrorCode code, const std::string& message, SourceLocation where)
    : std::runtime_error(compose(code, message, where)), code_(code), detail_(message) {}

SysError::SysError(const std::string& message, int errnum, SourceLocation where)
    : Error(ErrorCode::SystemError,
            message + ": " + std::strerror(errnum) + " (errno " + std::to_string(errnum) + ")", where),
      errnum_(errnum) {}

CudaError::CudaError(const std::string& message, int cudaCode, SourceLocation where)
    : Error(ErrorCode::CudaError, message, where), cudaCode_(cudaCode) {}

TimeoutError::TimeoutError(const std::string& message, SourceLocation where)
    : Error(ErrorCode::Timeout, message, where) {}

}  // namespace ferry
