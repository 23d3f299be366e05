#pragma once
// What the bootstrap's progress thread keeps per connection: an authenticated Connection's frame
// reading and writing state, and a Pending connection's handshake. Private to
// bootstrap_network.cpp (callers, frames) and bootstrap_accept.cpp (admission).
#include <array>
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "core/bootstrap_network.hpp"
#include "core/text.hpp"

namespace ferry {

struct BootstrapNetwork::Connection {
  Socket socket;
  int peer;
  SocketAddress remote;
  bool dead = false;  // guarded by mu_
  handshake::Session session;  // progress thread only, once the connection is listed
  // Read state: progress thread only. A frame is its header, its payload, then its tag.
  enum class Reading { Header, Payload, Tag } reading = Reading::Header;
  std::array<std::byte, wire::kFrameHeaderBytes> header{};
  std::size_t headerGot = 0;
  wire::FrameHeader frame;
  Payload payload;
  std::size_t payloadGot = 0;
  wire::Tag tag{};
  std::size_t tagGot = 0;
  // Write queue: guarded by mu_. headSent counts bytes of the head frame (header + payload + tag)
  // written; headTag is the head frame's tag, made when its first byte goes out (progress thread).
  std::deque<OutFrame> queue;
  std::size_t headSent = 0;
  wire::Tag headTag{};
  bool headTagMade = false;
};

// A connection in its handshake (core/handshake.hpp): the hello arrives, the challenge goes out,
// the proof arrives. Progress thread only.
struct BootstrapNetwork::Pending {
  Socket socket;
  SocketAddress remote;
  std::array<std::byte, wire::kHelloBytes> hello{};
  std::vector<std::byte> challenge;  // sent; empty while the hello is being read
  std::array<std::byte, wire::kProofBytes> proof{};
  std::size_t got = 0;  // bytes of the message being read (the hello, then the proof)
  Clock::time_point deadline;
  std::size_t received() const { return challenge.empty() ? got : wire::kHelloBytes + got; }
};

}  // namespace ferry
