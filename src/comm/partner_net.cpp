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

const char* settingName(char setting) {
  switch (setting) {
    case 'f': return "ferry";
    case 'n': return "nccl";
    case 's': return "sized";
    default: return "auto";
  }
}

}  // namespace

bool everyRankNeedsNccl(const std::vector<PartnerNetWish>& wishes) {
  return (firstAsking(wishes, 'n') >= 0 || firstAsking(wishes, 's') >= 0) && firstAsking(wishes, 'f') < 0;
}

PartnerNet decidePartnerNet(const std::vector<PartnerNetWish>& wishes, int me, const std::string& why) {
  const std::string who = "rank " + std::to_string(me) + ": Comm across hosts: ";
  // The first rank with an explicit setting, and the first that asks for another one.
  int first = -1, other = -1;
  for (std::size_t r = 0; r < wishes.size() && other < 0; ++r) {
    if (wishes[r].setting == 'a') continue;
    if (first < 0)
      first = static_cast<int>(r);
    else if (wishes[r].setting != wishes[static_cast<std::size_t>(first)].setting)
      other = static_cast<int>(r);
  }
  if (other >= 0)
    throw Error(ErrorCode::InvalidUsage, who + "rank " + std::to_string(first) + " set FERRY_PARTNER_NET=" +
                                             settingName(wishes[static_cast<std::size_t>(first)].setting) +
                                             " and rank " + std::to_string(other) + " " +
                                             settingName(wishes[static_cast<std::size_t>(other)].setting) +
                                             "; give every rank the same");
  const char asked = first < 0 ? 'a' : wishes[static_cast<std::size_t>(first)].setting;
  int cannot = -1;
  for (std::size_t r = 0; r < wishes.size() && cannot < 0; ++r)
    if (wishes[r].canNccl == 0) cannot = static_cast<int>(r);
  if ((asked == 'n' || asked == 's') && cannot >= 0)
    throw Error(ErrorCode::NotSupported,
                who + "rank " + std::to_string(first) + " set FERRY_PARTNER_NET=" + settingName(asked) +
                    " and rank " + std::to_string(cannot) + " cannot open NVIDIA's NCCL (" +
                    (cannot == me ? why : std::string("it says why")) +
                    "); set FERRY_NCCL_FALLBACK on every rank, or FERRY_PARTNER_NET=ferry");
  switch (asked) {
    case 'n': return PartnerNet::Nccl;
    case 's': return PartnerNet::Sized;
    case 'f': return PartnerNet::Ferry;
    default: return cannot < 0 ? PartnerNet::Nccl : PartnerNet::Ferry;
  }
}

}  // namespace ferry
