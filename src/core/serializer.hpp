#pragma once
// Little-endian, bounds-checked serialization of plain values, byte strings and strings. A Reader
// never reads past its input and never allocates more than the input holds: a length field larger
// than what is left is a ProtocolError, not an allocation.
//
//   Writer w;  w.put<std::uint32_t>(7); w.putString("abc");
//   Reader r(w.bytes(), "hello");  auto n = r.get<std::uint32_t>(); auto s = r.getString(); r.expectEnd();
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ferry/errors.hpp"

namespace ferry {

static_assert(std::endian::native == std::endian::little, "ferry's wire formats assume a little-endian host");

class Writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& value) { putBytes(std::as_bytes(std::span<const T, 1>(&value, 1))); }
  void putBytes(std::span<const std::byte> data) {
    // resize + memcpy rather than insert: GCC 12 at -O3 reports a false stringop-overflow on insert.
    std::size_t at = buf_.size();
    buf_.resize(at + data.size());
    if (!data.empty()) std::memcpy(buf_.data() + at, data.data(), data.size());
  }
  // A u32 length, then the bytes.
  void putBlob(std::span<const std::byte> data) {
    put(static_cast<std::uint32_t>(data.size()));
    putBytes(data);
  }
  void putString(std::string_view s) { putBlob(std::as_bytes(std::span(s.data(), s.size()))); }

  const std::vector<std::byte>& bytes() const& { return buf_; }
  std::vector<std::byte> bytes() && { return std::move(buf_); }
  std::size_t size() const { return buf_.size(); }

 private:
  std::vector<std::byte> buf_;
};

class Reader {
 public:
  // `what` names the message in errors ("bootstrap hello").
  explicit Reader(std::span<const std::byte> data, const char* what = "message") : data_(data), what_(what) {}

  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
    return value;
  }
  std::span<const std::byte> getBytes(std::size_t n) { return take(n); }
  std::span<const std::byte> getBlob() { return take(get<std::uint32_t>()); }
  std::string getString() {
    auto b = getBlob();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }

  std::size_t remaining() const { return data_.size() - pos_; }
  void expectEnd() const {
    if (remaining() != 0)
      throw Error(ErrorCode::ProtocolError,
                  std::string(what_) + " has " + std::to_string(remaining()) + " unexpected trailing bytes");
  }

 private:
  std::span<const std::byte> take(std::size_t n) {
    if (n > remaining())
      throw Error(ErrorCode::ProtocolError, std::string(what_) + " is truncated: needs " + std::to_string(n) +
                                                " more bytes at offset " + std::to_string(pos_) + ", has " +
                                                std::to_string(remaining()));
    auto out = data_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  std::span<const std::byte> data_;
  std::size_t pos_ = 0;
  const char* what_;
};

}  // namespace ferry
