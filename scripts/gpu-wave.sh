#!/usr/bin/env bash
# The run that measures a wave of work on the lent machine's GPUs (every local GPU, one process per
# GPU), in parts that each fit one device call of 10 minutes on 4 GPUs; run them in this order, in
# calls that follow each other, so that the machine stays warm and `torch` and `python` find the
# build `tests` made. Logs and tables go to ${OUT:-build-gpu/wave}. Carry .gpu-bin
# (scripts/gpu-bundle.sh pack, here) and .deps (scripts/prepare-device-deps.sh); without .gpu-bin,
# `tests` builds and packs the bundle there first (about 3 minutes on 64 cores).
#
#   scripts/gpu-wave.sh tests   # every GPU test program of the bundle, in two lanes (the programs across
#                               # hosts and the plans on proxy ports beside the rest: on 4 H200 about
#                               # 7 and 6 minutes, where the times add up to 13), without gpu_memory_leak
#                               # (2.5 minutes; it measures the GPUs' free memory, which the programs
#                               # beside it move: run it alone; GPU_WAVE_LEAK=1 keeps it; GPU_WAVE_EXCLUDE and
#                               # GPU_WAVE_BESIDE: other regexes for the two); meanwhile, with a
#                               # third of the cores, the Python extensions and the NCCL shim build
#                               # into build-gpu
#   scripts/gpu-wave.sh torch   # torch.distributed on ferry beside the NCCL backend (ferry.torch.bench),
#                               # the fused ops beside the unfused composition and PyTorch's
#                               # (ferry.torch.fused_bench), the NCCL shim under torch
#   scripts/gpu-wave.sh python  # the Python tests (DDP/FSDP2 included; about 9 minutes on 4 H200)
#                               # (torch and python: scripts/gpu-check.sh's steps, which build first
#                               # whatever build-gpu lacks)
#   scripts/gpu-wave.sh bench   # ferry-bench all, 1 KiB-1 GiB, out of place, NCCL's three variants beside
#   scripts/gpu-wave.sh plans   # each shipped plan beside the native algorithm of its shape
#
# Every GPU program runs under the multicast guard with NVLink multicast off (architecture.md rule 1):
# gpu-bundle.sh and gpu-check.sh see to it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

out=${OUT:-build-gpu/wave}
mkdir -p "$out" && out=$(cd "$out" && pwd)
python_targets="_ferry _torch ferry_nccl"

# Without a carried bundle, builds everything here first (all cores, into build-gpu, which the torch
# and python parts then find) and packs the bundle from that build (scripts/gpu-bundle.sh).
selfBuiltBundle() {
  [[ ! -f .gpu-bin/bundle.tar.xz ]] || return 0
  echo "gpu-wave.sh: no bundle carried; building it here"
  GPU_CHECK_STEPS="configure build" OUT="$out/build" scripts/gpu-check.sh >"$out/build.log" 2>&1 &&
    ctest --test-dir build-gpu -L unit -R '^plan_compile' -j "$(nproc)" >>"$out/build.log" 2>&1 &&
    GPU_BUNDLE_FAST=1 scripts/gpu-bundle.sh pack build-gpu >>"$out/build.log" 2>&1 ||
    { echo "gpu-wave.sh: the build failed:"; tail -n 30 "$out/build.log"; return 1; }
  echo "gpu-wave.sh: built and packed in $SECONDS s"
}

part_tests() {
  selfBuiltBundle || return 1
  GPU_CHECK_STEPS="configure build" GPU_CHECK_TARGETS=$python_targets GPU_CHECK_JOBS=$(($(nproc) / 3 + 1)) \
    OUT="$out/build" scripts/gpu-check.sh >>"$out/build.log" 2>&1 &
  local build=$! exclude=${GPU_WAVE_EXCLUDE:-'^gpu_memory_leak$'} rc=0
  [[ ${GPU_WAVE_LEAK:-0} != 1 ]] || exclude=
  local beside=${GPU_WAVE_BESIDE:-'^gpu_comm_across_hosts$|^gpu_collectives_plans_ports_on_proxy$'}
  GPU_TESTS_EXCLUDE=$exclude GPU_TESTS_BESIDE=$beside OUT="$out/tests" scripts/gpu-bundle.sh tests || rc=1
  wait "$build" || { echo "the build for the torch and python parts failed:"; tail -n 30 "$out/build.log"; rc=1; }
  return $rc
}

part_torch() {
  GPU_CHECK_STEPS="configure build guard_selftest torch_bench fused_bench nccl_torch" \
    GPU_CHECK_TARGETS=$python_targets GPU_CHECK_FUSED_BENCH_ARGS=${GPU_WAVE_FUSED_ARGS:--m 256,2048,16384} \
    OUT="$out/torch" scripts/gpu-check.sh
}

part_python() {
  GPU_CHECK_STEPS="configure build guard_selftest python" GPU_CHECK_TARGETS=$python_targets OUT="$out/python" \
    scripts/gpu-check.sh
}

part_bench() {
  GPU_TABLES_BENCH_ARGS=--no-in-place OUT="$out/bench" scripts/gpu-bundle.sh tables bench
}

part_plans() {
  OUT="$out/plans" scripts/gpu-bundle.sh tables plans
}

case ${1:-} in
  tests | torch | python | bench | plans) "part_$1" ;;
  *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
