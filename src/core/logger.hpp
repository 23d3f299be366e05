#pragma once
// The one logger. FERRY_LOG sets levels per subsystem: a comma-separated list of LEVEL (all
// subsystems) or LEVEL:subsystem items, e.g. "INFO" or "WARN,TRACE:bootstrap". Levels: NONE, ERROR,
// WARN (default), INFO, DEBUG, TRACE. Lines go to stderr, or to FERRY_LOG_FILE ("%h" and "%p" become
// host and pid), each prefixed "host:pid:tid [dev]".
//
//   FERRY_LOG(Info, Bootstrap) << "rank " << rank << " joined";
#include <array>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace ferry {

enum class LogLevel : int { None = 0, Error, Warn, Info, Debug, Trace };
enum class LogSubsys : int { Core = 0, Bootstrap, Transport, Proxy, Collectives, Executor, Nccl, Tools };
inline constexpr int kLogSubsysCount = 8;

namespace log {

using Levels = std::array<LogLevel, kLogSubsysCount>;
// Parses a FERRY_LOG value; throws Error(InvalidUsage) naming the bad item.
Levels parseSpec(std::string_view spec);
std::string_view name(LogSubsys subsys);

bool enabled(LogLevel level, LogSubsys subsys);
void write(LogLevel level, LogSubsys subsys, std::string_view message);
// The CUDA device this thread works for, shown as [dev] (-1: none, shown as [-]).
void setDevice(int device);
// Logs the startup lines now (the variables that are set, at INFO; FERRY_* names that ferry does not
// know, usually a typo, at WARN), unless something logged them already: env() calls it on first
// use, so that a misspelt variable is reported even when nothing else is logged.
void announceStartup();
// Replaces the output (nullptr restores it); for tests that check what was logged.
void setSinkForTesting(std::function<void(std::string_view line)> sink);
// Sets the levels directly, as if FERRY_LOG said so; for tests.
void setLevelsForTesting(const Levels& levels);

class Line {
 public:
  Line(LogLevel level, LogSubsys subsys) : level_(level), subsys_(subsys) {}
  ~Line() { write(level_, subsys_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  LogSubsys subsys_;
  std::ostringstream stream_;
};

// Turns the streamed expression into void, so that FERRY_LOG is one expression: safe inside an
// unbraced if/else, and its stream arguments are not evaluated when the level is off.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace log
}  // namespace ferry

#define FERRY_LOG(level, subsys)                                               \
  !::ferry::log::enabled(::ferry::LogLevel::level, ::ferry::LogSubsys::subsys) \
      ? (void)0                                                                \
      : ::ferry::log::Voidify() &                                              \
            ::ferry::log::Line(::ferry::LogLevel::level, ::ferry::LogSubsys::subsys).stream()
