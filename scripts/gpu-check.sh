#!/usr/bin/env bash
# The GPU check: run from the repo root on the lent GPU machine. It builds ferry (Release, all cores)
# into build-gpu and runs the GPU steps with libferry_guard.so preloaded, so that any cuMulticast*
# driver call aborts the process (architecture.md rule 1). That machine has no internet and no apt:
# GoogleTest, CLI11 and nlohmann-json come from .deps/ (scripts/prepare-device-deps.sh, run on the
# CPU machine; carry .deps with the tree). Each step's log goes to ${OUT:-build-gpu/out}/<step>.log;
# the last lines are a summary table. Exit status: 0 only if every step passed.
#
#   scripts/gpu-check.sh
#   GPU_CHECK_CMAKE_ARGS="-DFERRY_CUDA_ARCHITECTURES=90a" scripts/gpu-check.sh   # extra configure options
#   GPU_TESTS_EXCLUDE='^gpu_memory_leak$' scripts/gpu-check.sh                    # skip slow tests (regex)
#   GPU_TESTS_JOBS=4 scripts/gpu-check.sh                                          # tests side by side
#   GPU_CHECK_JOBS=24 scripts/gpu-check.sh                # build jobs (default: every core), for a build
#                                                         # that leaves cores to programs running beside it
#   GPU_CHECK_BENCH_ARGS="allreduce -b 1K -e 64M" scripts/gpu-check.sh           # what the bench step runs
#   GPU_CHECK_TORCH_BENCH_ARGS="-b 1K -e 64M" scripts/gpu-check.sh                # what torch_bench runs
#   GPU_CHECK_FUSED_BENCH_ARGS="-m 2048 --models 70b" scripts/gpu-check.sh        # what fused_bench runs
#   GPU_CHECK_PYTESTS="python/tests/test_torch_fused_ops.py" scripts/gpu-check.sh  # the python step's
#                                       # pytest groups (space-separated; then no examples)
#   GPU_CHECK_STEPS="configure build guard_selftest gpu_tests" \
#     GPU_CHECK_TARGETS="ferry_guard gpu_p2p" GPU_TESTS_ONLY='^gpu_p2p$' scripts/gpu-check.sh
#       # a focused run: some steps, some build targets (besides what the guard steps need), some tests
#
# Adding a step: write step_<name> (a function; its exit status is the verdict), add <name> to
# STEPS, and to REQUIRED if later steps cannot run without it. Steps that run ctest count toward the
# test totals in the summary automatically. Run GPU programs through `guarded`.
# shellcheck disable=SC2317  # the step_* functions are called through "step_$step"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# Rule 1, for everything this script starts: NCCL, PyTorch and ferry all keep multicast off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset FERRY_ENABLE_NVLS

STEPS=(configure build guard_selftest ferry_info gpu_tests python python_bench torch_bench fused_bench sanitizer nccl_torch perf bench)
if [[ -n ${GPU_CHECK_STEPS:-} ]]; then read -ra STEPS <<<"$GPU_CHECK_STEPS"; fi
REQUIRED=(configure build guard_selftest)  # nothing touches a GPU unless the guard is proven to work
SHOW=(ferry_info gpu_tests python python_bench torch_bench fused_bench sanitizer nccl_torch)    # steps whose whole log is printed, not only on failure

build="build-gpu"
out=${OUT:-$build/out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
guard=$PWD/$build/tools/guard/libferry_guard.so
ferry_info=$PWD/$build/tools/ferry-info/ferry-info

read -ra extra_cmake_args <<<"${GPU_CHECK_CMAKE_ARGS:-}"

guarded() { LD_PRELOAD="$guard${LD_PRELOAD:+:$LD_PRELOAD}" "$@"; }

step_configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=ON -DFERRY_WARNINGS_AS_ERRORS=ON \
    -DFERRY_THIRD_PARTY_DIR="$PWD/.deps" "${extra_cmake_args[@]}"
}

step_build() {
  local targets=()
  if [[ -n ${GPU_CHECK_TARGETS:-} ]]; then
    read -ra targets <<<"$GPU_CHECK_TARGETS"
    # What guard_selftest runs.
    targets=(--target "${targets[@]}" ferry_guard fakecuda guard_probe guard_probe_linked gpu_guard_driver ferry-info)
  fi
  cmake --build "$build" --parallel "${GPU_CHECK_JOBS:-$(nproc)}" "${targets[@]}"
}

# The guard's own tests (fake driver), then its check against the real driver's lookup paths.
step_guard_selftest() {
  ctest --test-dir "$build" -L unit -R '^guard_' --output-on-failure &&
    ctest --test-dir "$build" -R '^gpu_guard_driver$' --output-on-failure
}

step_ferry_info() {
  guarded "$ferry_info" && guarded "$ferry_info" --json >"$out/ferry-info.json"
}

# Every test labelled gpu (none yet is fine), under the guard.
step_gpu_tests() {
  # The full output of every test (ctest -V) goes to gpu_tests_output.log; the benchmark lines are
  # collected in bench.txt and shown in the summary. With one GPU, the multi-rank tests run their
  # ranks on it together (GPU_TESTS_SHARE_GPUS): protocols are checked, speed is not.
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -eq 1 ]]; then
    echo "one GPU: multi-rank tests share it (GPU_TESTS_SHARE_GPUS=1)"
    export GPU_TESTS_SHARE_GPUS=1
  fi
  # GPU_TESTS_JOBS > 1 runs tests side by side (they then share the GPUs: for correctness runs).
  guarded ctest --test-dir "$build" -L gpu -j "${GPU_TESTS_JOBS:-1}" ${GPU_TESTS_ONLY:+-R "$GPU_TESTS_ONLY"} \
    -E "^gpu_guard_driver\$${GPU_TESTS_EXCLUDE:+|$GPU_TESTS_EXCLUDE}" -V \
    --no-tests=ignore --output-junit "$out/ctest-gpu.xml" >"$out/gpu_tests_output.log" 2>&1
  local rc=$?
  grep -E '(Passed|Failed|\*\*\*|tests passed|out of)' "$out/gpu_tests_output.log"
  grep -hoE '(BENCH|fifo push to proxy pickup).*' "$out/gpu_tests_output.log" >"$out/bench.txt" || true
  return $rc
}

# compute-sanitizer memcheck and racecheck on a 2-GPU test (with one GPU, both sides on it).
step_sanitizer() {
  # Only tests without kernels that wait for each other across GPUs: under the tool kernels do not
  # run concurrently, so a spin-wait for another GPU's kernel never ends.
  local test=$PWD/$build/tests/gpu/gpu_device_primitives filter='--gtest_filter=*PutAndGet*'
  local tool rc=0
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -eq 1 ]]; then
    echo "one GPU: the test's two sides share it (GPU_TESTS_SHARE_GPUS=1)"
    export GPU_TESTS_SHARE_GPUS=1
  fi
  for tool in memcheck racecheck; do
    echo "--- compute-sanitizer --tool $tool"
    guarded compute-sanitizer --tool "$tool" --error-exitcode 99 "$test" "$filter" 2>&1 | tail -n 15
    ((PIPESTATUS[0] == 0)) || rc=1
  done
  return $rc
}

# The Python package from the build tree (<build>/python: the extension beside the sources): its
# tests that need the extension, ferry.Comm on torch tensors on the GPUs (test_gpu_comm.py), the
# torch.distributed backend (test_torch_backend.py), the fused ops (test_torch_fused_ops.py),
# symmetric memory (test_torch_symm.py) and training on the backend (test_torch_training.py);
# a missing extension, torch or GPU is a failure here, not a skip.
step_python() {
  local rc=0 example port=29600 tests
  # One pytest per group, each bounded, so that a hang costs that group and names it.
  local groups=("python/tests/test_native_*.py" python/tests/test_gpu_comm.py python/tests/test_torch_backend.py
    python/tests/test_torch_fused_ops.py python/tests/test_torch_symm.py python/tests/test_torch_training.py)
  [[ -z ${GPU_CHECK_PYTESTS:-} ]] || read -ra groups <<<"$GPU_CHECK_PYTESTS"
  for tests in "${groups[@]}"; do
    # The whole output in $out/pytest_<group>.log (the ranks' lines too: -s), its end here.
    local log="$out/pytest_$(basename "$tests" .py | tr -c 'A-Za-z0-9_\n' _).log"
    echo "== pytest $tests (all of it: $log)"
    # shellcheck disable=SC2086  # the glob is meant to expand
    FERRY_REQUIRE_NATIVE=1 FERRY_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/$build/python" \
      guarded timeout 300 python3 -m pytest -q -s -p no:cacheprovider --durations=5 $tests >"$log" 2>&1 || rc=1
    tail -n 60 "$log"
  done
  # The examples of docs/python.md, as a user runs them (2 ranks; with one GPU they share it).
  [[ -n ${GPU_CHECK_PYTESTS:-} ]] && return $rc  # (a focused run: those groups only)
  for example in builtin_algorithms dsl_plan custom_allreduce; do
    echo "== torchrun python/examples/$example.py"
    PYTHONPATH="$PWD/$build/python" guarded timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 \
      --master-port $((port += 2)) "python/examples/$example.py" 2>&1 | tail -n 20
    ((PIPESTATUS[0] == 0)) || rc=1
  done
  return $rc
}

# What the Python layer costs per call: python -m ferry.bench (ferry.Comm.all_reduce on torch
# tensors, the same call on raw addresses, and from a CUDA graph), then ferry-bench's allreduce
# (float32, the same sizes) with NCCL beside it, in one run on the same GPUs.
step_python_bench() {
  local sizes=(-b 1K -e 64M -f 4)
  PYTHONPATH="$PWD/$build/python" guarded timeout 240 python3 -m ferry.bench "${sizes[@]}" |
    tee "$out/python_bench_table.txt"
  ((PIPESTATUS[0] == 0)) || return 1
  guarded timeout 120 "$PWD/$build/tools/ferry-bench/ferry-bench" allreduce -d float32 "${sizes[@]}"
}

# A torch benchmark of the package in the build tree: MODULE SECONDS TABLE ARGS...; its table goes
# to $out/TABLE. With fewer than 2 GPUs it says there is nothing to compare and passes.
torch_benchmark() {
  local module=$1 seconds=$2 table=$3
  shift 3
  PYTHONPATH="$PWD/$build/python" PYTHONUNBUFFERED=1 guarded timeout "$seconds" python3 -m "$module" "$@" |
    tee "$out/$table"
  return "${PIPESTATUS[0]}"
}

# dist.all_reduce on the ferry backend beside the NCCL backend (eager, registered, graph, host
# time), 1 KiB to 1 GiB.
step_torch_bench() {
  local args
  read -ra args <<<"${GPU_CHECK_TORCH_BENCH_ARGS:--b 1K -e 1G -f 4}"
  torch_benchmark ferry.torch.bench 300 torch_bench_table.txt "${args[@]}"
}

# The fused tensor-parallel ops on the Llama 3 shapes beside the unfused composition on NCCL and
# PyTorch's own fused ops (python -m ferry.torch.fused_bench).
step_fused_bench() {
  local args
  read -ra args <<<"${GPU_CHECK_FUSED_BENCH_ARGS:--m 256,1024,4096,16384}"
  torch_benchmark ferry.torch.fused_bench 500 fused_bench_table.txt "${args[@]}"
}

# torch.distributed (NCCL backend) with libferry_nccl.so preloaded against the real NCCL, on every
# local GPU; skipped (not failed) with fewer than 2 GPUs or without PyTorch.
step_nccl_torch() {
  if ! python3 -c 'import torch' 2>/dev/null; then
    echo "skipped: no PyTorch"
    return 0
  fi
  guarded python3 tests/nccl/torch_preload_test.py --lib "$PWD/$build/shims/nccl/libferry_nccl.so"
  local rc=$?
  ((rc == 77)) && return 0
  return $rc
}

# ferry-perf (the data plane's latencies and bandwidths) on every local GPU, or on 2 ranks sharing
# a lone GPU (which checks the code and times nothing real); the table goes to perf_table.txt.
step_perf() {
  local args=()
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -eq 1 ]]; then args=(-g 2 -s 1M,8M -n 1000); fi
  guarded "$PWD/$build/tools/ferry-perf/ferry-perf" "${args[@]}" --json "$out/perf.json" | tee "$out/perf_table.txt"
  return "${PIPESTATUS[0]}"
}

# ferry-bench on every local GPU, NCCL beside it; the table goes to bench_table.txt (shown in the
# summary) and the rows to bench.json (scripts/plot-bench.py draws them).
step_bench() {
  local args
  read -ra args <<<"${GPU_CHECK_BENCH_ARGS:-all -b 1K -e 1G -f 4}"
  guarded "$PWD/$build/tools/ferry-bench/ferry-bench" "${args[@]}" --json "$out/bench.json" | tee "$out/bench_table.txt"
  return "${PIPESTATUS[0]}"
}

# ---- runner ---------------------------------------------------------------------------------------

contains() {
  local item=$1
  shift
  for x in "$@"; do [[ $x == "$item" ]] && return 0; done
  return 1
}

declare -A status seconds
any_failed=0
stop=0
for step in "${STEPS[@]}"; do
  log=$out/$step.log
  if ((stop)); then
    status[$step]=skipped
    seconds[$step]=0
    continue
  fi
  echo "==> $step"
  start=$(date +%s.%N)
  "step_$step" >"$log" 2>&1
  rc=$?
  seconds[$step]=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if ((rc == 0)); then
    status[$step]=ok
    if contains "$step" "${SHOW[@]}"; then cat "$log"; fi
  else
    status[$step]="FAILED($rc)"
    any_failed=1
    echo "--- last lines of $log:"
    tail -n 40 "$log"
    if contains "$step" "${REQUIRED[@]}"; then stop=1; fi
  fi
  echo "<== $step: ${status[$step]} in ${seconds[$step]} s"
done

# ---- summary --------------------------------------------------------------------------------------

gpus=unknown
if [[ -s $out/ferry-info.json ]]; then
  gpus=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
names = sorted({g["name"] for g in r["gpus"]})
print(r["gpu_count"], "(" + ", ".join(names) + ")" if names else "(" + r["gpu_status"] + ")")' \
    "$out/ferry-info.json" 2>/dev/null || echo unknown)
fi

# ctest ends with "NN% tests passed, F tests failed out of T" (newer ctest leaves out ", 0 tests
# failed"); add up every step that ran tests.
passed=0
failed=0
for step in "${STEPS[@]}"; do
  [[ -f $out/$step.log && ${status[$step]} != skipped ]] || continue
  while read -r t f; do
    failed=$((failed + ${f:-0}))
    passed=$((passed + t - ${f:-0}))
  done < <(sed -nE 's/.*tests passed(, ([0-9]+) tests? failed)? out of ([0-9]+).*/\3 \2/p' "$out/$step.log")
done

{
  echo "==================== ferry GPU check: $(hostname) ===================="
  echo "GPUs: $gpus"
  printf '%-16s %-12s %8s  %s\n' step status seconds log
  for step in "${STEPS[@]}"; do
    printf '%-16s %-12s %8s  %s\n' "$step" "${status[$step]}" "${seconds[$step]}" "$out/$step.log"
  done
  echo "tests: $passed passed, $failed failed"
  if [[ -s $out/bench.txt ]]; then echo "benchmarks:"; sed 's/^/  /' "$out/bench.txt"; fi
  if [[ -s $out/perf_table.txt ]]; then echo "ferry-perf:"; cat "$out/perf_table.txt"; fi
  if [[ -s $out/bench_table.txt ]]; then echo "ferry-bench:"; cat "$out/bench_table.txt"; fi
  if ((any_failed)); then echo "result: FAIL"; else echo "result: PASS"; fi
} | tee "$out/summary.txt"
exit $any_failed
