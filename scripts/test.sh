#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). Needs no GPU.
#   1. installs missing dependencies (scripts/install-deps.sh),
#   2. runs the Python tests (python/tests: the DSL, the plan loader and verifier, the shipped plans),
#   3. builds the `default` preset (every CUDA source for sm_90) and runs every test but the gpu ones,
#      then installs the Python package from it (pip install . into build/venv, with PyTorch 2.11
#      installed there first, so the torch backend is built too) and runs the tests that need its
#      C++ extensions,
#   4. builds the `asan` preset and runs the host tests (unit, mp) under ASan + UBSan,
#   5. builds the `fuzz` preset (clang, libFuzzer) and runs the fuzz targets for a bounded time.
# The last line is "N passed, N failed" over all test runs (a build that fails counts as one failure);
# the exit status is non-zero if anything failed.
#
#   scripts/test.sh            # everything
#   scripts/test.sh --quick    # Python tests, default build and its tests only
#   scripts/test.sh --no-deps  # skip the dependency check
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

quick=0
deps=1
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --no-deps) deps=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

jobs=$(nproc)
log_dir=build/test-logs
passed=0
failed=0
problems=()
start=$SECONDS

finish() {
  local rc=$?
  echo
  echo "== test.sh finished in $((SECONDS - start)) s"
  local p
  for p in "${problems[@]+"${problems[@]}"}"; do echo "FAILED: $p"; done
  if [[ $rc -eq 0 && $failed -gt 0 ]]; then rc=1; fi
  if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi  # the script itself broke
  echo "$passed passed, $failed failed"
  exit "$rc"
}
trap finish EXIT

banner() { echo; echo "== $*"; }

# Marks a failed step that is not a ctest run (a configure or build): one failure in the summary.
step_failed() {
  failed=$((failed + 1))
  problems+=("$1")
}

build() {
  local preset=$1 t0=$SECONDS
  banner "configure + build: preset $preset"
  if ! cmake --preset "$preset"; then
    step_failed "configure $preset"
    return 1
  fi
  if ! cmake --build --preset "$preset" --parallel "$jobs"; then
    step_failed "build $preset"
    return 1
  fi
  echo "== built $preset in $((SECONDS - t0)) s"
}

# Runs one ctest preset and adds its counts to the totals.
run_tests() {
  local preset=$1 t0=$SECONDS
  shift
  banner "ctest --preset $preset $*"
  mkdir -p "$log_dir"
  local log="$log_dir/$preset.log" rc=0
  ctest --preset "$preset" --no-tests=error "$@" 2>&1 | tee "$log" || rc=$?
  local line
  line=$(grep -Eo '[0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  if [[ -z "$line" ]]; then
    step_failed "ctest $preset (no test summary; see $log)"
    return 1
  fi
  local nfail ntotal
  nfail=$(echo "$line" | awk '{print $1}')
  ntotal=$(echo "$line" | awk '{print $NF}')
  passed=$((passed + ntotal - nfail))
  failed=$((failed + nfail))
  if [[ $nfail -gt 0 ]]; then
    problems+=("ctest $preset: $nfail of $ntotal tests (see $log)")
  elif [[ $rc -ne 0 ]]; then
    step_failed "ctest $preset exited with $rc (see $log)"
  fi
  echo "== tests of $preset took $((SECONDS - t0)) s"
}

# Runs pytest and adds its counts: LABEL PYTHON PYTHONPATH PATHS... (the log is named after LABEL).
run_python_tests() {
  local label=$1 python=$2 path=$3 t0=$SECONDS
  shift 3
  banner "python tests: $label (pytest $*)"
  mkdir -p "$log_dir"
  local log="$log_dir/python-${label// /-}.log" rc=0
  PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} "$python" -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$log" || rc=$?
  # The last line reads like "2 failed, 98 passed, 1 error in 3.1s"; exit status 5 means no tests ran.
  local line npass nfail nerr
  line=$(sed -E 's/^=+ //' "$log" | grep -E '^[0-9]+ [a-z]+.* in [0-9.]+s|no tests ran' | tail -n 1 || true)
  npass=$(grep -Eo '[0-9]+ passed' <<<"$line" | awk '{print $1}' || true)
  nfail=$(grep -Eo '[0-9]+ failed' <<<"$line" | awk '{print $1}' || true)
  nerr=$(grep -Eo '[0-9]+ errors?' <<<"$line" | awk '{print $1}' || true)
  passed=$((passed + ${npass:-0}))
  failed=$((failed + ${nfail:-0} + ${nerr:-0}))
  if [[ $((${nfail:-0} + ${nerr:-0})) -gt 0 ]]; then
    problems+=("python tests ($label): ${nfail:-0} failed, ${nerr:-0} errors (see $log)")
  elif [[ $rc -ne 0 || -z "$npass" ]]; then
    step_failed "python tests ($label) exited with $rc and ran ${npass:-no} tests (see $log)"
  fi
  echo "== python tests ($label) took $((SECONDS - t0)) s"
}

# `pip install .` into a virtual environment, reusing build/default (the same build directory and
# type, so only the wheel's own steps run, not a second compile of the library), then the tests that
# need the C++ extension, against the installed package (from the repository root, where no `ferry`
# folder shadows it).
python_package() {
  local t0=$SECONDS venv=build/venv
  banner "python package: pip install . into $venv"
  if [[ ! -x $venv/bin/python ]] && ! "${PYTHON:-python3}" -m venv --system-site-packages "$venv"; then
    step_failed "python -m venv $venv"
    return 1
  fi
  # PyTorch in the venv, so that the package builds and tests its torch backend (ferry._torch). A
  # failed download is reported, not counted: the rest of the package is tested without it.
  if [[ $deps -eq 1 ]] && ! scripts/install-deps.sh --torch-into "$venv/bin/python"; then
    echo "test.sh: WARNING: torch could not be installed into $venv: the torch backend is not built or tested"
  fi
  if ! "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps . -C build-dir=build/default \
    -C cmake.build-type=RelWithDebInfo -C cmake.define.FERRY_BUILD_TESTS=ON -C cmake.define.FERRY_BUILD_TOOLS=ON; then
    step_failed "pip install ."
    return 1
  fi
  echo "== installed in $((SECONDS - t0)) s"
  local torch_tests=()
  if "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    torch_tests=(python/tests/test_torch_backend.py python/tests/test_torch_fused_ops.py python/tests/test_torch_symm.py
      python/tests/test_torch_async_tp.py python/tests/test_torch_fused_bench.py python/tests/test_torch_bench_ranks.py)
  fi
  FERRY_REQUIRE_NATIVE=1 FERRY_REQUIRE_TORCH_BACKEND=$((${#torch_tests[@]} > 0)) run_python_tests "installed package" \
    "$venv/bin/python" "" python/tests/test_native_*.py "${torch_tests[@]}"
}

if [[ $deps -eq 1 ]]; then
  banner "dependencies"
  if ! scripts/install-deps.sh; then
    step_failed "scripts/install-deps.sh"
    exit 1
  fi
fi

run_python_tests "source tree" "${PYTHON:-python3}" python python/tests || true
if build default; then
  run_tests default || true
  python_package || true
fi
if [[ $quick -eq 0 ]]; then
  if build asan; then run_tests asan || true; fi
  if build fuzz; then run_tests fuzz || true; fi
fi
