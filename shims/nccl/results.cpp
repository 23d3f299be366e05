#include "results.hpp"

#include <exception>

#include "core/logger.hpp"
#include "ferry/errors.hpp"

namespace ferry::nccl {
namespace {

thread_local std::string tlsLastError;

ncclResult_t resultOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidUsage:
    case ErrorCode::NotSupported: return ncclInvalidUsage;
    case ErrorCode::SystemError: return ncclSystemError;
    case ErrorCode::CudaError: return ncclUnhandledCudaError;
    case ErrorCode::Timeout:
    case ErrorCode::RemoteError:
    case ErrorCode::ProtocolError: return ncclRemoteError;
    case ErrorCode::InternalError: break;
  }
  return ncclInternalError;
}

}  // namespace

ncclResult_t fail(ncclResult_t result, const std::string& message) {
  tlsLastError = message;
  FERRY_LOG(Warn, Nccl) << message;
  return result;
}

const char* lastError() { return tlsLastError.c_str(); }

const char* resultString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with FERRY_LOG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with FERRY_LOG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the ferry developers";
    case ncclInvalidArgument: return "invalid argument (run with FERRY_LOG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with FERRY_LOG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

ncclResult_t guardedImpl(const char* api, ncclResult_t (*body)(void*), void* context) {
  try {
    return body(context);
  } catch (const ApiError& e) {
    return fail(e.result, std::string(api) + ": " + e.message);
  } catch (const Error& e) {
    return fail(resultOf(e.code()), std::string(api) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, std::string(api) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(ncclInternalError, std::string(api) + ": " + e.what());
  } catch (...) {
    return fail(ncclInternalError, std::string(api) + ": unknown exception");
  }
}

}  // namespace ferry::nccl
