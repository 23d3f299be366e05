#include "comm/sized_partners.hpp"

#include "ferry/errors.hpp"

namespace ferry {

SizedPartners::SizedPartners(std::unique_ptr<Partners> small, std::unique_ptr<Partners> large,
                             std::uint64_t ncclBytes)
    : small_(std::move(small)), large_(std::move(large)), ncclBytes_(ncclBytes) {
  if (!small_ || !large_ || small_->host() != large_->host() || small_->hosts() != large_->hosts())
    throw Error(ErrorCode::InternalError, "SizedPartners: two networks of different partners");
}

void SizedPartners::exchange(const PartnerExchange& exchange, DataType type, ReduceOp op,
                             cudaStream_t stream) {
  carrierOf(exchange.count * sizeOf(type)).exchange(exchange, type, op, stream);
}

void SizedPartners::abort() {
  (void)failed();  // a failure seen before keeps its error
  small_->abort();
  large_->abort();
}

bool SizedPartners::failed() const {
  if (first_.load() >= 0) return true;
  const int seen = small_->failed() ? 0 : large_->failed() ? 1 : -1;
  if (seen < 0) return false;
  int none = -1;
  first_.compare_exchange_strong(none, seen);
  return true;
}

void SizedPartners::throwFailure() const {
  // A partner gone fails both networks; the one seen first names it.
  (void)failed();
  (first_.load() == 1 ? large_ : small_)->throwFailure();
  __builtin_unreachable();  // (throwFailure is [[noreturn]], through a virtual call the compiler cannot see)
}

}  // namespace ferry
