#!/usr/bin/env bash
# Runs on the lent GPU machine what the CPU machine built, so that a device call spends its time
# running, not compiling (a build there takes about 3 minutes of the session's 30; a bundle's run of
# the p2p collectives' GPU tests took 15 s, start included).
#
# Here (after `cmake --build --preset default`, which compiles every CUDA source for sm_90):
#   scripts/gpu-bundle.sh pack [PRESET]        # -> .gpu-bin/bundle.tar.xz (git-ignored), about 9 MB
# Or there, from the GPU check's own build, when no bundle was carried (the tests' lanes and the
# tables' parts then run as they would on one; `ctest --test-dir build-gpu -L unit -R plan_compile`
# first, for the compiled plans):
#   GPU_BUNDLE_FAST=1 scripts/gpu-bundle.sh pack build-gpu   # a build folder that exists (else a
#                                             # preset's); fast compression, about 70 MB, for that
#                                             # machine only
# On the GPU machine (carry .gpu-bin):
#   scripts/gpu-bundle.sh run CMD [ARGS...]   # unpacks into build-bundle/, proves the multicast
#                                             # guard there, then runs CMD from build-bundle/ under it
#   scripts/gpu-bundle.sh run ./gpu_collectives --gtest_filter='*Mixed*'
#   scripts/gpu-bundle.sh run ./ferry-bench alltoall -b 4M -e 1G -f 4
#   scripts/gpu-bundle.sh tests [REGEX]       # every GPU test program (as ctest -L gpu runs them,
#                                             # the plan runs included), or those REGEX matches;
#                                             # logs in ${OUT:-build-bundle-out}, a summary line
#                                             # per test as it ends, the totals at the end
#   GPU_TESTS_BESIDE='^gpu_collectives$' scripts/gpu-bundle.sh tests  # those it matches in a second
#                                             # lane, beside the rest (sharing the GPUs)
#   GPU_TESTS_EXCLUDE='^gpu_memory_leak$' scripts/gpu-bundle.sh tests # all but those (as gpu-check.sh)
#   scripts/gpu-bundle.sh tables [PART...]    # scripts/gpu-tables.sh's parts (perf, bench, plans, ...)
#                                             # on the bundle's programs; tables in ${OUT:-build-bundle-out}
# Library variants, to time builds against each other in one device call (the programs stay the
# bundle's; only libferry.so differs: constants, a kernel's shape):
#   scripts/gpu-bundle.sh variant NAME [PRESET]   # here: this build's libferry.so as variant NAME, added
#                                                 # to .gpu-bin/variants.tar.xz (a few MB each)
#   scripts/gpu-bundle.sh with NAME CMD [ARGS...] # there: `run`, with variant NAME's library first
#   scripts/gpu-bundle.sh with l64s2 ./ferry-bench sendrecv -b 4M -e 1G -f 4 --no-nccl
#   scripts/gpu-bundle.sh with l64s2 tests '^gpu_collectives$'   # the GPU tests on that library
#
# The bundle holds the GPU test programs, ferry-bench, ferry-perf, libferry.so, libferry_nccl.so
# (for `ferry-bench --nccl ./libferry_nccl.so`: ferry through the NCCL API), the guard and its
# driver check, without debug info and xz-compressed: with the tree it must stay under the 64 MiB
# a device call carries (about 9 MB, so .deps fits beside it). The run
# sets what gpu-check.sh sets: the guard preloaded (any cuMulticast* call aborts; architecture.md
# rule 1), NCCL_NVLS_ENABLE=0, and GPU_TESTS_SHARE_GPUS=1 on a one-GPU machine. It is not the GPU
# check: Python, the torch extension and the NCCL shim's tests need scripts/gpu-check.sh (the
# extensions built here are for this machine's Python 3.11; the GPU machine's is 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=.gpu-bin/bundle.tar.xz

pack() {
  local build=build/${1:-default}
  if [[ -n ${1:-} && -d $1 ]]; then build=$1; fi
  [[ -d $build ]] || { echo "gpu-bundle.sh: $build is missing; build it first" >&2; exit 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  local p n=0
  for p in "$build"/tests/gpu/gpu_* "$build"/tools/ferry-bench/ferry-bench "$build"/tools/ferry-perf/ferry-perf \
    "$build"/tests/guard/gpu_guard_driver "$build"/tools/guard/libferry_guard.so "$build"/shims/nccl/libferry_nccl.so; do
    [[ -f $p && -x $p ]] || continue
    # (A program objcopy cannot read, a script, goes as it is.)
    objcopy --strip-debug "$p" "$stage/$(basename "$p")" 2>/dev/null || cp "$p" "$stage/"
    n=$((n + 1))
  done
  # libferry.so under its soname, which the programs ask for (their RUNPATH points into the build).
  local soname
  soname=$(objdump -p "$build/src/libferry.so" | awk '$1 == "SONAME" {print $2}')
  objcopy --strip-debug "$(readlink -f "$build/src/libferry.so")" "$stage/$soname"
  # The shipped plans, compiled by tests/unit's plan_compile_* fixture: the plan tests run them.
  if [[ -d $build/tests/unit/compiled_plans ]]; then cp -r "$build/tests/unit/compiled_plans" "$stage/"; fi
  git rev-parse HEAD >"$stage/REVISION" 2>/dev/null || true
  git status --short >>"$stage/REVISION" 2>/dev/null || true
  mkdir -p .gpu-bin
  # Every test program links the library's device code: one dictionary larger than the whole tar,
  # one thread (threads split it into blocks), and each program after the first costs little
  # (420 MB into 8.6 MB on 2026-11-27, where -T0 -6 made 66 MB; about 2.5 minutes on 2 cores).
  local xzArgs=(-T1 --lzma2=preset=6,dict=192MiB)
  [[ ${GPU_BUNDLE_FAST:-0} != 1 ]] || xzArgs=(-T0 -1)  # seconds on the GPU machine's cores
  tar -C "$stage" -cf - . | xz "${xzArgs[@]}" >"$bundle"
  echo "gpu-bundle.sh: $n programs and $soname in $bundle ($(du -h "$bundle" | cut -f1));" \
    "carry .gpu-bin"
}

# Unpacks the bundle into build-bundle/ and enters it, with gpu-check.sh's settings; proves the
# guard before anything touches a GPU.
prepare() {
  [[ -f $bundle ]] || { echo "gpu-bundle.sh: $bundle is missing (pack it on the CPU machine, carry .gpu-bin)" >&2; exit 1; }
  rm -rf build-bundle && mkdir -p build-bundle
  xz -dc "$bundle" | tar -C build-bundle -xf -
  cd build-bundle
  unset FERRY_ENABLE_NVLS
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  export LD_LIBRARY_PATH=${variantLib:+$variantLib:}$PWD:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -eq 1 ]]; then export GPU_TESTS_SHARE_GPUS=1; fi
  LD_PRELOAD=$PWD/libferry_guard.so ./gpu_guard_driver >guard_check.log 2>&1 || {
    cat guard_check.log
    echo "gpu-bundle.sh: the multicast guard failed its check; nothing was run" >&2
    exit 1
  }
}

guarded() { LD_PRELOAD=$PWD/libferry_guard.so${LD_PRELOAD:+:$LD_PRELOAD} "$@"; }

run() {
  (($#)) || { echo "gpu-bundle.sh run: name the program to run" >&2; exit 2; }
  prepare
  guarded "$@"
}

# One GPU test, SPEC as tests/gpu/CMakeLists.txt registers it with ctest (NAME TIMEOUT ENV... --
# ARGS...), its log in $out/NAME.log; appends its line to $out/progress.txt as it ends, so that a call
# cut short by its time limit still says what ran.
runTest() {
  local words name limit envs=() cmd=() i=2
  read -ra words <<<"$1"
  name=${words[0]} limit=${words[1]}
  while [[ ${words[i]} != -- ]]; do envs+=("${words[i]}"); i=$((i + 1)); done
  cmd=("${words[@]:i+1}")
  ((${#cmd[@]})) || cmd=("$name")
  cmd[0]=./${cmd[0]}
  local t0=$SECONDS rc=0
  guarded env "${envs[@]}" timeout "$limit" "${cmd[@]}" >"$out/$name.log" 2>&1 || rc=$?
  printf '%-32s %-10s %5d s\n' "$name" "$([[ $rc == 0 ]] && echo ok || echo "FAILED($rc)")" $((SECONDS - t0)) \
    >>"$out/progress.txt"
  # A failure's own lines, not only the log's end (gtest's summary), so that what failed comes back
  # in a device call's output even when its log files do not (a call returns at most 8 files).
  [[ $rc == 0 ]] || {
    echo "--- $name: FAILED($rc)"  # (the lanes' excerpts may interleave)
    grep -E -A6 'Failure|^\[  FAILED|[Ee]rror|rank [0-9]+:' "$out/$name.log" | grep -v '^\[ *OK' | head -60 || true
    tail -5 "$out/$name.log"
  }
}

# The GPU tests, each as tests/gpu/CMakeLists.txt registers it with ctest: NAME TIMEOUT ENV... -- ARGS...
# GPU_TESTS_BESIDE=REGEX runs the programs it matches in a second lane, beside the others: the two
# lanes share the GPUs, which proves the same and takes less of a device call (on 4 H200 the
# programs' times add up to about 13 minutes; in two lanes the run took 9).
tests() {
  local only=${1:-.}
  out=${OUT:-build-bundle-out}  # (not local: runTest reads it)
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  prepare
  local plans=$PWD/compiled_plans
  local specs=(
    "gpu_device_primitives 600 --"
    "gpu_fifo 600 --"
    "gpu_memory_sharing 600 --"
    "gpu_memory_leak 900 --"
    "gpu_channels 600 --"
    "gpu_collectives 1500 --"
    "gpu_collectives_plans 1200 FERRY_PLAN_DIR=$plans -- gpu_collectives --gtest_filter=*Plan*"
    "gpu_collectives_plans_one_lane 1200 FERRY_PLAN_DIR=$plans FERRY_PLAN_LANES=1 -- gpu_collectives --gtest_filter=*Plan*"
    "gpu_collectives_plans_ports_on_proxy 1200 FERRY_PLAN_DIR=$plans FERRY_PLAN_PORTS=proxy -- gpu_collectives --gtest_filter=*Plan*"
    "gpu_p2p 1200 --"
    "gpu_runtime_algorithms 600 FERRY_TEST_PLAN_DIR=$plans --"
    "gpu_foreign_connection 600 FERRY_TEST_PLAN_DIR=$plans --"
    "gpu_host_partners 600 --"
    "gpu_comm_across_hosts 900 --"
  )
  local lane=() beside=() spec name
  for spec in "${specs[@]}"; do
    name=${spec%% *}
    [[ $name =~ $only ]] || continue
    [[ -z ${GPU_TESTS_EXCLUDE:-} || ! $name =~ $GPU_TESTS_EXCLUDE ]] || continue
    if [[ -n ${GPU_TESTS_BESIDE:-} && $name =~ $GPU_TESTS_BESIDE ]]; then beside+=("$spec"); else lane+=("$spec"); fi
  done
  : >"$out/progress.txt"
  local besidePid=
  if ((${#beside[@]})); then
    (for spec in "${beside[@]}"; do runTest "$spec"; done) &
    besidePid=$!
  fi
  for spec in "${lane[@]}"; do runTest "$spec"; done
  [[ -z $besidePid ]] || wait "$besidePid" || echo "gpu-bundle.sh: the second lane exited with $?" >&2
  local run failed
  run=$(wc -l <"$out/progress.txt")
  failed=$(grep -c FAILED "$out/progress.txt" || true)
  { cat "$out/progress.txt"; echo "bundle of $(head -1 REVISION 2>/dev/null): $run run, $failed failed"; } |
    tee "$out/summary.txt"
  ((failed == 0))
}

# gpu-tables.sh on the bundle's programs (the plans part compiles the shipped programs with the
# tree's Python, which needs no extension).
tables() {
  local out=${OUT:-build-bundle-out}
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  prepare
  GPU_TABLES_BIN=$PWD OUT=$out ../scripts/gpu-tables.sh "$@"
}

variants=.gpu-bin/variants.tar.xz

# This build's libferry.so (stripped) as variant NAME: .gpu-bin/variants/NAME/, packed with the
# others into one archive (their common bytes compress away).
variant() {
  local name=${1:?name the variant} build=build/${2:-default}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "gpu-bundle.sh variant: a name of letters, digits, . _ -" >&2; exit 2; }
  local soname
  soname=$(objdump -p "$build/src/libferry.so" | awk '$1 == "SONAME" {print $2}')
  mkdir -p ".gpu-bin/variants/$name"
  objcopy --strip-debug "$(readlink -f "$build/src/libferry.so")" ".gpu-bin/variants/$name/$soname"
  git rev-parse HEAD >".gpu-bin/variants/$name/REVISION" 2>/dev/null || true
  git diff --stat >>".gpu-bin/variants/$name/REVISION" 2>/dev/null || true
  tar -C .gpu-bin/variants -cf - . | xz -T2 --lzma2=preset=6,dict=192MiB >"$variants"
  echo "gpu-bundle.sh: variants $(ls .gpu-bin/variants | tr '\n' ' ')in $variants ($(du -h "$variants" | cut -f1))"
}

# `run` with variant NAME's libferry.so ahead of the bundle's (LD_LIBRARY_PATH is searched before
# the programs' RUNPATH; ranks that ferry-bench starts inherit it).
# `with NAME tests [REGEX]` runs the GPU tests on that library.
with() {
  local name=${1:?name the variant}
  shift
  (($#)) || { echo "gpu-bundle.sh with: name the program to run" >&2; exit 2; }
  [[ -f $variants ]] ||
    { echo "gpu-bundle.sh: $variants is missing (scripts/gpu-bundle.sh variant NAME here)" >&2; exit 1; }
  variantDir=$(mktemp -d)  # (not local: the trap runs after the function has returned)
  trap 'rm -rf "$variantDir"' EXIT
  xz -dc "$variants" | tar -C "$variantDir" -xf -
  [[ -d $variantDir/$name ]] ||
    { echo "gpu-bundle.sh with: no variant $name (there: $(ls "$variantDir" | tr '\n' ' '))" >&2; exit 1; }
  variantLib=$variantDir/$name  # (prepare puts it first)
  if [[ $1 == tests ]]; then
    shift
    tests "$@"
    return
  fi
  prepare
  guarded "$@"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  variant) shift; variant "$@" ;;
  with) shift; with "$@" ;;
  tables) shift; tables "$@" ;;
  run) shift; run "$@" ;;
  tests) shift; tests "$@" ;;
  *) sed -n '2,43p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
