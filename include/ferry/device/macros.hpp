#pragma once
// Qualifiers for code that compiles both for the GPU (nvcc) and for the host (any C++20 compiler),
// so that device logic such as the FIFO can be tested by host threads in CI.
#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#define FERRY_DEVICE __device__
#define FERRY_INLINE __forceinline__
#else
#define FERRY_HOST_DEVICE
#define FERRY_DEVICE
#define FERRY_INLINE inline
#endif

// True while compiling device code (the nvcc pass for a GPU architecture).
#if defined(__CUDA_ARCH__)
#define FERRY_DEVICE_CODE 1
#else
#define FERRY_DEVICE_CODE 0
#endif
