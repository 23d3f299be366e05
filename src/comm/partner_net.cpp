#include "comm/partner_net.hpp"

#include "ferry/errors.hpp"

namespace ferry {
namespace {

// The first rank whose wish has `setting` (-1: none).
int firstAsking(const std::vector<PartnerNetWish>& wishes, char setting) {
  for (std::size_t r = 0; r < wishes.size(); ++r)
    if (wishes[r].setting == setting) return static_cast<int>(r);
  return -1;
}

}  // namespace

bool everyRankNeedsNccl(const std::vector<PartnerNetWish>& wishes) {
  return firstAsking(wishes, 'n') >= 0 && firstAsking(wishes, 'f') < 0;
}

bool onNcclNetwork(const std::vector<PartnerNetWish>& wishes, int me, const std::string& why) {
  const int asksFerry = firstAsking(wishes, 'f'), asksNccl = firstAsking(wishes, 'n');
  int cannot = -1;
  for (std::size_t r = 0; r < wishes.size() && cannot < 0; ++r)
    if (wishes[r].canNccl == 0) cannot = static_cast<int>(r);
  const std::string who = "rank " + std::to_string(me) + ": Comm across hosts: ";
  if (asksFerry >= 0 && asksNccl >= 0)
    throw Error(ErrorCode::InvalidUsage, who + "rank " + std::to_string(asksFerry) +
                                             " set FERRY_PARTNER_NET=ferry and rank " + std::to_string(asksNccl) +
                                             " nccl; give every rank the same");
  if (asksNccl >= 0 && cannot >= 0)
    throw Error(ErrorCode::NotSupported, who + "rank " + std::to_string(asksNccl) +
                                             " set FERRY_PARTNER_NET=nccl and rank " + std::to_string(cannot) +
                                             " cannot open NVIDIA's NCCL (" +
                                             (cannot == me ? why : std::string("it says why")) +
                                             "); set FERRY_NCCL_FALLBACK on every rank, or FERRY_PARTNER_NET=ferry");
  if (asksNccl >= 0) return true;
  if (asksFerry >= 0) return false;
  return cannot < 0;
}

}  // namespace ferry
