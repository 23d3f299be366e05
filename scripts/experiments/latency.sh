#!/usr/bin/env bash
# Issue 23's small-call latency, in one device call on the bundle (scripts/gpu-bundle.sh pack, carry
# .gpu-bin): every collective from 1 KiB to 1 MiB beside the three NCCL variants, the same without
# programmatic dependent launch (FERRY_LAUNCH_PDL=0; on by default), the phase stamps of both (where
# a call's time goes: docs/architecture.md, "Latency"), each variant library in .gpu-bin/variants.tar.xz if any
# (scripts/gpu-bundle.sh variant NAME), and ferry-perf's round trips. Tables in $OUT (default
# build-latency). Times nothing real on one GPU.
#   scripts/experiments/latency.sh [ferry-bench args]   # default: all -b 1K -e 1M -f 4 --no-in-place
#   LATENCY_TESTS=REGEX scripts/experiments/latency.sh  # also the GPU tests REGEX names
#   LATENCY_TESTS=REGEX LATENCY_TESTS_PDL=0 ...         # ... with FERRY_LAUNCH_PDL=0
#   LATENCY_TESTS=REGEX LATENCY_TESTS_WITH=NAME ...     # ... on variant NAME's library
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-build-latency}
mkdir -p "$out"
args=("$@")
((${#args[@]})) || args=(all -b 1K -e 1M -f 4 --no-in-place)
bundle=scripts/gpu-bundle.sh
stamp_args=("${args[0]}" -b 1K -e 64K -f 4 --no-in-place --no-nccl -c 0)

run() {  # NAME [VAR=VAL...] -- CMD...: stdout and stderr to $out/NAME.txt, the table's tail shown
  local name=$1
  shift
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  echo "== $name: ${vars[*]} $*"
  env "${vars[@]}" "$@" >"$out/$name.txt" 2>&1
  echo "   rc $? (at $SECONDS s)"
}

run base -- "$bundle" run ./ferry-bench "${args[@]}"
run no_pdl FERRY_LAUNCH_PDL=0 -- "$bundle" run ./ferry-bench "${args[@]}" --no-nccl
run stamps FERRY_PHASE_STAMPS=1 -- "$bundle" run ./ferry-bench "${stamp_args[@]}"
run stamps_no_pdl FERRY_PHASE_STAMPS=1 FERRY_LAUNCH_PDL=0 -- "$bundle" run ./ferry-bench "${stamp_args[@]}"
if [[ -f .gpu-bin/variants.tar.xz ]]; then
  for v in $(tar -tJf .gpu-bin/variants.tar.xz | sed 's|^\./||' | awk -F/ 'NF > 1 && $1 != "" {print $1}' | sort -u); do
    run "variant_$v" -- "$bundle" with "$v" ./ferry-bench "${args[@]}" --no-nccl
    run "variant_${v}_no_pdl" FERRY_LAUNCH_PDL=0 -- "$bundle" with "$v" ./ferry-bench "${args[@]}" --no-nccl
    run "stamps_$v" FERRY_PHASE_STAMPS=1 -- "$bundle" with "$v" ./ferry-bench "${stamp_args[@]}"
  done
fi
run perf -- "$bundle" run ./ferry-perf
if [[ -n ${LATENCY_TESTS:-} ]]; then
  tests=(tests "$LATENCY_TESTS")
  [[ -z ${LATENCY_TESTS_WITH:-} ]] || tests=(with "$LATENCY_TESTS_WITH" "${tests[@]}")
  FERRY_LAUNCH_PDL=${LATENCY_TESTS_PDL:-1} OUT=/tmp/latency-tests "$bundle" "${tests[@]}" 2>&1 | tail -40
fi
# The phase medians of rank 0 (every rank prints its own; rank 0's stand for the pair).
for f in "$out"/stamps*.txt; do
  echo "== $(basename "$f" .txt)"
  awk '/phase stamps of rank 0/ {on = 1} on && /phase stamps of rank [1-9]/ {on = 0} on' "$f"
done
# Every run's out-of-place time beside the fastest NCCL, one row per collective and size (ferry-bench's
# columns: $6 the time, $14-$16 NCCL's three variants).
runs=(base no_pdl)
for f in "$out"/variant_*.txt; do [[ -f $f ]] && runs+=("$(basename "$f" .txt)"); done
echo "== out-of-place us: collective size ${runs[*]} bestNCCL"
for r in "${runs[@]}"; do awk -v r="$r" '/^# [a-z]+ / {c = $2} /^ +[0-9]/ {print r, c, $1, $6, (r == "base" ? ($14 < $15 ? ($14 < $16 ? $14 : $16) : ($15 < $16 ? $15 : $16)) : "")}' "$out/$r.txt"; done |
  awk '{k = $2 " " $3; if (!(k in t)) order[++n] = k; t[k] = t[k] " " $4; if ($5 != "") nb[k] = $5}
       END {for (i = 1; i <= n; i++) print order[i] t[order[i]], nb[order[i]]}'
# One archive (a device call brings back at most 8 files).
tar -czf "$out/latency-runs.tar.gz" -C "$out" $(cd "$out" && ls ./*.txt) && rm -f "$out"/*.txt
