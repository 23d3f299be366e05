#include "transport/ethernet_connection.hpp"

#include <cuda_runtime_api.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/handshake.hpp"
#include "core/interfaces.hpp"
#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "memory/registered_memory_impl.hpp"
#include "platform/cuda_check.hpp"
#include "platform/cuda_runtime_util.hpp"
#include "platform/device_guard.hpp"

namespace ferry {
namespace {

// Sender -> receiver: a fixed header, then (Write) the bytes.
enum class Op : std::uint8_t { Write = 1, Store = 2, Flush = 3 };
struct FrameHeader {
  std::uint8_t op;
  std::uint8_t pad[7];
  std::uint64_t regId;
  FdToken regToken;
  std::uint64_t offset;
  std::uint64_t arg;  // Write: bytes; Store: the value; Flush: the ticket
};
static_assert(sizeof(FrameHeader) == 48);

// Receiver -> sender: Flushed (value: the ticket) or Refused (value: the length of the reason that
// follows, after which the receiver closes).
enum class Answer : std::uint64_t { Flushed = 1, Refused = 2 };
struct AnswerHeader {
  std::uint64_t kind;
  std::uint64_t value;
};

constexpr std::size_t kStagingBytes = 4u << 20;
constexpr std::string_view kProofLabel = "ferry/ethernet/1/proof";

wire::Tag proofOf(const wire::Nonce& key, int from, int to) {
  const std::int32_t ranks[2] = {from, to};
  return handshake::mac(key, {std::as_bytes(std::span(kProofLabel)), std::as_bytes(std::span(ranks))});
}

std::string pairName(int rank, int peer) {
  return "rank " + std::to_string(rank) + " <- rank " + std::to_string(peer) + " (Ethernet)";
}

// Reads exactly n bytes from a non-blocking socket; false once the connection closed or `stopping`.
bool readExact(int fd, void* dst, std::size_t n, const std::atomic<bool>& stopping) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    if (stopping.load(std::memory_order_relaxed)) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, 200);  // wakes to see `stopping`
    if (r < 0 && errno != EINTR) return false;
    if (r <= 0) continue;
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

// The non-blocking stream of `device` in `streams`, made at first use.
cudaStream_t streamOf(std::map<int, cudaStream_t>& streams, int device) {
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams.emplace(device, s);
  return s;
}

// A copy between host and device on `stream`, complete when this returns.
void copyOn(cudaStream_t stream, void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// The device of device memory at p; -1 for host memory (or without a GPU).
int deviceOf(const void* p) {
  if (!gpuPresent()) return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}

}  // namespace

EthernetConnection::Endpoint EthernetConnection::Endpoint::open() {
  Endpoint e;
  SocketAddress local = chooseLocalAddress(std::nullopt);
  local.setPort(0);
  e.listener = Socket::listen(local, false);
  e.listener.setNonBlocking(true);  // establish() accepts until the queue is empty
  e.address = e.listener.localAddress();
  e.key = handshake::freshNonce();
  return e;
}

std::shared_ptr<EthernetConnection> EthernetConnection::establish(int rank, int remoteRank, Endpoint mine,
                                                                  const SocketAddress& theirAddress,
                                                                  const wire::Nonce& theirKey,
                                                                  std::chrono::duration<double> timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const std::string who = "rank " + std::to_string(rank) + ": Ethernet connection to rank " + std::to_string(remoteRank);
  // Out: to the peer's listener, with the proof that this rank got the peer's key.
  Socket out = Socket::connect(theirAddress, deadline);
  const wire::Tag proof = proofOf(theirKey, rank, remoteRank);
  out.sendAll(std::as_bytes(std::span(proof)), deadline);
  // In: the first connection on our listener that proves the peer got our key. Every connection
  // is read as its bytes come, side by side, so that strangers (or anyone who found the port) can
  // neither stall the real peer nor fill memory: a wrong proof or a close drops a connection at
  // once, and beyond kMaxPending silent ones the oldest goes.
  const wire::Tag expected = proofOf(mine.key, remoteRank, rank);
  struct Pending {
    Socket socket;
    wire::Tag got{};
    std::size_t have = 0;
  };
  constexpr std::size_t kMaxPending = 64;
  std::vector<Pending> pending;
  // One log line a second at most, each saying how many it stands for: a flood of strangers must
  // not become a flood of lines (as the bootstrap's rejections, docs/security.md).
  Clock::time_point lastLine{};
  std::uint64_t unreported = 0;
  auto turnAway = [&](std::size_t i, const std::string& why) {
    const auto now = Clock::now();
    if (now - lastLine >= std::chrono::seconds(1)) {
      lastLine = now;
      FERRY_LOG(Warn, Transport) << who << ": turned away a connection from "
                                 << pending[i].socket.peerAddress().toString() << " (" << why << ")"
                                 << (unreported ? " and " + std::to_string(std::exchange(unreported, 0)) +
                                                      " more before it, not shown"
                                                : std::string());
    } else {
      ++unreported;
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  Socket in;
  while (!in.valid()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      throw TimeoutError(who + ": rank " + std::to_string(remoteRank) + " did not connect to " +
                         mine.address.toString() + " within " + std::to_string(timeout.count()) +
                         " s (is it running, and can it reach this address? FERRY_SOCKET_IFNAME picks the "
                         "interface)");
    std::vector<pollfd> fds{{mine.listener.fd(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 200))) <= 0) continue;
    // Readable candidates first (their indices are those of this poll), then new connections.
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      const ssize_t got = ::recv(p.socket.fd(), p.got.data() + p.have, p.got.size() - p.have, MSG_DONTWAIT);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        turnAway(i, "closed before its proof");
        continue;
      }
      p.have += static_cast<std::size_t>(got);
      if (p.have < p.got.size()) continue;
      if (!handshake::tagsEqual(p.got, expected)) {
        turnAway(i, "a wrong proof: not rank " + std::to_string(remoteRank) + " of this job");
        continue;
      }
      in = std::move(p.socket);
      break;
    }
    if (in.valid() || !(fds[0].revents & POLLIN)) continue;
    for (;;) {
      Socket candidate(::accept4(mine.listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!candidate.valid()) break;
      pending.push_back({std::move(candidate)});
      if (pending.size() > kMaxPending) turnAway(0, "too many connections without a proof");
    }
  }
  // Each side tells the other that its proof was taken, so that neither writes into a socket the
  // other turned away.
  const std::byte ok{1};
  in.sendAll(std::span(&ok, 1), deadline);
  std::byte theirOk{};
  out.recvAll(std::span(&theirOk, 1), deadline);
  return std::make_shared<EthernetConnection>(rank, remoteRank, std::move(out), std::move(in));
}

EthernetConnection::EthernetConnection(int rank, int remoteRank, Socket out, Socket in)
    : Connection(rank, remoteRank, Transport::Ethernet), out_(std::move(out)), in_(std::move(in)) {
  receiver_ = std::thread([this] { receive(); });
}

EthernetConnection::~EthernetConnection() {
  stopping_.store(true);
  ::shutdown(in_.fd(), SHUT_RDWR);
  if (receiver_.joinable()) receiver_.join();
  for (auto* streams : {&sendStreams_, &receiveStreams_})
    for (const auto& [device, stream] : *streams) {
      DeviceGuard guard(device);
      (void)cudaStreamDestroy(stream);
    }
}

void EthernetConnection::doWrite(void*, const void*, std::uint64_t) {
  throw Error(ErrorCode::InternalError, describe() + ": write: an Ethernet connection takes the peer's registration");
}
void EthernetConnection::doUpdateAndSync(std::uint64_t*, bool, std::uint64_t) {
  throw Error(ErrorCode::InternalError,
              describe() + ": updateAndSync: an Ethernet connection takes the peer's registration");
}

void EthernetConnection::send(std::span<const std::byte> bytes) {
  try {
    out_.sendAll(bytes, Clock::now() + std::chrono::duration_cast<Clock::duration>(env().connectionTimeout));
  } catch (const Error& e) {
    // The receiver may have refused an earlier frame and closed: its reason is the real error.
    readAnswers(Clock::now());
    throw Error(e.code(), describe() + ": " + e.what());
  }
}

void EthernetConnection::doWriteTo(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src,
                                   std::uint64_t bytes) {
  const auto& d = *dst.impl();
  FrameHeader h{};
  h.op = static_cast<std::uint8_t>(Op::Write);
  h.regId = d.regId;
  h.regToken = d.regToken;
  h.offset = dstOffset;
  h.arg = bytes;
  send(std::as_bytes(std::span(&h, 1)));
  const int device = deviceOf(src);
  if (device < 0) {
    send(std::span(static_cast<const std::byte*>(src), bytes));
    return;
  }
  // Device memory: through a host buffer, a chunk at a time.
  if (sendStaging_.empty()) sendStaging_.resize(kStagingBytes);
  const cudaStream_t stream = streamOf(sendStreams_, device);
  DeviceGuard guard(device);
  for (std::uint64_t done = 0; done < bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(kStagingBytes, bytes - done);
    copyOn(stream, sendStaging_.data(), static_cast<const char*>(src) + done, n, cudaMemcpyDeviceToHost);
    send(std::span(sendStaging_.data(), n));
    done += n;
  }
}

void EthernetConnection::doUpdateAndSyncTo(const RegisteredMemory& dst, std::uint64_t dstOffset,
                                           std::uint64_t newValue) {
  const auto& d = *dst.impl();
  FrameHeader h{};
  h.op = static_cast<std::uint8_t>(Op::Store);
  h.regId = d.regId;
  h.regToken = d.regToken;
  h.offset = dstOffset;
  h.arg = newValue;
  send(std::as_bytes(std::span(&h, 1)));
}

std::uint64_t EthernetConnection::doBeginFlush() {
  FrameHeader h{};
  h.op = static_cast<std::uint8_t>(Op::Flush);
  h.arg = ++ticketsSent_;
  send(std::as_bytes(std::span(&h, 1)));
  return ticketsSent_;
}

bool EthernetConnection::doFlushComplete(std::uint64_t ticket) {
  readAnswers(Clock::now());
  return ticketsAnswered_ >= ticket;
}

void EthernetConnection::doFlush(std::chrono::duration<double> timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const std::uint64_t ticket = doBeginFlush();
  while (ticketsAnswered_ < ticket) {
    if (Clock::now() >= deadline)
      throw TimeoutError(describe() + ": flush: rank " + std::to_string(remoteRank()) +
                         " did not confirm the earlier writes within " + std::to_string(timeout.count()) +
                         " s (FERRY_CONNECTION_TIMEOUT; is it alive, and is the network up?)");
    readAnswers(deadline);
  }
}

void EthernetConnection::readAnswers(Clock::time_point deadline) {
  // Whatever has arrived, waiting for the first byte until the deadline.
  if (!waitForFd(out_.fd(), POLLIN, deadline)) return;
  for (;;) {
    std::byte chunk[4096];
    const ssize_t got = ::recv(out_.fd(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (got > 0) {
      answerBuffer_.insert(answerBuffer_.end(), chunk, chunk + got);
      continue;
    }
    if (got == 0) {
      // Closed: parse what came first (a refusal says why), else the peer is gone.
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    throw SysError(describe() + ": reading rank " + std::to_string(remoteRank()) + "'s answers", errno);
  }
  std::size_t at = 0;
  while (answerBuffer_.size() - at >= sizeof(AnswerHeader)) {
    AnswerHeader a;
    std::memcpy(&a, answerBuffer_.data() + at, sizeof a);
    if (a.kind == static_cast<std::uint64_t>(Answer::Flushed)) {
      ticketsAnswered_ = std::max(ticketsAnswered_, a.value);
      at += sizeof a;
      continue;
    }
    if (a.kind == static_cast<std::uint64_t>(Answer::Refused)) {
      const std::size_t len = std::min<std::uint64_t>(a.value, 4096);
      std::string why(reinterpret_cast<const char*>(answerBuffer_.data() + at + sizeof a),
                      std::min(len, answerBuffer_.size() - at - sizeof a));
      throw Error(ErrorCode::RemoteError,
                  describe() + ": rank " + std::to_string(remoteRank()) + " refused a write: " + why);
    }
    throw Error(ErrorCode::ProtocolError, describe() + ": rank " + std::to_string(remoteRank()) +
                                              " answered with an unknown kind " + std::to_string(a.kind));
  }
  answerBuffer_.erase(answerBuffer_.begin(), answerBuffer_.begin() + static_cast<std::ptrdiff_t>(at));
}

void EthernetConnection::answer(std::uint64_t kind, std::uint64_t value, const std::string& text) {
  std::vector<std::byte> bytes(sizeof(AnswerHeader) + text.size());
  const AnswerHeader a{kind, value};
  std::memcpy(bytes.data(), &a, sizeof a);
  std::memcpy(bytes.data() + sizeof a, text.data(), text.size());
  in_.sendAll(bytes, Clock::now() + std::chrono::duration_cast<Clock::duration>(env().connectionTimeout));
}

void EthernetConnection::receive() {
  std::vector<std::byte> staging;
  std::byte header[sizeof(FrameHeader)];
  try {
    while (readExact(in_.fd(), header, sizeof header, stopping_)) serveFrame(header, staging);
  } catch (const Error& e) {
    // The frame was refused (or the memory could not be written): tell the sender why, then stop.
    if (!stopping_.load()) {
      FERRY_LOG(Warn, Transport) << pairName(rank(), remoteRank()) + ": " + e.what();
      try {
        answer(static_cast<std::uint64_t>(Answer::Refused), std::string_view(e.what()).size(), e.what());
      } catch (const Error&) {
      }
    }
  }
  ::shutdown(in_.fd(), SHUT_RDWR);
}

void EthernetConnection::serveFrame(const std::byte* bytes, std::vector<std::byte>& staging) {
  FrameHeader h;
  std::memcpy(&h, bytes, sizeof h);
  const std::string who = pairName(rank(), remoteRank());
  if (h.op == static_cast<std::uint8_t>(Op::Flush)) {
    answer(static_cast<std::uint64_t>(Answer::Flushed), h.arg);
    return;
  }
  if (h.op != static_cast<std::uint8_t>(Op::Write) && h.op != static_cast<std::uint8_t>(Op::Store))
    throw Error(ErrorCode::ProtocolError, who + ": a frame of unknown kind " + std::to_string(h.op));
  const auto reg = findLocalRegistration(h.regId, h.regToken);
  if (!reg)
    throw Error(ErrorCode::ProtocolError,
                who + ": a frame names registration " + std::to_string(h.regId) +
                    ", which this process does not have (deregistered, or never registered here)");
  if (!reg->transports.has(Transport::Ethernet))
    throw Error(ErrorCode::InvalidUsage, who + ": registration " + std::to_string(h.regId) + " (" +
                                             toString(reg->transports) + ") was not registered for Ethernet");
  const std::uint64_t len = h.op == static_cast<std::uint8_t>(Op::Write) ? h.arg : sizeof(std::uint64_t);
  if (h.offset > reg->size || len > reg->size - h.offset)
    throw Error(ErrorCode::ProtocolError, who + ": [" + std::to_string(h.offset) + ", +" + std::to_string(len) +
                                              ") is outside the " + std::to_string(reg->size) +
                                              "-byte registration " + std::to_string(h.regId));
  char* dst = static_cast<char*>(reg->data) + h.offset;
  const bool device = reg->device >= 0;
  if (h.op == static_cast<std::uint8_t>(Op::Store)) {
    if (reinterpret_cast<std::uintptr_t>(dst) % alignof(std::uint64_t) != 0)
      throw Error(ErrorCode::ProtocolError, who + ": a word at offset " + std::to_string(h.offset) + " is not aligned");
    if (device) {
      DeviceGuard guard(reg->device);
      copyOn(streamOf(receiveStreams_, reg->device), dst, &h.arg, sizeof h.arg, cudaMemcpyHostToDevice);
    } else {
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(dst)).store(h.arg, std::memory_order_release);
    }
    return;
  }
  if (!device) {
    if (!readExact(in_.fd(), dst, len, stopping_))
      throw Error(ErrorCode::RemoteError, who + ": the connection closed inside a write");
    return;
  }
  if (staging.empty()) staging.resize(kStagingBytes);
  const cudaStream_t stream = streamOf(receiveStreams_, reg->device);
  DeviceGuard guard(reg->device);
  for (std::uint64_t done = 0; done < len;) {
    const std::uint64_t n = std::min<std::uint64_t>(kStagingBytes, len - done);
    if (!readExact(in_.fd(), staging.data(), n, stopping_))
      throw Error(ErrorCode::RemoteError, who + ": the connection closed inside a write");
    copyOn(stream, dst + done, staging.data(), n, cudaMemcpyHostToDevice);
    done += n;
  }
}

}  // namespace ferry
