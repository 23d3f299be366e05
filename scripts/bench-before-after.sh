#!/usr/bin/env bash
# Times ferry-bench of an earlier revision and of this tree on the same GPUs, one after the other
# per collective, so a change can be shown to cost nothing. Run on a GPU machine from the repo root.
# The earlier revision's sources come as a folder (the GPU machine has no git history): make it here
# with `git archive REV | tar -x -C .before` (.before is git-ignored) and carry it.
#
#   scripts/bench-before-after.sh [BEFORE_DIR] [ferry-bench collectives...]
#   BENCH_ARGS="-b 1K -e 1G -f 4" scripts/bench-before-after.sh .before allreduce allgather
#   AB_VARIANTS="no_pdl:FERRY_LAUNCH_PDL=0" scripts/bench-before-after.sh .before all
#       # also runs this tree with each NAME:VAR=VAL[,VAR=VAL...] setting, as run NAME
#   AB_STAMPS="allreduce -b 1K -e 64K -f 4" scripts/bench-before-after.sh .before all
#       # also runs these ferry-bench arguments with FERRY_PHASE_STAMPS=1 on both trees (no NCCL):
#       # the phase medians go to stamps_before.txt and stamps_after.txt
#   AB_PERF="-s 64M,256M" scripts/bench-before-after.sh .before all
#       # also runs ferry-perf with these arguments on both trees: perf_before.txt, perf_after.txt
# Tables go to ${OUT:-build-ab}/before_<coll>.txt and after_<coll>.txt, JSON beside them, and
# compare_<coll>.md puts every run beside the fastest NCCL of them all (scripts/bench-tables.py).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # rule 1: no multicast, NCCL included
unset FERRY_ENABLE_NVLS
before=${1:-.before}
shift || true
collectives=("$@")
((${#collectives[@]})) || collectives=(all)
read -ra bench_args <<<"${BENCH_ARGS:--b 1K -e 1G -f 4}"
out=${OUT:-build-ab}
mkdir -p "$out" build-ab
jobs=$(nproc)

configure_and_build() {  # SOURCE BUILD
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF \
    -DFERRY_THIRD_PARTY_DIR="$PWD/.deps" >"$2.configure.log" 2>&1 &&
    cmake --build "$2" --parallel "$((jobs / 2))" --target ferry-bench ferry_guard \
      ${AB_PERF:+ferry-perf} >"$2.build.log" 2>&1
}
configure_and_build "$before" build-ab/before & pb=$!
configure_and_build . build-ab/after & pa=$!
wait $pb || { echo "before: build failed"; tail -20 build-ab/before.build.log; exit 1; }
wait $pa || { echo "after: build failed"; tail -20 build-ab/after.build.log; exit 1; }
echo "built both in $SECONDS s"
[[ -n ${AB_BUILD_ONLY:-} ]] && exit 0  # AB_BUILD_ONLY=1: build now (beside other work), time in a later run

read -ra variants <<<"${AB_VARIANTS:-}"
bench() {  # SIDE NAME COLLECTIVE [VAR=VAL...]: one run of ferry-bench, as run NAME
  local side=$1 name=$2 c=$3
  shift 3
  echo "== $name: ferry-bench $c ${bench_args[*]} $*"
  env "$@" LD_PRELOAD="$PWD/build-ab/$side/tools/guard/libferry_guard.so" \
    "build-ab/$side/tools/ferry-bench/ferry-bench" "$c" "${bench_args[@]}" --json "$out/${name}_$c.json" \
    >"$out/${name}_$c.txt" 2>&1
  echo "rc=$?"
}
for c in "${collectives[@]}"; do
  runs=()
  for side in before after; do
    bench "$side" "$side" "$c"
    [[ -s $out/${side}_$c.json ]] && runs+=("$side=$out/${side}_$c.json")
  done
  for v in "${variants[@]}"; do
    IFS=, read -ra settings <<<"${v#*:}"
    bench after "${v%%:*}" "$c" "${settings[@]}"
    [[ -s $out/${v%%:*}_$c.json ]] && runs+=("${v%%:*}=$out/${v%%:*}_$c.json")
  done
  ((${#runs[@]})) && python3 scripts/bench-tables.py compare "${runs[@]}" >"$out/compare_$c.md" &&
    cat "$out/compare_$c.md"
done
if [[ -n ${AB_STAMPS:-} ]]; then
  read -ra stamp_args <<<"$AB_STAMPS"
  for side in before after; do
    FERRY_PHASE_STAMPS=1 LD_PRELOAD="$PWD/build-ab/$side/tools/guard/libferry_guard.so" \
      "build-ab/$side/tools/ferry-bench/ferry-bench" "${stamp_args[@]}" --no-nccl 2>&1 |
      grep -A 40 '^ferry: phase stamps' >"$out/stamps_$side.txt"
    echo "== phase stamps, $side:" && cat "$out/stamps_$side.txt"
  done
fi
if [[ -n ${AB_PERF:-} ]]; then
  read -ra perf_args <<<"$AB_PERF"
  for side in before after; do
    LD_PRELOAD="$PWD/build-ab/$side/tools/guard/libferry_guard.so" \
      "build-ab/$side/tools/ferry-perf/ferry-perf" "${perf_args[@]}" >"$out/perf_$side.txt" 2>&1
    echo "== ferry-perf, $side (rc=$?):" && cat "$out/perf_$side.txt"
  done
fi
