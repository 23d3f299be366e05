#pragma once
// Lets this thread make stream calls while another thread captures a CUDA graph in global mode
// (PyTorch's default): a Comm's or a SymmetricMemory's abort() is called from watchdog threads at
// any time, and a Comm across hosts aborts its host's calls from a proxy thread.
#include <cuda_runtime_api.h>

namespace ferry {

class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace ferry
