#!/usr/bin/env bash
# How the pipelined fused ops should move their chunks (docs/fused.md, "Next"): the copy engines
# (the bench's `pipelined` column) against SM stores on a few thread blocks beside the matmul
# (`pipe sm`, FERRY_FUSED_COPY_BLOCKS), for several block counts, on the local GPUs in one device
# call. Builds the Python extensions first where build-gpu lacks them (about 4 minutes on 32
# cores), then runs python -m ferry.torch.fused_bench once per block count; the tables and logs go
# to $OUT (default build-fused-copies), one folder each. Mind the 10 minutes of one device call:
# the default FUSED_ARGS (6 bf16 shapes a model) take about 20 s a run on 2 H100 (the full
# default bench did, with fp8 and M = 256 and 1024 too), the build about 4 minutes on a fresh machine.
#   scripts/experiments/fused-copies.sh [BLOCKS...]   # default: 16 32 64
#   FUSED_ARGS="-m 2048,16384 --dtypes bf16" scripts/experiments/fused-copies.sh 24 48
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-build-fused-copies}
mkdir -p "$out" && out=$(cd "$out" && pwd)
counts=("$@")
((${#counts[@]})) || counts=(16 32 64)
read -ra args <<<"${FUSED_ARGS:--m 2048,4096,16384 --dtypes bf16}"

# gpu-check.sh's fused_bench step once per block count: it builds what build-gpu lacks (the first
# time only) and runs the bench under the multicast guard with NVLink multicast off, as every GPU
# program here (docs/architecture.md, rule 1).
rc=0
for blocks in "${counts[@]}"; do
  echo "== --sm-blocks $blocks"
  GPU_CHECK_STEPS="configure build guard_selftest fused_bench" GPU_CHECK_TARGETS="_ferry _torch" \
    GPU_CHECK_FUSED_BENCH_ARGS="--sm-blocks $blocks ${args[*]}" OUT="$out/sm$blocks" scripts/gpu-check.sh \
    >"$out/sm$blocks.log" 2>&1 || rc=1
  cat "$out/sm$blocks/fused_bench_table.txt" 2>/dev/null || tail -n 20 "$out/sm$blocks.log"
done
exit $rc
