#pragma once
// Small text helpers for messages and parsing, in one place.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace ferry {

// s without leading and trailing white space (space, tab, CR, LF, VT, FF).
inline std::string trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n\v\f";
  const std::size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return std::string(s.substr(first, s.find_last_not_of(kSpace) - first + 1));
}

// "0x1f" (an address or a raw word in a message).
inline std::string hexString(std::uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
  return text;
}
inline std::string hexString(const void* p) { return hexString(reinterpret_cast<std::uintptr_t>(p)); }

// "rank 3": how every message names a rank.
inline std::string rankName(int rank) { return "rank " + std::to_string(rank); }

// n rounded up to a multiple of `to`. @pre to > 0 and no overflow.
constexpr std::uint64_t roundUp(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace ferry
