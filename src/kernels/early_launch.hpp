#pragma once
// Whether this process launches its collective and send/recv kernels early, with programmatic
// dependent launch (docs/architecture.md, "Latency"): FERRY_LAUNCH_PDL=1, on a current GPU of
// compute capability 9.0 or more, where it exists.

namespace ferry {

bool earlyLaunchWanted();

}  // namespace ferry
