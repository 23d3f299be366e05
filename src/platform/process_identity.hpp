#pragma once
// Who this process is, for descriptors that peers send back to us: the host hash (which processes
// share a machine), a random per-process token (pids repeat across pid namespaces and over time;
// the token does not), and the pid (for messages only).
//
// A forked child is a different process: identity() notices the pid change and makes a new token,
// so the child never mistakes its parent's descriptors for its own.
#include <sys/types.h>

#include <cstdint>

namespace ferry {

struct ProcessIdentity {
  std::uint64_t hostHash = 0;
  std::uint64_t token = 0;
  std::uint32_t pid = 0;
};

// Thread-safe; recomputed after a fork.
ProcessIdentity processIdentity();

// 64 random bits from the kernel.
std::uint64_t random64();

}  // namespace ferry
