#include "ferry/transport.hpp"

namespace ferry {

std::string_view toString(Transport t) {
  switch (t) {
    case Transport::CudaIpc: return "CudaIpc";
    case Transport::HostMemory: return "HostMemory";
    case Transport::Ethernet: return "Ethernet";
    case Transport::InfiniBand: return "InfiniBand";
  }
  return "unknown";
}

std::string toString(TransportFlags flags) {
  std::string out;
  for (int i = 0; i < kTransportCount; ++i) {
    auto t = static_cast<Transport>(i);
    if (!flags.has(t)) continue;
    if (!out.empty()) out += '|';
    out += toString(t);
  }
  return out.empty() ? "none" : out;
}

}  // namespace ferry
