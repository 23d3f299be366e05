// Writer/Reader: round trips, and that malformed input (truncated, oversized length fields, trailing
// bytes) is a ProtocolError that neither reads out of bounds nor allocates what the input claims.
#include "core/serializer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "expect_contains.hpp"

// The largest single operator-new request while tracking is on; lets a test prove that a huge length
// field never turns into a huge allocation.
namespace {
std::atomic<bool> gTrackAllocations{false};
std::atomic<std::size_t> gLargestAllocation{0};
}  // namespace

// noinline: an inlined free() of a pointer from operator new trips -Wmismatched-new-delete.
__attribute__((noinline)) void* operator new(std::size_t size) {
  if (gTrackAllocations.load(std::memory_order_relaxed)) {
    std::size_t prev = gLargestAllocation.load(std::memory_order_relaxed);
    while (size > prev && !gLargestAllocation.compare_exchange_weak(prev, size)) {
    }
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace ferry {
namespace {

struct Pod {
  std::uint16_t a;
  std::int32_t b;
  double c;
  bool operator==(const Pod&) const = default;
};

std::span<const std::byte> asBytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// A message with one field of each kind, used by the round-trip and truncation tests.
std::vector<std::byte> sample() {
  Writer w;
  w.put<std::uint8_t>(0xab);
  w.put<std::uint16_t>(0x1234);
  w.put<std::uint32_t>(0xdeadbeef);
  w.put<std::uint64_t>(0x0123456789abcdefull);
  w.put<std::int64_t>(-5);
  w.put<double>(3.25);
  w.put(Pod{7, -9, 0.5});
  w.putString("hello");
  w.putString("");
  w.putBlob(asBytes(std::string("\0\1\2", 3)));
  w.putBytes(asBytes("raw"));
  return std::move(w).bytes();
}

void readSample(Reader& r) {
  EXPECT_EQ(r.get<std::uint8_t>(), 0xab);
  EXPECT_EQ(r.get<std::uint16_t>(), 0x1234);
  EXPECT_EQ(r.get<std::uint32_t>(), 0xdeadbeefu);
  EXPECT_EQ(r.get<std::uint64_t>(), 0x0123456789abcdefull);
  EXPECT_EQ(r.get<std::int64_t>(), -5);
  EXPECT_EQ(r.get<double>(), 3.25);
  EXPECT_EQ(r.get<Pod>(), (Pod{7, -9, 0.5}));
  EXPECT_EQ(r.getString(), "hello");
  EXPECT_EQ(r.getString(), "");
  auto blob = r.getBlob();
  ASSERT_EQ(blob.size(), 3u);
  EXPECT_EQ(blob[0], std::byte{0});
  EXPECT_EQ(blob[2], std::byte{2});
  auto raw = r.getBytes(3);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()), "raw");
}

TEST(Serializer, RoundTrip) {
  const auto bytes = sample();
  Reader r(bytes);
  readSample(r);
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_NO_THROW(r.expectEnd());
}

TEST(Serializer, LittleEndianLayout) {
  Writer w;
  w.put<std::uint32_t>(0x04030201);
  w.putString("ab");
  const std::vector<std::byte> expected = {std::byte{1},   std::byte{2},  std::byte{3}, std::byte{4},
                                           std::byte{2},   std::byte{0},  std::byte{0}, std::byte{0},
                                           std::byte{'a'}, std::byte{'b'}};
  EXPECT_EQ(w.bytes(), expected);
  EXPECT_EQ(w.size(), expected.size());
}

TEST(Serializer, RandomBlobsRoundTrip) {
  std::mt19937 rng(1234);
  std::vector<std::string> blobs;
  Writer w;
  for (int i = 0; i < 50; ++i) {
    std::string s(rng() % 3000, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    w.putString(s);
    blobs.push_back(std::move(s));
  }
  const auto bytes = std::move(w).bytes();
  Reader r(bytes);
  for (const auto& s : blobs) EXPECT_EQ(r.getString(), s);
  EXPECT_NO_THROW(r.expectEnd());
}

// Every proper prefix of a valid message fails with ProtocolError. Each prefix is copied into a heap
// buffer of exactly its length, so that a read past the end is caught by AddressSanitizer.
TEST(Serializer, EveryTruncationThrowsProtocolError) {
  const auto full = sample();
  for (std::size_t len = 0; len < full.size(); ++len) {
    SCOPED_TRACE("prefix of " + std::to_string(len) + " bytes");
    auto buf = std::make_unique<std::byte[]>(len == 0 ? 1 : len);
    std::copy(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len), buf.get());
    Reader r(std::span<const std::byte>(buf.get(), len), "sample");
    try {
      readSample(r);
      r.expectEnd();
      ADD_FAILURE() << "truncated input was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::ProtocolError);
      EXPECT_CONTAINS(e.what(), "sample is truncated");
    }
  }
}

TEST(Serializer, TruncationMessageSaysWhatAndWhere) {
  const std::byte three[3] = {};
  Reader r(three, "bootstrap hello");
  r.get<std::uint16_t>();
  try {
    r.get<std::uint32_t>();
    FAIL() << "not thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ProtocolError);
    EXPECT_CONTAINS(e.what(), "bootstrap hello is truncated");
    EXPECT_CONTAINS(e.what(), "needs 4 more bytes at offset 2, has 1");
  }
  // A failed read consumes nothing.
  EXPECT_EQ(r.remaining(), 1u);
}

TEST(Serializer, HugeBlobLengthThrowsWithoutAllocating) {
  Writer w;
  w.put<std::uint32_t>(std::numeric_limits<std::uint32_t>::max());
  w.putBytes(asBytes("abc"));
  const auto bytes = std::move(w).bytes();

  gLargestAllocation = 0;
  gTrackAllocations = true;
  bool threw = false;
  try {
    Reader r(bytes, "blob");
    (void)r.getString();
  } catch (const Error& e) {
    threw = e.code() == ErrorCode::ProtocolError;
  }
  gTrackAllocations = false;
  EXPECT_TRUE(threw);
  // The error message is the only thing allocated; nothing near the claimed 4 GiB.
  EXPECT_LT(gLargestAllocation.load(), 4096u);
}

TEST(Serializer, GetBytesOfHugeCountThrows) {
  const auto bytes = sample();
  Reader r(bytes);
  EXPECT_THROW(r.getBytes(std::numeric_limits<std::size_t>::max()), Error);
  EXPECT_THROW(r.getBytes(bytes.size() + 1), Error);
  EXPECT_EQ(r.remaining(), bytes.size());
  EXPECT_EQ(r.getBytes(bytes.size()).size(), bytes.size());
}

TEST(Serializer, BlobLengthOneMoreThanLeftThrows) {
  Writer w;
  w.put<std::uint32_t>(6);
  w.putBytes(asBytes("12345"));
  const auto bytes = std::move(w).bytes();
  Reader r(bytes);
  try {
    r.getBlob();
    FAIL() << "not thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ProtocolError);
  }
}

TEST(Serializer, ExpectEndRejectsTrailingBytes) {
  Writer w;
  w.put<std::uint32_t>(1);
  w.put<std::uint16_t>(2);
  const auto bytes = std::move(w).bytes();
  Reader r(bytes, "bootstrap hello");
  EXPECT_EQ(r.get<std::uint32_t>(), 1u);
  try {
    r.expectEnd();
    FAIL() << "trailing bytes accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ProtocolError);
    EXPECT_CONTAINS(e.what(), "bootstrap hello has 2 unexpected trailing bytes");
  }
  EXPECT_EQ(r.get<std::uint16_t>(), 2u);
  EXPECT_NO_THROW(r.expectEnd());
}

TEST(Serializer, EmptyInput) {
  Reader r(std::span<const std::byte>{});
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_NO_THROW(r.expectEnd());
  EXPECT_THROW(r.get<std::uint8_t>(), Error);
  EXPECT_EQ(r.getBytes(0).size(), 0u);
}

}  // namespace
}  // namespace ferry
