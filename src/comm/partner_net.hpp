#pragma once
// What carries a Comm across hosts' cross-host phase (FERRY_PARTNER_NET; docs/multi-node.md, "The
// cross-host phase on NCCL's network"), decided alike on every rank from every rank's wish, which
// the ranks gather (across_hosts_setup.cpp):
//   - an explicit setting wins over auto; two different explicit settings are an error;
//   - nccl or sized asked for: every rank needs NCCL (those on auto try it in a second round), and
//     one that cannot open it is an error on every rank;
//   - all on auto: NCCL's network only where every rank has InfiniBand or RoCE and NCCL.
#include <string>
#include <vector>

namespace ferry {

struct PartnerNetWish {
  char setting = 'a';  // FERRY_PARTNER_NET's first letter: 'a'uto, 'f'erry, 'n'ccl or 's'ized
  char canNccl = 0;    // this rank opened NCCL (on auto: tried only where it has InfiniBand or RoCE)
};

enum class PartnerNet {
  Ferry,  // ferry's PortChannels on Ethernet connections (HostPartners)
  Nccl,   // NCCL's network (NcclPartners)
  Sized,  // both: small exchanges on NCCL's, large ones on ferry's (SizedPartners)
};

// Whether the ranks on auto must try NCCL before the decision (a second round of wishes).
bool everyRankNeedsNccl(const std::vector<PartnerNetWish>& wishes);

// The network every rank takes. Throws the same Error on every rank where the wishes cannot be
// met (`me`: this rank; `why`: why it cannot open NCCL, if so).
PartnerNet decidePartnerNet(const std::vector<PartnerNetWish>& wishes, int me, const std::string& why);

}  // namespace ferry
