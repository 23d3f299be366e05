// The fd server: descriptors handed over (also to a forked process), wrong tokens and unknown ids
// refused, garbage and silent clients survived, and the client's bounded wait.
#include "memory/fd_server.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/host_id.hpp"
#include "expect_contains.hpp"
#include "ferry/errors.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

UniqueFd memfdWith(const char* text) {
  UniqueFd fd(memfd_create("fd-server-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::write(fd.get(), text, std::strlen(text)), static_cast<ssize_t>(std::strlen(text)));
  return fd;
}

std::string contentOf(int fd) {
  char buf[64] = {};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// A raw client: connects to the server and sends `bytes`, then closes (or not).
UniqueFd rawClient(const std::string& name, const void* bytes, std::size_t n) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_EQ(::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
  if (n > 0) {
    EXPECT_EQ(::send(s.get(), bytes, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }
  return s;
}

TEST(FdServer, HandsOverTheDescriptor) {
  FdServer server;
  UniqueFd mem = memfdWith("hello");
  FdToken token = randomSecret();
  server.publish(7, token, mem.get());
  UniqueFd got = fetchFd(server.name(), 7, token, 5s, "allocation 7 of rank 0");
  ASSERT_TRUE(got.valid());
  EXPECT_NE(got.get(), mem.get());
  EXPECT_EQ(contentOf(got.get()), "hello");
  EXPECT_EQ(server.stats().served, 1u);
}

TEST(FdServer, RefusesWrongTokenAndUnknownId) {
  FdServer server;
  UniqueFd mem = memfdWith("x");
  FdToken token = randomSecret();
  server.publish(1, token, mem.get());
  FdToken wrong = token;
  wrong[15] ^= 0x80;
  try {
    fetchFd(server.name(), 1, wrong, 5s, "allocation 1 of rank 3");
    FAIL() << "a wrong token was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ProtocolError);
    EXPECT_CONTAINS(e.what(), "refused the token");
    EXPECT_CONTAINS(e.what(), "allocation 1 of rank 3");
  }
  try {
    fetchFd(server.name(), 2, token, 5s, "allocation 2 of rank 3");
    FAIL() << "an unknown id was served";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RemoteError);
    EXPECT_CONTAINS(e.what(), "no longer has allocation 2");
  }
  server.withdraw(1);
  EXPECT_THROW(fetchFd(server.name(), 1, token, 5s, "allocation 1"), Error);
  EXPECT_EQ(server.stats().served, 0u);
  EXPECT_EQ(server.stats().rejected, 3u);
}

TEST(FdServer, SurvivesGarbageAndSilentClients) {
  FdServer server;
  UniqueFd mem = memfdWith("still here");
  FdToken token = randomSecret();
  server.publish(3, token, mem.get());
  {
    char garbage[200];
    for (std::size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = static_cast<char>(i * 37);
    rawClient(server.name(), garbage, sizeof(garbage));  // wrong magic, too long
    rawClient(server.name(), garbage, 5);                // truncated, then closed
    rawClient(server.name(), nullptr, 0);                // connects and leaves
  }
  // A client that connects and says nothing holds the server at most its request deadline (1 s).
  UniqueFd silent = rawClient(server.name(), nullptr, 0);
  auto start = std::chrono::steady_clock::now();
  UniqueFd got = fetchFd(server.name(), 3, token, 10s, "allocation 3");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(contentOf(got.get()), "still here");
  EXPECT_GE(server.stats().rejected, 3u);
}

TEST(FdServer, ClientWaitIsBoundedAndNamesTheAllocation) {
  // A socket that listens but never answers.
  UniqueFd mute(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  std::string name = "ferry-fd-test-mute-" + std::to_string(::getpid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(mute.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(mute.get(), 4), 0);
  auto start = std::chrono::steady_clock::now();
  try {
    fetchFd(name, 9, FdToken{}, 200ms, "allocation 9 of rank 5 (pid 1)");
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_CONTAINS(e.what(), "allocation 9 of rank 5");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  // Nobody there at all: a clear error at once.
  try {
    fetchFd("ferry-fd-nobody-" + std::to_string(::getpid()), 1, FdToken{}, 1s, "allocation 1 of rank 2");
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RemoteError);
    EXPECT_CONTAINS(e.what(), "cannot reach");
  }
  EXPECT_THROW(fetchFd(std::string(200, 'n'), 1, FdToken{}, 1s, "x"), Error);
}

TEST(FdServer, PassesDescriptorsBetweenProcesses) {
  // The child serves a memfd; the parent fetches it and sees the child's bytes, then writes its own
  // that the child checks (the same pages in both).
  int toParent[2], toChild[2];
  ASSERT_EQ(::pipe(toParent), 0);
  ASSERT_EQ(::pipe(toChild), 0);
  FdToken token = randomSecret();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 1;
    try {
      UniqueFd mem = memfdWith("from the child");
      FdServer& server = FdServer::instance();
      server.publish(11, token, mem.get());
      std::string name = server.name();
      if (::write(toParent[1], name.c_str(), name.size() + 1) > 0) {
        char done = 0;
        if (::read(toChild[0], &done, 1) == 1 && contentOf(mem.get()) == "from the parent") code = 0;
      }
    } catch (...) {
    }
    _exit(code);
  }
  char name[128] = {};
  ASSERT_GT(::read(toParent[0], name, sizeof(name)), 0);
  ASSERT_NE(std::string(name), FdServer::instance().name());  // the child runs its own server
  UniqueFd got = fetchFd(name, 11, token, 10s, "allocation 11 of the child");
  EXPECT_EQ(contentOf(got.get()), "from the child");
  const char text[] = "from the parent";
  ASSERT_EQ(::pwrite(got.get(), text, sizeof(text) - 1, 0), static_cast<ssize_t>(sizeof(text) - 1));
  ASSERT_EQ(::write(toChild[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int f : {toParent[0], toParent[1], toChild[0], toChild[1]}) ::close(f);
}

}  // namespace
}  // namespace ferry::test
