#!/usr/bin/env bash
# Where a plan's small call spends its time, beside the native algorithm of its shape (issue 24's
# plans table: 15-17 us a call at 1 KiB on 4 H200 where the native kernels take 4-8 us). One device
# call on the bundle (scripts/gpu-bundle.sh pack, carry .gpu-bin; or the one `scripts/gpu-wave.sh
# tests` packed there in an earlier call on the same machine): each plan below and its native,
# 1 KiB-64 KiB, with the phase stamps (FERRY_PHASE_STAMPS=1: the launch gap, the start, the data,
# the end; docs/architecture.md, "Latency"), once as the plan is written (FERRY_PLAN_FUSE=0) and
# once fused. Rank 0's medians are printed; every run's output is in $OUT (default build-plan-latency).
#   scripts/experiments/plan-latency.sh [PLAN...]   # default: the packet allreduce, allgather_allpairs,
#                                                   # allreduce_two_shot
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-build-plan-latency}
mkdir -p "$out" && out=$(cd "$out" && pwd)
plans=("$@")
((${#plans[@]})) || plans=(allreduce_allpairs_packets allgather_allpairs allreduce_two_shot)
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
ranks=()
((n >= 2)) || { n=2; ranks=(-g 2); }  # (2 ranks share one GPU: the stamps then time nothing real)

nativeOf() {  # the native algorithm gpu-tables.sh compares a plan with
  case $1 in
    allreduce_allpairs_packets) echo allreduce allreduce_ll ;;
    allreduce_two_shot | allreduce_hierarchical) echo allreduce allreduce_direct ;;
    allgather_allpairs | allgather_hierarchical) echo allgather allgather_direct ;;
    reducescatter_*) echo reducescatter reducescatter_direct ;;
    alltoall_*) echo alltoall alltoall_direct ;;
    *) echo "plan-latency.sh: no native algorithm known for $1" >&2; return 1 ;;
  esac
}

stampsOfRank0() { awk '/phase stamps of rank 0/ {on = 1} on && /phase stamps of rank [1-9]/ {on = 0} on' "$1"; }

for plan in "${plans[@]}"; do
  read -r coll native < <(nativeOf "$plan") || continue
  PYTHONPATH=$PWD/python python3 -m ferry.dsl compile --ranks "$n" -o "$out/$plan.json" \
    "python/ferry/programs/$plan.py" || continue
  common=("$coll" "${ranks[@]}" -b 1K -e 64K -f 4 --no-in-place --no-nccl -R 1)
  for fuse in 0 1; do
    FERRY_PHASE_STAMPS=1 FERRY_PLAN_FUSE=$fuse FERRY_PLAN_DIR=$out/$plan.json timeout 120 \
      scripts/gpu-bundle.sh run ./ferry-bench "${common[@]}" --algo "plan:$plan" >"$out/${plan}_fuse$fuse.txt" 2>&1
    echo "== plan:$plan, FERRY_PLAN_FUSE=$fuse (rc $?)"
    stampsOfRank0 "$out/${plan}_fuse$fuse.txt"
  done
  FERRY_PHASE_STAMPS=1 timeout 120 scripts/gpu-bundle.sh run ./ferry-bench "${common[@]}" --algo "$native" \
    >"$out/${plan}_native.txt" 2>&1
  echo "== $native (rc $?)"
  stampsOfRank0 "$out/${plan}_native.txt"
done
