#include "estimate.hpp"

namespace ferry::nccl {

namespace {

// The bytes each rank moves over its links for the call, as bus bandwidth counts them.
double busBytes(const CallCost& call, int nranks) {
  const double bytes = static_cast<double>(call.bytes);
  const double n = nranks;
  if (!call.collective || nranks < 2) return bytes;
  switch (*call.collective) {
    case Collective::AllReduce: return bytes * 2 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll: return bytes * (n - 1) / n;
    case Collective::Broadcast:
    case Collective::Reduce: return bytes;
  }
  return bytes;
}

bool endsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace

double estimateMicroseconds(const CallCost& call, std::string_view algorithm, int nranks) {
  if (nranks < 2 || call.bytes == 0) return 0;
  // Latency in us and bandwidth in bytes per us, per regime (estimate.hpp).
  double latency = 9.0, bandwidth = 340e3;
  if (endsWith(algorithm, "_ll")) {
    latency = 4.0;
    bandwidth = 175e3;
  } else if (!call.collective) {
    latency = 5.0;  // sends and receives: one kernel for the group
  }
  return latency + busBytes(call, nranks) / bandwidth;
}

}  // namespace ferry::nccl
