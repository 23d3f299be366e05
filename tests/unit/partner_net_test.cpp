// partner_net (comm/partner_net.hpp): which network carries a Comm across hosts' cross-host phase,
// decided from every rank's FERRY_PARTNER_NET and whether it could open NCCL; the same answer, or
// the same error, on every rank.
#include "comm/partner_net.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/errors.hpp"

namespace ferry {
namespace {

std::vector<PartnerNetWish> wishes(const std::string& settings, const std::string& canNccl) {
  std::vector<PartnerNetWish> w(settings.size());
  for (std::size_t r = 0; r < settings.size(); ++r) w[r] = {settings[r], static_cast<char>(canNccl[r] == '1')};
  return w;
}

// The error every rank gets (its code and text but for the leading "rank R"), or "" when none.
std::string errorOn(const std::vector<PartnerNetWish>& w, int me) {
  try {
    decidePartnerNet(w, me, "no such file");
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return "";
}

constexpr PartnerNet kFerry = PartnerNet::Ferry, kNccl = PartnerNet::Nccl, kSized = PartnerNet::Sized;

TEST(PartnerNet, AllOnAutoTakeNcclOnlyWhereEveryRankCan) {
  EXPECT_EQ(decidePartnerNet(wishes("aaaa", "1111"), 0, ""), kNccl);
  EXPECT_EQ(decidePartnerNet(wishes("aaaa", "1101"), 0, ""), kFerry);  // one host without InfiniBand
  EXPECT_EQ(decidePartnerNet(wishes("aa", "00"), 1, ""), kFerry);
  EXPECT_FALSE(everyRankNeedsNccl(wishes("aaaa", "1101")));
}

TEST(PartnerNet, AnExplicitSettingWinsOverAuto) {
  EXPECT_EQ(decidePartnerNet(wishes("afaa", "1111"), 2, ""), kFerry);
  EXPECT_TRUE(everyRankNeedsNccl(wishes("anaa", "0100")));  // the others try NCCL first
  EXPECT_EQ(decidePartnerNet(wishes("anaa", "1111"), 3, ""), kNccl);
  EXPECT_TRUE(everyRankNeedsNccl(wishes("aasa", "0010")));
  EXPECT_EQ(decidePartnerNet(wishes("sasa", "1111"), 1, ""), kSized);
}

TEST(PartnerNet, FerryAndNcclBothAskedForIsAnErrorOnEveryRank) {
  const auto w = wishes("fnaa", "0111");
  EXPECT_FALSE(everyRankNeedsNccl(w));
  for (int me = 0; me < 4; ++me) {
    const std::string what = errorOn(w, me);
    EXPECT_NE(what.find("rank 0 set FERRY_PARTNER_NET=ferry and rank 1 nccl"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(me) + ":"), std::string::npos) << what;
  }
}

TEST(PartnerNet, SizedBesideAnotherExplicitSettingIsAnErrorOnEveryRank) {
  EXPECT_FALSE(everyRankNeedsNccl(wishes("asaf", "1111")));
  for (const char* w : {"asaf", "nsaa"})
    for (int me = 0; me < 4; ++me) {
      const std::string what = errorOn(wishes(w, "1111"), me);
      EXPECT_NE(what.find("give every rank the same"), std::string::npos) << w << ": " << what;
      EXPECT_NE(what.find(std::string(w)[0] == 'a' ? "rank 1 set FERRY_PARTNER_NET=sized and rank 3 ferry"
                                                   : "rank 0 set FERRY_PARTNER_NET=nccl and rank 1 sized"),
                std::string::npos)
          << w << ": " << what;
    }
}

TEST(PartnerNet, SizedWhereARankCannotOpenNcclIsAnErrorOnEveryRank) {
  const auto w = wishes("asaa", "1110");
  for (int me = 0; me < 4; ++me) {
    const std::string what = errorOn(w, me);
    EXPECT_NE(what.find("rank 1 set FERRY_PARTNER_NET=sized and rank 3 cannot open NVIDIA's NCCL"),
              std::string::npos)
        << what;
  }
}

TEST(PartnerNet, NcclAskedForWhereARankCannotOpenItIsAnErrorOnEveryRank) {
  const auto w = wishes("nnan", "1101");
  for (int me = 0; me < 4; ++me) {
    const std::string what = errorOn(w, me);
    EXPECT_NE(what.find("rank 2 cannot open NVIDIA's NCCL"), std::string::npos) << what;
    // The rank that cannot says why; the others point at it.
    EXPECT_NE(what.find(me == 2 ? "no such file" : "it says why"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ferry
