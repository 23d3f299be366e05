#pragma once
// Small questions to the CUDA runtime that every part of the transport layer asks.
namespace ferry {

// True when the CUDA runtime finds at least one device. Asked once per process (a forked child
// asks again); false on machines without a driver, where ferry must still run its host paths.
bool gpuPresent();

// The calling thread's current CUDA device. Throws Error(NotSupported) when there is no GPU.
int currentDevice();

}  // namespace ferry
