// What the kinds of partners share (partners.hpp).
#include "comm/partners.hpp"

namespace ferry {

std::string partnerMismatchText(const std::string& who, int partnerRank, int partnerHost) {
  return who + ": rank " + std::to_string(partnerRank) + " (host " + std::to_string(partnerHost) +
         "), this rank's partner, made another call across hosts than this rank (the collective, count, type, "
         "op or root differ, or the calls come in another order, or the ranks chose other algorithms across "
         "hosts: their setAlgorithm, FERRY_ALGO or FERRY_TUNING_FILE differ); every rank must make the same "
         "calls in the same order. This Comm cannot go on: destroy it on every rank";
}

}  // namespace ferry
