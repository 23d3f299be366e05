#pragma once
// Sizes as the tools take them on their command lines: "4096", "1K", "64M", "1G" (nccl-tests'
// suffixes, powers of 1024).
#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace ferry::tools {

// nullopt for anything that is not such a size: also nan, inf and sizes of 2^63 bytes or more.
inline std::optional<std::uint64_t> parseBytes(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  if (!std::isfinite(v) || v < 0) return std::nullopt;
  std::uint64_t scale = 1;
  if (used < text.size()) {
    if (used + 1 != text.size()) return std::nullopt;
    switch (std::toupper(static_cast<unsigned char>(text[used]))) {
      case 'K': scale = 1ull << 10; break;
      case 'M': scale = 1ull << 20; break;
      case 'G': scale = 1ull << 30; break;
      default: return std::nullopt;
    }
  }
  const double bytes = v * static_cast<double>(scale);
  if (bytes >= 0x1p63) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace ferry::tools
