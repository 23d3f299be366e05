#pragma once
// Host identity (which ranks share a machine) and the secrets that authenticate bootstrap peers.
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string_view>

#include "core/bootstrap_wire.hpp"

namespace ferry {

// FNV-1a, 64-bit: stable across processes and builds (std::hash is not).
std::uint64_t fnv1a(std::string_view data, std::uint64_t seed = 0xcbf29ce484222325ull);
// The same over the bytes of `words`: a digest of several fields.
inline std::uint64_t fnv1a(std::initializer_list<std::uint64_t> words) {
  return fnv1a(std::string_view(reinterpret_cast<const char*>(std::data(words)), words.size() * sizeof(std::uint64_t)));
}

// FERRY_HOSTID if set, else a hash of the hostname and the kernel's boot id together. Two
// containers on one machine share the boot id but usually not the hostname, so they count as two
// hosts unless both set the same FERRY_HOSTID (do that where they share GPUs and /dev/shm).
std::uint64_t hostHash();

// 128 random bits from the kernel.
wire::Secret randomSecret();
// A secret derived from text every rank knows (host:port mode); as strong as that text.
wire::Secret derivedSecret(std::string_view text);
// Constant time, so a stranger learns nothing from how fast a guess is rejected.
bool secretsEqual(const wire::Secret& a, const wire::Secret& b);

}  // namespace ferry
