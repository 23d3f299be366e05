// EthernetConnection's data path (ethernet_connection.hpp): frames out, the receiver thread that
// applies the peer's frames, and the answers that confirm flushes or say why a frame was refused.
#include "transport/ethernet_connection.hpp"

#include <cuda_runtime_api.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/logger.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "memory/registered_memory_impl.hpp"
#include "platform/cuda_check.hpp"
#include "platform/cuda_runtime_util.hpp"
#include "platform/device_guard.hpp"
#include "transport/pinned_staging.hpp"

namespace ferry {
namespace {

// Sender -> receiver: a fixed header, then (Write) the bytes.
enum class Op : std::uint8_t { Write = 1, Store = 2, Flush = 3, Fence = 4 };
struct FrameHeader {
  std::uint8_t op;
  std::uint8_t pad[7];
  std::uint64_t regId;
  FdToken regToken;
  std::uint64_t offset;
  std::uint64_t arg;  // Write: bytes; Store: the value; Flush: the ticket; Fence: its number
};
static_assert(sizeof(FrameHeader) == 48);

// The header of a frame into `dst` (the peer's registration) at `offset`.
FrameHeader frameInto(Op op, const RegisteredMemory& dst, std::uint64_t offset, std::uint64_t arg) {
  FrameHeader h{};
  h.op = static_cast<std::uint8_t>(op);
  h.regId = dst.impl()->regId;
  h.regToken = dst.impl()->regToken;
  h.offset = offset;
  h.arg = arg;
  return h;
}

// Receiver -> sender: Flushed (value: the ticket) or Refused (value: the length of the reason that
// follows, after which the receiver closes).
enum class Answer : std::uint64_t { Flushed = 1, Refused = 2 };
struct AnswerHeader {
  std::uint64_t kind;
  std::uint64_t value;
};

constexpr std::size_t kStagingBytes = 4u << 20;

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

// The staging buffers of `device` in `staging`, made at first use (with that device current).
PinnedStaging& stagingOf(std::map<int, std::unique_ptr<PinnedStaging>>& staging, int device) {
  auto& slot = staging[device];
  if (!slot) slot = std::make_unique<PinnedStaging>(kStagingBytes);
  return *slot;
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

EthernetConnection::EthernetConnection(int rank, int remoteRank, std::vector<Socket> out,
                                       std::vector<Socket> in)
    : Connection(rank, remoteRank, Transport::Ethernet),
      outs_(std::move(out)),
      ins_(std::move(in)),
      laneFence_(ins_.size(), 0) {
  for (std::size_t lane = 0; lane < ins_.size(); ++lane)
    receivers_.emplace_back([this, lane] { receive(lane); });
}

EthernetConnection::~EthernetConnection() {
  stopping_.store(true);
  for (Socket& in : ins_) ::shutdown(in.fd(), SHUT_RDWR);
  laneCv_.notify_all();
  for (std::thread& t : receivers_)
    if (t.joinable()) t.join();
  for (auto* streams : {&sendStreams_, &receiveStreams_})
    for (const auto& [device, stream] : *streams) {
      DeviceGuard guard(device);
      (void)cudaStreamDestroy(stream);
    }
}

// Only for this rank's own memory (Connection::write with a local dst): a copy here, complete when
// it returns, so it is in order with the writes before and after it.
void EthernetConnection::doWrite(void* dst, const void* src, std::uint64_t bytes) {
  const int device = std::max(deviceOf(dst), deviceOf(src));
  if (device < 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  DeviceGuard guard(device);
  copyOn(streamOf(sendStreams_, device), dst, src, bytes, cudaMemcpyDefault);
}
void EthernetConnection::doUpdateAndSync(std::uint64_t*, bool, std::uint64_t) {
  throw Error(ErrorCode::InternalError,
              describe() + ": updateAndSync: an Ethernet connection takes the peer's registration");
}

void EthernetConnection::send(std::span<const std::byte> bytes) {
  try {
    outs_[0].sendAll(bytes,
                     Clock::now() + std::chrono::duration_cast<Clock::duration>(env().connectionTimeout));
  } catch (const Error& e) {
    // The receiver may have refused an earlier frame and closed: its reason is the real error.
    readAnswers(Clock::now());
    throw Error(e.code(), describe() + ": " + e.what());
  }
}

void EthernetConnection::doWriteTo(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src,
                                   std::uint64_t bytes) {
  const int device = deviceOf(src);
  if (outs_.size() > 1 && bytes >= kStripeBytes && device < 0 && dst.device() < 0) {
    sendStriped(dst, dstOffset, src, bytes);
    return;
  }
  const FrameHeader h = frameInto(Op::Write, dst, dstOffset, bytes);
  send(std::as_bytes(std::span(&h, 1)));
  if (device < 0) {
    send(std::span(static_cast<const std::byte*>(src), bytes));
    return;
  }
  // Device memory: through two page-locked host buffers, a chunk at a time; the copy of chunk k+1
  // runs while chunk k goes out (send() returns once the socket took it, so its buffer is free).
  DeviceGuard guard(device);
  const cudaStream_t stream = streamOf(sendStreams_, device);
  PinnedStaging& staging = stagingOf(sendStaging_, device);
  const auto* from = static_cast<const char*>(src);
  const auto chunkAt = [&](std::uint64_t k) {
    return std::min<std::uint64_t>(kStagingBytes, bytes - k * kStagingBytes);
  };
  const std::uint64_t chunks = (bytes + kStagingBytes - 1) / kStagingBytes;
  const auto fill = [&](std::uint64_t k) {
    const int b = static_cast<int>(k % 2);
    FERRY_CUDA_CHECK(cudaMemcpyAsync(staging.buffer(b), from + k * kStagingBytes, chunkAt(k),
                                     cudaMemcpyDeviceToHost, stream));
    staging.recordAfter(b, stream);
  };
  fill(0);
  for (std::uint64_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) fill(k + 1);
    const int b = static_cast<int>(k % 2);
    staging.waitFor(b);
    send(std::span(staging.buffer(b), chunkAt(k)));
  }
}

void EthernetConnection::sendStriped(const RegisteredMemory& dst, std::uint64_t dstOffset, const void* src,
                                     std::uint64_t bytes) {
  // Slices of whole 64 KiB, one per lane (fewer when the write is short); lane l's slice goes
  // on lane l, so lane 0 keeps its order with the frames before and after.
  const std::uint64_t n = outs_.size();
  const std::uint64_t slice = ((bytes + n - 1) / n + 65535) / 65536 * 65536;
  struct Part {
    std::size_t lane;
    FrameHeader header;
    const std::byte* data;
    std::uint64_t len;
    std::uint64_t sent = 0;  // of header and data together
  };
  std::vector<Part> parts;
  for (std::uint64_t lane = 0, at = 0; at < bytes; ++lane, at += slice) {
    const std::uint64_t len = std::min(slice, bytes - at);
    parts.push_back(
        {lane, frameInto(Op::Write, dst, dstOffset + at, len), static_cast<const std::byte*>(src) + at, len});
  }
  // The bound is on a stall, not on the whole write: any progress moves it.
  const auto bound = std::chrono::duration_cast<Clock::duration>(env().connectionTimeout);
  auto deadline = Clock::now() + bound;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Part*> open;
    for (Part& p : parts)
      if (p.sent < sizeof(FrameHeader) + p.len) {
        fds.push_back({outs_[p.lane].fd(), POLLOUT, 0});
        open.push_back(&p);
      }
    if (fds.empty()) break;
    if (Clock::now() >= deadline)
      throw TimeoutError(describe() + ": rank " + std::to_string(remoteRank()) + " took no more of a " +
                         std::to_string(bytes) + "-byte write within " +
                         std::to_string(env().connectionTimeout.count()) + " s (FERRY_CONNECTION_TIMEOUT)");
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR)
      throw SysError(describe() + ": poll on the lanes of a write", errno);
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Part& p = *open[i];
      const bool header = p.sent < sizeof(FrameHeader);
      const std::byte* from = header ? reinterpret_cast<const std::byte*>(&p.header) + p.sent
                                     : p.data + (p.sent - sizeof(FrameHeader));
      const std::uint64_t left =
          header ? sizeof(FrameHeader) - p.sent : p.len - (p.sent - sizeof(FrameHeader));
      const ssize_t put = ::send(fds[i].fd, from, left, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (put < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        const int err = errno;
        readAnswers(Clock::now());  // a refusal is the real error
        throw SysError(describe() + ": sending lane " + std::to_string(p.lane) + " of a write", err);
      }
      p.sent += static_cast<std::uint64_t>(put);
      deadline = Clock::now() + bound;
    }
  }
  striped_ = true;
}

void EthernetConnection::fenceLanes() {
  FrameHeader h{};
  h.op = static_cast<std::uint8_t>(Op::Fence);
  h.arg = ++fencesSent_;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(env().connectionTimeout);
  for (std::size_t lane = 1; lane < outs_.size(); ++lane) {
    try {
      outs_[lane].sendAll(std::as_bytes(std::span(&h, 1)), deadline);
    } catch (const Error& e) {
      readAnswers(Clock::now());
      throw Error(e.code(), describe() + ": lane " + std::to_string(lane) + ": " + e.what());
    }
  }
  send(std::as_bytes(std::span(&h, 1)));
  striped_ = false;
}

void EthernetConnection::doUpdateAndSyncTo(const RegisteredMemory& dst, std::uint64_t dstOffset,
                                           std::uint64_t newValue) {
  if (striped_) fenceLanes();
  const FrameHeader h = frameInto(Op::Store, dst, dstOffset, newValue);
  send(std::as_bytes(std::span(&h, 1)));
}

std::uint64_t EthernetConnection::doBeginFlush() {
  if (striped_) fenceLanes();
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
  if (!waitForFd(outs_[0].fd(), POLLIN, deadline)) return;
  bool closed = false;
  for (;;) {
    std::byte chunk[4096];
    const ssize_t got = ::recv(outs_[0].fd(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (got > 0) {
      answerBuffer_.insert(answerBuffer_.end(), chunk, chunk + got);
      continue;
    }
    if (got == 0) {  // closed: what came first may say why (a refusal)
      closed = true;
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
  if (closed)
    throw Error(ErrorCode::RemoteError,
                describe() + ": rank " + std::to_string(remoteRank()) +
                    " closed the connection (it exited, or destroyed its side); what was "
                    "written since the last confirmed flush may be lost");
}

void EthernetConnection::answer(std::uint64_t kind, std::uint64_t value, const std::string& text) {
  std::vector<std::byte> bytes(sizeof(AnswerHeader) + text.size());
  const AnswerHeader a{kind, value};
  std::memcpy(bytes.data(), &a, sizeof a);
  std::memcpy(bytes.data() + sizeof a, text.data(), text.size());
  ins_[0].sendAll(bytes, Clock::now() + std::chrono::duration_cast<Clock::duration>(env().connectionTimeout));
}

bool EthernetConnection::waitForLanes(std::uint64_t fence) {
  std::unique_lock lock(laneMu_);
  for (;;) {
    if (std::all_of(laneFence_.begin() + 1, laneFence_.end(), [&](std::uint64_t f) { return f >= fence; }))
      return true;
    if (stopping_.load()) return false;
    if (failed_.load(std::memory_order_acquire)) {
      lock.unlock();
      throw Error(ErrorCode::RemoteError, failure());
    }
    laneCv_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

void EthernetConnection::receive(std::size_t lane) {
  std::byte header[sizeof(FrameHeader)];
  try {
    while (readExact(ins_[lane].fd(), header, sizeof header, stopping_)) serveFrame(lane, header);
    if (!stopping_.load())
      fail(pairName(rank(), remoteRank()) + ": rank " + std::to_string(remoteRank()) +
           " closed the connection (it ended, or its host is unreachable)");
  } catch (const std::exception& e) {
    // The frame was refused (or the memory could not be written): tell the sender why, then stop.
    if (!stopping_.load()) {
      FERRY_LOG(Warn, Transport) << pairName(rank(), remoteRank()) + ": " + e.what();
      fail(e.what());
      try {  // the answers travel on lane 0; another lane's failure reaches lane 0 at its next fence
        if (lane == 0)
          answer(static_cast<std::uint64_t>(Answer::Refused), std::string_view(e.what()).size(), e.what());
      } catch (const Error&) {
      }
    }
  }
  ::shutdown(ins_[lane].fd(), SHUT_RDWR);
}

void EthernetConnection::fail(std::string why) {
  std::lock_guard lock(failureMu_);
  if (failure_.empty()) failure_ = std::move(why);
  failed_.store(true, std::memory_order_release);
  laneCv_.notify_all();  // lane 0's receiver may wait at a fence for the lane that ended
}

std::string EthernetConnection::failure() const {
  if (!failed_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(failureMu_);
  return failure_;
}

void EthernetConnection::serveFrame(std::size_t lane, const std::byte* bytes) {
  FrameHeader h;
  std::memcpy(&h, bytes, sizeof h);
  const std::string who = pairName(rank(), remoteRank());
  if (h.op == static_cast<std::uint8_t>(Op::Fence)) {
    if (lane == 0) {
      waitForLanes(h.arg);  // false: closing, and the loop ends at its next read
    } else {
      std::lock_guard lock(laneMu_);
      laneFence_[lane] = h.arg;
      laneCv_.notify_all();
    }
    return;
  }
  if (lane != 0 && h.op != static_cast<std::uint8_t>(Op::Write))
    throw Error(ErrorCode::ProtocolError, who + ": lane " + std::to_string(lane) +
                                              " carried a frame of kind " + std::to_string(h.op) +
                                              " (only writes go there)");
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
    throw Error(ErrorCode::ProtocolError,
                who + ": [" + std::to_string(h.offset) + ", +" + std::to_string(len) + ") is outside the " +
                    std::to_string(reg->size) + "-byte registration " + std::to_string(h.regId));
  char* dst = static_cast<char*>(reg->data) + h.offset;
  const bool device = reg->device >= 0;
  if (h.op == static_cast<std::uint8_t>(Op::Store)) {
    if (reinterpret_cast<std::uintptr_t>(dst) % alignof(std::uint64_t) != 0)
      throw Error(ErrorCode::ProtocolError,
                  who + ": a word at offset " + std::to_string(h.offset) + " is not aligned");
    if (device) {
      DeviceGuard guard(reg->device);
      copyOn(streamOf(receiveStreams_, reg->device), dst, &h.arg, sizeof h.arg, cudaMemcpyHostToDevice);
    } else {
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(dst))
          .store(h.arg, std::memory_order_release);
    }
    return;
  }
  if (lane != 0 && device)
    throw Error(ErrorCode::ProtocolError,
                who + ": lane " + std::to_string(lane) + " carried a write into device memory");
  if (!device) {
    if (!readExact(ins_[lane].fd(), dst, len, stopping_))
      throw Error(ErrorCode::RemoteError, who + ": the connection closed inside a write");
    return;
  }
  // Through two page-locked host buffers: chunk k+1 is read from the socket while chunk k is
  // copied to the device; the write counts as applied (for the frames after it, a flush's answer
  // included) once every copy has finished.
  DeviceGuard guard(reg->device);
  const cudaStream_t stream = streamOf(receiveStreams_, reg->device);
  PinnedStaging& pinned = stagingOf(receiveStaging_, reg->device);
  std::uint64_t k = 0;
  for (std::uint64_t done = 0; done < len; ++k) {
    const std::uint64_t n = std::min<std::uint64_t>(kStagingBytes, len - done);
    const int b = static_cast<int>(k % 2);
    pinned.waitFor(b);  // its copy from two chunks ago has drained it
    if (!readExact(ins_[0].fd(), pinned.buffer(b), n, stopping_))
      throw Error(ErrorCode::RemoteError, who + ": the connection closed inside a write");
    FERRY_CUDA_CHECK(cudaMemcpyAsync(dst + done, pinned.buffer(b), n, cudaMemcpyHostToDevice, stream));
    pinned.recordAfter(b, stream);
    done += n;
  }
  FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace ferry
