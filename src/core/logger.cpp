#include "core/logger.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/env_internal.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry::log {
namespace {

constexpr std::array<std::string_view, kLogSubsysCount> kSubsysNames = {
    "core", "bootstrap", "transport", "proxy", "collectives", "executor", "nccl", "tools"};
constexpr std::array<std::string_view, 6> kLevelNames = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

LogLevel parseLevel(std::string_view text, std::string_view item) {
  std::string u = upper(text);
  if (u == "OFF") return LogLevel::None;
  if (u == "WARNING") return LogLevel::Warn;
  for (std::size_t i = 0; i < kLevelNames.size(); ++i)
    if (u == kLevelNames[i]) return static_cast<LogLevel>(i);
  throw Error(ErrorCode::InvalidUsage, "FERRY_LOG item '" + std::string(item) + "': unknown level '" +
                                           std::string(text) +
                                           "' (use NONE, ERROR, WARN, INFO, DEBUG or TRACE)");
}

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  std::string h(buf);
  return h.substr(0, h.find('.'));
}

struct State {
  std::atomic<int> levels[kLogSubsysCount];
  std::mutex mu;
  std::function<void(std::string_view)> sink;  // guarded by mu
  int fd = STDERR_FILENO;
  std::string host = hostName();

  State() {
    Levels parsed{};
    parsed.fill(LogLevel::Warn);
    std::string file;
    try {
      const Env& e = detail::parsedEnv();  // not env(): it announces through this logger
      parsed = parseSpec(e.log);
      file = e.logFile;
    } catch (const Error& err) {
      std::string line = "ferry: " + std::string(err.what()) + "; logging at WARN\n";
      (void)!::write(STDERR_FILENO, line.data(), line.size());
    }
    for (int i = 0; i < kLogSubsysCount; ++i) levels[i].store(static_cast<int>(parsed[i]));
    if (!file.empty()) openFile(file);
  }

  void openFile(std::string path) {
    for (std::size_t at; (at = path.find("%h")) != std::string::npos;) path.replace(at, 2, host);
    for (std::size_t at; (at = path.find("%p")) != std::string::npos;)
      path.replace(at, 2, std::to_string(getpid()));
    int opened = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (opened >= 0) {
      fd = opened;
      return;
    }
    // Said once, at the start, where it will be seen: not a silent fallback.
    std::string line = "ferry ERROR core: FERRY_LOG_FILE=" + path + " cannot be opened (" + std::strerror(errno) +
                       "); logging to stderr instead\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
};

State& state() {
  static State* s = new State();  // never destroyed: logging must work during static destruction
  return *s;
}

thread_local int tlsDevice = -1;
std::atomic<bool> startupLogged{false};

void logStartup() {
  for (const auto& [name, value] : detail::envSetVariables()) FERRY_LOG(Info, Core) << name << "=" << value;
  for (const auto& name : detail::envUnknownFerryVariables())
    FERRY_LOG(Warn, Core) << name << " is set but ferry has no such variable (see docs/env.md)";
}

}  // namespace

Levels parseSpec(std::string_view spec) {
  Levels levels{};
  levels.fill(LogLevel::Warn);
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t end = std::min(spec.find(',', pos), spec.size());
    std::string_view item = spec.substr(pos, end - pos);
    pos = end + 1;
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.remove_suffix(1);
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    LogLevel level = parseLevel(item.substr(0, colon), item);
    if (colon == std::string_view::npos) {
      levels.fill(level);
      continue;
    }
    std::string_view sub = item.substr(colon + 1);
    auto it = std::find(kSubsysNames.begin(), kSubsysNames.end(), sub);
    if (it == kSubsysNames.end())
      throw Error(ErrorCode::InvalidUsage,
                  "FERRY_LOG item '" + std::string(item) + "': unknown subsystem '" + std::string(sub) +
                      "' (use core, bootstrap, transport, proxy, collectives, executor, nccl or tools)");
    levels[it - kSubsysNames.begin()] = level;
  }
  return levels;
}

std::string_view name(LogSubsys subsys) { return kSubsysNames[static_cast<int>(subsys)]; }

bool enabled(LogLevel level, LogSubsys subsys) {
  return static_cast<int>(level) <= state().levels[static_cast<int>(subsys)].load(std::memory_order_relaxed);
}

void write(LogLevel level, LogSubsys subsys, std::string_view message) {
  // The startup lines are written through this function too; the flag makes that re-entry a no-op.
  if (!startupLogged.exchange(true)) logStartup();
  State& s = state();
  std::string line = s.host + ":" + std::to_string(getpid()) + ":" +
                     std::to_string(static_cast<long>(syscall(SYS_gettid))) + " [" +
                     (tlsDevice < 0 ? std::string("-") : std::to_string(tlsDevice)) + "] ferry " +
                     std::string(kLevelNames[static_cast<int>(level)]) + " " +
                     std::string(kSubsysNames[static_cast<int>(subsys)]) + ": ";
  line.append(message);
  std::lock_guard lock(s.mu);
  if (s.sink) {
    s.sink(line);
    return;
  }
  line.push_back('\n');
  (void)!::write(s.fd, line.data(), line.size());  // one write: lines from threads never interleave
}

void setDevice(int device) { tlsDevice = device; }

void announceStartup() {
  if (!startupLogged.exchange(true)) logStartup();
}

void setSinkForTesting(std::function<void(std::string_view)> sink) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.sink = std::move(sink);
}

void setLevelsForTesting(const Levels& levels) {
  for (int i = 0; i < kLogSubsysCount; ++i) state().levels[i].store(static_cast<int>(levels[i]));
}

}  // namespace ferry::log
