#pragma once
// PinnedStaging: two page-locked host buffers, each with an event, for moving device memory through
// a socket in chunks with the GPU copy of one chunk overlapping the socket transfer of the other
// (EthernetConnection). Page-locked, so that the copies are real asynchronous DMA; two, so that
// the copy engine fills (or drains) one while the host sends (or receives) the other.
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>

namespace ferry {

class PinnedStaging {
 public:
  // @pre the current device is the one whose streams will copy through these buffers.
  explicit PinnedStaging(std::size_t bytesEach);
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  std::size_t bytesEach() const noexcept { return bytes_; }
  std::byte* buffer(int i) const noexcept { return buffers_[static_cast<std::size_t>(i)]; }
  // Marks the end of what `stream` has queued so far that touches buffer i.
  void recordAfter(int i, cudaStream_t stream);
  // Waits until the work marked for buffer i has finished (at once if none was marked).
  void waitFor(int i);

 private:
  void release() noexcept;

  std::size_t bytes_;
  std::array<std::byte*, 2> buffers_{};
  std::array<cudaEvent_t, 2> events_{};
  std::array<bool, 2> marked_{};
};

}  // namespace ferry
