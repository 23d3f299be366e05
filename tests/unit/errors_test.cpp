// The error hierarchy: codes and their names, what() naming family + message + throw site, SysError's
// errno text, CudaError from FERRY_CUDA_CHECK, and that everything is catchable as ferry::Error.
#include "ferry/errors.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <set>
#include <string>

#include "platform/cuda_check.hpp"
#include "expect_contains.hpp"

namespace ferry {
namespace {

constexpr ErrorCode kAllCodes[] = {ErrorCode::InternalError, ErrorCode::InvalidUsage, ErrorCode::SystemError,
                                   ErrorCode::CudaError,     ErrorCode::Timeout,      ErrorCode::RemoteError,
                                   ErrorCode::ProtocolError, ErrorCode::NotSupported};

TEST(ErrorCodes, NamesAreDistinctAndKnown) {
  std::set<std::string_view> names;
  for (ErrorCode code : kAllCodes) {
    std::string_view name = toString(code);
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "UnknownError") << static_cast<int>(code);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), std::size(kAllCodes));
}

TEST(ErrorCodes, NamesMatchEnumerators) {
  EXPECT_EQ(toString(ErrorCode::InternalError), "InternalError");
  EXPECT_EQ(toString(ErrorCode::InvalidUsage), "InvalidUsage");
  EXPECT_EQ(toString(ErrorCode::SystemError), "SystemError");
  EXPECT_EQ(toString(ErrorCode::CudaError), "CudaError");
  EXPECT_EQ(toString(ErrorCode::Timeout), "Timeout");
  EXPECT_EQ(toString(ErrorCode::RemoteError), "RemoteError");
  EXPECT_EQ(toString(ErrorCode::ProtocolError), "ProtocolError");
  EXPECT_EQ(toString(ErrorCode::NotSupported), "NotSupported");
}

TEST(ErrorCodes, OutOfRangeCodeHasAName) {
  EXPECT_EQ(toString(static_cast<ErrorCode>(0)), "UnknownError");
  EXPECT_EQ(toString(static_cast<ErrorCode>(9999)), "UnknownError");
}

class ErrorMessage : public ::testing::TestWithParam<ErrorCode> {};

TEST_P(ErrorMessage, NamesFamilyMessageAndThrowSite) {
  const ErrorCode code = GetParam();
  int line = 0;
  try {
    line = __LINE__ + 1;
    throw Error(code, "rank 3: barrier gave up");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_EQ(e.detail(), "rank 3: barrier gave up");
    const std::string what = e.what();
    EXPECT_CONTAINS(what, "ferry " + std::string(toString(code)) + ": rank 3: barrier gave up");
    EXPECT_CONTAINS(what, "[errors_test.cpp:" + std::to_string(line) + "]");
    // Only the file name is kept, not the build machine's directories.
    EXPECT_NOT_CONTAINS(what, "/errors_test.cpp");
    return;
  }
  FAIL() << "not thrown";
}

INSTANTIATE_TEST_SUITE_P(AllCodes, ErrorMessage, ::testing::ValuesIn(kAllCodes),
                         [](const auto& info) { return std::string(toString(info.param)); });

class SysErrorText : public ::testing::TestWithParam<int> {};

TEST_P(SysErrorText, CarriesErrnoAndStrerror) {
  const int errnum = GetParam();
  try {
    throw SysError("connect(10.0.0.1:1234)", errnum);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::SystemError);
    const auto* sys = dynamic_cast<const SysError*>(&e);
    ASSERT_NE(sys, nullptr);
    EXPECT_EQ(sys->errnum(), errnum);
    const std::string what = e.what();
    EXPECT_CONTAINS(what, "ferry SystemError: connect(10.0.0.1:1234)");
    EXPECT_CONTAINS(what, std::strerror(errnum));
    EXPECT_CONTAINS(what, "errno " + std::to_string(errnum));
    EXPECT_CONTAINS(what, "errors_test.cpp:");
    return;
  }
  FAIL() << "not thrown";
}

INSTANTIATE_TEST_SUITE_P(Errnos, SysErrorText,
                         ::testing::Values(ECONNREFUSED, EACCES, ETIMEDOUT, EADDRINUSE));

TEST(CudaCheck, FailingRuntimeCallNamesCallAndCudaError) {
  // Fails everywhere: without a driver (cudaErrorInsufficientDriver / NoDevice), and on a GPU machine
  // (cudaErrorInvalidDevice).
  int line = 0;
  try {
    line = __LINE__ + 1;
    FERRY_CUDA_CHECK(cudaSetDevice(9999));
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), ErrorCode::CudaError);
    EXPECT_NE(e.cudaCode(), 0);
    const std::string errName = cudaGetErrorName(static_cast<cudaError_t>(e.cudaCode()));
    const std::string what = e.what();
    EXPECT_CONTAINS(what, "ferry CudaError: ");
    EXPECT_CONTAINS(what, "cudaSetDevice(9999)");
    EXPECT_CONTAINS(what, errName);
    EXPECT_TRUE(errName.starts_with("cudaError")) << errName;
    EXPECT_CONTAINS(what, "[errors_test.cpp:" + std::to_string(line) + "]");
    return;
  }
  FAIL() << "FERRY_CUDA_CHECK(cudaSetDevice(9999)) did not throw";
}

TEST(CudaCheck, SuccessDoesNotThrow) { EXPECT_NO_THROW(FERRY_CUDA_CHECK(cudaSuccess)); }

TEST(CudaCheck, EvaluatesTheCallOnce) {
  int calls = 0;
  auto call = [&] {
    ++calls;
    return cudaSuccess;
  };
  FERRY_CUDA_CHECK(call());
  EXPECT_EQ(calls, 1);
}

struct Thrower {
  const char* name;
  ErrorCode code;
  std::function<void()> fn;
};

class Hierarchy : public ::testing::TestWithParam<Thrower> {};

TEST_P(Hierarchy, CatchableAsFerryErrorAndRuntimeError) {
  const Thrower& t = GetParam();
  try {
    t.fn();
    FAIL() << "not thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), t.code);
  }
  EXPECT_THROW(t.fn(), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(
    Types, Hierarchy,
    ::testing::Values(Thrower{"Error", ErrorCode::ProtocolError,
                              [] { throw Error(ErrorCode::ProtocolError, "x"); }},
                      Thrower{"SysError", ErrorCode::SystemError, [] { throw SysError("open", ENOENT); }},
                      Thrower{"CudaError", ErrorCode::CudaError, [] { throw CudaError("cudaMalloc", 2); }},
                      Thrower{"TimeoutError", ErrorCode::Timeout, [] { throw TimeoutError("barrier"); }}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry
