#pragma once
// Counting this process's open file descriptors, for leak tests.
#include <dirent.h>

#include <chrono>
#include <cstddef>
#include <thread>

namespace ferry::test {

inline std::size_t openFdCount() {
  std::size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

// The count once it has stopped changing (the same for 50 ms), or after 2 s: a baseline. Taken
// right after an exchange with a server thread (the fd server), the count can still include that
// thread's end of it, which it closes a moment later; a baseline one high then reads as a
// descriptor closed twice.
inline std::size_t steadyFdCount() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::size_t n = openFdCount();
  for (int same = 0; same < 10 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::size_t m = openFdCount();
    same = m == n ? same + 1 : 0;
    n = m;
  }
  return n;
}

// The count once it has come down to `expected`, or after 2 s. Server threads (the fd server)
// close their end of a finished exchange a moment after the client has its answer, so a count
// taken right after the last cycle can be one high without anything having leaked.
inline std::size_t settledFdCount(std::size_t expected) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::size_t n = openFdCount();
  while (n > expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = openFdCount();
  }
  return n;
}

}  // namespace ferry::test
