#!/usr/bin/env bash
# The main job: installs missing dependencies, builds the `default` preset, then runs the collective
# benchmark (ferry-bench) on all local GPUs. Other arguments are passed on to ferry-bench.
# On a machine without an NVIDIA GPU it says so, runs ferry-info instead, and exits 0.
#
#   scripts/run.sh             # deps, build, benchmark (or ferry-info)
#   scripts/run.sh --no-deps   # skip the dependency check
set -euo pipefail
cd "$(dirname "$0")/.."

deps=1
bench_args=()
for arg in "$@"; do
  case "$arg" in
    --no-deps) deps=0 ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) bench_args+=("$arg") ;;
  esac
done

if [[ $deps -eq 1 ]]; then
  scripts/install-deps.sh --build-only
fi

build_dir=build/default
echo "== configure + build: preset default"
if ! out=$(cmake --preset default 2>&1); then
  echo "$out" >&2
  echo "run.sh: configuring the default preset failed" >&2
  exit 1
fi
cmake --build --preset default --parallel "$(nproc)" --target ferry-info ferry_guard ferry-bench

info="$build_dir/tools/ferry-info/ferry-info"
bench="$build_dir/tools/ferry-bench/ferry-bench"
guard="$build_dir/tools/guard/libferry_guard.so"

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi

echo
if [[ $gpus -eq 0 ]]; then
  echo "No GPU on this machine: ferry needs NVIDIA GPUs for its benchmark; showing ferry-info instead."
  echo
  exec "$info"
fi

echo "== $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
  awk '{$1=$1; print}' | paste -sd, -)"
# Second guard against NVLink multicast (architecture.md rule 1): unless NVLS was asked for, any
# cuMulticast* call aborts the benchmark.
if [[ "${FERRY_ENABLE_NVLS:-0}" != 1 && -f "$guard" ]]; then
  export LD_PRELOAD="$PWD/$guard${LD_PRELOAD:+:$LD_PRELOAD}"
fi
# With no GPU list, ferry-bench runs one rank per local GPU.
exec "$bench" "${bench_args[@]+"${bench_args[@]}"}"
