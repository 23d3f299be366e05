#!/usr/bin/env bash
# Runs on the lent GPU machine what the CPU machine built, so that a device call spends its time
# running, not compiling (a build there takes about 3 minutes of the session's 30; a bundle's run of
# the p2p collectives' GPU tests took 15 s, start included).
#
# Here (after `cmake --build --preset default`, which compiles every CUDA source for sm_90):
#   scripts/gpu-bundle.sh pack [PRESET]        # -> .gpu-bin/bundle.tar.xz (git-ignored), about 45 MB
# On the GPU machine (carry .gpu-bin):
#   scripts/gpu-bundle.sh run CMD [ARGS...]   # unpacks into build-bundle/, proves the multicast
#                                             # guard there, then runs CMD from build-bundle/ under it
#   scripts/gpu-bundle.sh run ./gpu_collectives --gtest_filter='*Mixed*'
#   scripts/gpu-bundle.sh run ./ferry-bench alltoall -b 4M -e 1G -f 4
#
# The bundle holds the GPU test programs, ferry-bench, ferry-perf, libferry.so, the guard and its
# driver check, without debug info and xz-compressed (the carry limit is 64 MiB). The run sets what
# gpu-check.sh sets: the guard preloaded (any cuMulticast* call aborts; architecture.md rule 1),
# NCCL_NVLS_ENABLE=0, and GPU_TESTS_SHARE_GPUS=1 on a one-GPU machine. It is not the GPU check:
# Python, the torch extension and the NCCL shim's tests need scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=.gpu-bin/bundle.tar.xz

pack() {
  local build=build/${1:-default}
  [[ -d $build ]] || { echo "gpu-bundle.sh: $build is missing; build it first" >&2; exit 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  local p n=0
  for p in "$build"/tests/gpu/gpu_* "$build"/tools/ferry-bench/ferry-bench "$build"/tools/ferry-perf/ferry-perf \
    "$build"/tests/guard/gpu_guard_driver "$build"/tools/guard/libferry_guard.so; do
    [[ -f $p && -x $p ]] || continue
    objcopy --strip-debug "$p" "$stage/$(basename "$p")"
    n=$((n + 1))
  done
  # libferry.so under its soname, which the programs ask for (their RUNPATH points into the build).
  local soname
  soname=$(objdump -p "$build/src/libferry.so" | awk '$1 == "SONAME" {print $2}')
  objcopy --strip-debug "$(readlink -f "$build/src/libferry.so")" "$stage/$soname"
  git rev-parse HEAD >"$stage/REVISION" 2>/dev/null || true
  git status --short >>"$stage/REVISION" 2>/dev/null || true
  mkdir -p .gpu-bin
  tar -C "$stage" -cf - . | xz -T0 -6 >"$bundle"
  echo "gpu-bundle.sh: $n programs and $soname in $bundle ($(du -h "$bundle" | cut -f1));" \
    "carry .gpu-bin"
}

run() {
  (($#)) || { echo "gpu-bundle.sh run: name the program to run" >&2; exit 2; }
  [[ -f $bundle ]] || { echo "gpu-bundle.sh: $bundle is missing (pack it on the CPU machine, carry .gpu-bin)" >&2; exit 1; }
  rm -rf build-bundle && mkdir -p build-bundle
  xz -dc "$bundle" | tar -C build-bundle -xf -
  cd build-bundle
  unset FERRY_ENABLE_NVLS
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  export LD_LIBRARY_PATH=$PWD:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -eq 1 ]]; then export GPU_TESTS_SHARE_GPUS=1; fi
  # Nothing touches a GPU unless the guard is proven to catch the driver's multicast entry points here.
  LD_PRELOAD=$PWD/libferry_guard.so ./gpu_guard_driver >guard_check.log 2>&1 || {
    cat guard_check.log
    echo "gpu-bundle.sh: the multicast guard failed its check; nothing was run" >&2
    exit 1
  }
  LD_PRELOAD=$PWD/libferry_guard.so${LD_PRELOAD:+:$LD_PRELOAD} "$@"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
