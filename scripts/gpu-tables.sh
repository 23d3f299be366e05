#!/usr/bin/env bash
# The measurements the open issues report, on the lent GPU machine (every local GPU), each part a
# Markdown table (scripts/bench-tables.py) plus the JSON it came from, in ${OUT:-build-gpu/tables}.
# Builds first (scripts/gpu-check.sh's configure, build and guard steps) when build-gpu lacks the
# tools. Every GPU program runs with libferry_guard.so preloaded and NVLink multicast off.
#
#   scripts/gpu-tables.sh                       # every part, in this order:
#   scripts/gpu-tables.sh perf                  # ferry-perf: channel round trips, FIFO, put bandwidth
#   scripts/gpu-tables.sh bench                 # ferry-bench all, 1 KiB-1 GiB, beside NCCL
#   scripts/gpu-tables.sh bench-registered      # the same on registered buffers (zero-copy)
#   scripts/gpu-tables.sh plans                 # each shipped plan beside the native algorithm of its shape
#                                               # (GPU_TABLES_PLANS=REGEX: the plans it matches)
#   scripts/gpu-tables.sh nccl-api              # ferry through libferry_nccl.so beside native ferry and NCCL
#   scripts/gpu-tables.sh tune                  # ferry-bench --tune on registered buffers: tuning.json
#   scripts/gpu-tables.sh candidates            # algorithms without default rows beside the default
#                                               # choice and NCCL (GPU_TABLES_CANDIDATES, below)
#
# One part fits in a device call of 10 minutes on 4 GPUs; give several parts to one call only when
# they fit together. Sizes: GPU_TABLES_MAX (default 1G); more ferry-bench options for the bench
# parts: GPU_TABLES_BENCH_ARGS (e.g. --no-in-place, which halves their time). With one GPU the
# collectives run 2 ranks on it: every result is checked, no time means anything, and NCCL is not
# run. GPU_TABLES_BIN=DIR takes the programs from DIR, flat, and builds nothing: `scripts/gpu-bundle.sh
# tables PART...` sets it to the bundle built on the CPU machine, so the call spends no time compiling.
# shellcheck disable=SC2317,SC2054  # parts are called through "part_$part"; sizes are comma lists
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset FERRY_ENABLE_NVLS

build="build-gpu"
out=${OUT:-$build/tables}
mkdir -p "$out" && out=$(cd "$out" && pwd)
max=${GPU_TABLES_MAX:-1G}
bench=$PWD/$build/tools/ferry-bench/ferry-bench
perf=$PWD/$build/tools/ferry-perf/ferry-perf
shim=$PWD/$build/shims/nccl/libferry_nccl.so
guard=$PWD/$build/tools/guard/libferry_guard.so
if [[ -n ${GPU_TABLES_BIN:-} ]]; then
  bench=$GPU_TABLES_BIN/ferry-bench perf=$GPU_TABLES_BIN/ferry-perf
  shim=$GPU_TABLES_BIN/libferry_nccl.so guard=$GPU_TABLES_BIN/libferry_guard.so
fi
tables=$PWD/scripts/bench-tables.py
read -ra bench_args <<<"${GPU_TABLES_BENCH_ARGS:-}"

guarded() { LD_PRELOAD="$guard${LD_PRELOAD:+:$LD_PRELOAD}" "$@"; }

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
ranks=()
((gpus == 1)) && ranks=(-g 2)

if [[ -n ${GPU_TABLES_BIN:-} && ! (-x $bench && -x $perf && -f $shim && -f $guard) ]]; then
  echo "gpu-tables.sh: $GPU_TABLES_BIN lacks ferry-bench, ferry-perf, libferry_nccl.so or libferry_guard.so" >&2
  exit 1
elif [[ ! -x $bench || ! -x $perf || ! -f $shim || ! -f $guard ]]; then
  GPU_CHECK_STEPS="configure build guard_selftest" OUT="$out/build" scripts/gpu-check.sh | tail -n 8 || exit 1
fi

part_perf() {
  local args=()
  ((gpus == 1)) && args=(-g 2 -s 1M,8M -n 1000)
  guarded "$perf" "${args[@]}" --json "$out/perf.json" | tee "$out/perf.md"
}

part_bench() {
  guarded "$bench" all "${ranks[@]}" "${bench_args[@]}" -b 1K -e "$max" -f 4 --json "$out/bench.json" >"$out/bench.txt" &&
    python3 "$tables" summary "$out/bench.json" | tee "$out/bench.md"
}

part_bench-registered() {
  guarded "$bench" all "${ranks[@]}" "${bench_args[@]}" -R 1 -b 1K -e "$max" -f 4 --json "$out/bench_registered.json" \
    >"$out/bench_registered.txt" && python3 "$tables" summary "$out/bench_registered.json" | tee "$out/bench_registered.md"
}

# plan name, collective, the native algorithm of the same shape, the largest size the plan takes.
plan_pairs=(
  "allreduce_allpairs_packets allreduce allreduce_ll 256K"
  "allreduce_two_shot allreduce allreduce_direct $max"
  "allreduce_ring allreduce allreduce_ring $max"
  "allgather_allpairs allgather allgather_direct $max"
  "allgather_port allgather allgather_ce $max"
  "reducescatter_allpairs reducescatter reducescatter_direct $max"
  "alltoall_allpairs alltoall alltoall_direct $max"
  "allreduce_hierarchical allreduce allreduce_direct $max"
  "allgather_hierarchical allgather allgather_direct $max"
  "reducescatter_hierarchical reducescatter reducescatter_direct $max"
  "alltoall_hierarchical alltoall alltoall_direct $max"
  "broadcast_hierarchical broadcast broadcast_direct $max"
)

part_plans() {
  local n=$(( gpus == 1 ? 2 : gpus )) dir="$out/plans" rc=0
  mkdir -p "$dir"
  : >"$out/plans.md"
  for pair in "${plan_pairs[@]}"; do
    read -r plan coll native top <<<"$pair"
    [[ $plan =~ ${GPU_TABLES_PLANS:-.} ]] || continue
    PYTHONPATH=$PWD/python python3 -m ferry.dsl compile --ranks "$n" -o "$dir/$plan.json" \
      "python/ferry/programs/$plan.py" || { rc=1; continue; }
    local common=("$coll" "${ranks[@]}" -R 1 --no-in-place --no-nccl -b 1K -e "$top" -f 4)
    # A plan may share its native's name (allreduce_ring): their results go to files of their own.
    local mine="$dir/plan_$plan" theirs="$dir/native_$native"
    if FERRY_PLAN_DIR=$dir/$plan.json guarded "$bench" "${common[@]}" --algo "plan:$plan" \
      --json "$mine.bench.json" >"$mine.txt" 2>&1 &&
      guarded "$bench" "${common[@]}" --algo "$native" --json "$theirs.bench.json" >"$theirs.txt" 2>&1; then
      python3 "$tables" pair "$mine.bench.json" "$theirs.bench.json" | tee -a "$out/plans.md" || rc=1
    else
      echo "plan $plan or native $native failed; the end of their output:" | tee -a "$out/plans.md"
      tail -n 5 "$mine.txt" "$theirs.txt" 2>/dev/null | tee -a "$out/plans.md"
      rc=1
    fi
  done
  return "$rc"
}

part_nccl-api() {
  # The shim stands where ferry-bench loads NCCL: its "NCCL" column is ferry through the NCCL API.
  guarded "$bench" all "${ranks[@]}" "${bench_args[@]}" -b 1K -e "$max" -f 4 --no-in-place --nccl "$shim" \
    --json "$out/nccl_api.json" >"$out/nccl_api.txt" || return 1
  [[ -f $out/bench.json ]] || part_bench >/dev/null || return 1
  python3 "$tables" api "$out/nccl_api.json" "$out/bench.json" | tee "$out/nccl_api.md"
}

# Algorithms not yet picked by default, each forced beside what the table picks and NCCL, from
# 1 MiB: "collective:algorithm" words. (Their GPU tests ran first: gpu_collectives covers every
# registered algorithm.) The send/recv groups have default rows for 2 ranks only, where they beat the
# push kernels; the chain pipelines were candidates until 4 H200 gave them rows (tuning.cpp).
candidates=${GPU_TABLES_CANDIDATES:-allgather:allgather_p2p alltoall:alltoall_p2p}

part_candidates() {
  local pair coll algo rc=0 dir="$out/candidates"
  mkdir -p "$dir"
  : >"$out/candidates.md"
  for pair in $candidates; do
    coll=${pair%%:*} algo=${pair#*:}
    # NCCL runs once, beside the default; the forced run's column is compared with it (on 4 GPUs a
    # run of NCCL's three variants from 1 MiB to 1 GiB takes about a minute).
    local default="$dir/${coll}_default" forced="$dir/${coll}_$algo"
    if guarded "$bench" "$coll" "${ranks[@]}" "${bench_args[@]}" --no-in-place -b 1M -e "$max" -f 4 \
      --json "$default.json" >"$default.txt" 2>&1 &&
      guarded "$bench" "$coll" "${ranks[@]}" "${bench_args[@]}" --algo "$algo" --no-nccl --no-in-place -b 1M \
        -e "$max" -f 4 --json "$forced.json" >"$forced.txt" 2>&1; then
      { echo "#### $coll: $algo beside the default choice"
        python3 "$tables" compare "default=$default.json" "$algo=$forced.json"
        python3 "$tables" summary "$default.json" | grep -o '| [0-9.]* [KMG]iB |.*| [a-z_0-9:]* |$' |
          awk -F'|' '{printf "%s%s:%s", NR == 1 ? "the default choice by size:" : ",", $2, $12} END {print ""}'
      } | tee -a "$out/candidates.md"
    else
      echo "$coll $algo or the default failed; the end of their output:" | tee -a "$out/candidates.md"
      tail -n 5 "$default.txt" "$forced.txt" 2>/dev/null | tee -a "$out/candidates.md"
      rc=1
    fi
  done
  return "$rc"
}

part_tune() {
  guarded "$bench" all "${ranks[@]}" "${bench_args[@]}" -R 1 -b 1K -e "$max" -f 4 --no-in-place --no-nccl --tune "$out/tuning.json" \
    >"$out/tune.txt" && cat "$out/tuning.json"
}

parts=("$@")
((${#parts[@]})) || parts=(perf bench bench-registered plans nccl-api tune)
status=0
for part in "${parts[@]}"; do
  if ! declare -F "part_$part" >/dev/null; then
    echo "gpu-tables.sh: unknown part '$part'" >&2
    exit 2
  fi
  echo "==> $part"
  start=$SECONDS
  if "part_$part"; then echo "<== $part: ok in $((SECONDS - start)) s"; else echo "<== $part: FAILED"; status=1; fi
done
echo "tables and JSON in $out"
exit $status
