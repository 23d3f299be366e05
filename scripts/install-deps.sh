#!/usr/bin/env bash
# Installs what building and testing ferry needs, from Debian packages and PyPI, and only what is
# missing: a second run checks and returns in a second or two. Runs as root, or through sudo.
# The CUDA toolkit is not installed here; it is expected at /usr/local/cuda (or nvcc on PATH).
# Headers and sources that scripts/prepare-device-deps.sh put in .deps/ count as installed (for
# machines without package access).
#
#   scripts/install-deps.sh               # everything: build, tests, fuzzing
#   scripts/install-deps.sh --build-only  # only what building the default preset needs
#   scripts/install-deps.sh --check       # only report; exit 1 if something is missing
#   scripts/install-deps.sh --torch-into build/venv/bin/python
#                                         # only PyTorch (for ferry's torch backend) into that Python
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=0
build_only=0
torch_python=
while [[ $# -gt 0 ]]; do
  arg=$1
  shift
  case "$arg" in
    --check) check_only=1 ;;
    --build-only) build_only=1 ;;
    --torch-into)
      torch_python=${1:?--torch-into needs a Python interpreter}
      shift
      ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# PyTorch for the torch backend's build and CPU tests: the version of the lent GPU machine (2.11,
# CUDA 13.0, as this toolkit), without the 3 GB of CUDA libraries pip would add: the toolkit's
# libraries serve, and the three it lacks come as their small wheels. Only into the Python named
# (scripts/test.sh's venv), once.
if [[ -n $torch_python ]]; then
  if "$torch_python" -c "import torch" >/dev/null 2>&1; then
    echo "install-deps.sh: torch present in $torch_python"
    exit 0
  fi
  echo "install-deps.sh: installing torch 2.11.0 into $torch_python"
  "$torch_python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
    torch==2.11.0 typing_extensions sympy mpmath networkx jinja2 MarkupSafe fsspec filelock \
    nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13==3.4.5
  "$torch_python" -c "import torch" || {
    echo "install-deps.sh: torch does not import in $torch_python after the install" >&2
    exit 1
  }
  exit 0
fi

deps_dir=${FERRY_THIRD_PARTY_DIR:-.deps}
# Debian package -> what counts as having it without dpkg: a command on PATH, or a path (in .deps).
declare -A present_if=(
  [cmake]="cmd:cmake"
  [ninja-build]="cmd:ninja"
  [g++]="cmd:g++"
  [clang]="cmd:clang++"
  [googletest]="path:$deps_dir/googletest/CMakeLists.txt"
  [libgtest-dev]="path:$deps_dir/googletest/CMakeLists.txt"
  [nlohmann-json3-dev]="path:$deps_dir/include/nlohmann/json.hpp"
  [libcli11-dev]="path:$deps_dir/include/CLI/CLI.hpp"
  [libssl-dev]="path:$deps_dir/include/openssl/evp.h"
)
build_packages=(cmake ninja-build g++ googletest libgtest-dev nlohmann-json3-dev libcli11-dev libssl-dev)
test_packages=(clang iproute2)  # iproute2: `ip netns` for the tests of several hosts (test_native_netns.py)
# Python modules the test suite and `pip install .` (nanobind, scikit-build-core: pyproject.toml) use,
# as module:pip-package.
pip_modules=(pytest:pytest matplotlib:matplotlib nanobind:nanobind scikit_build_core:scikit-build-core)

have_package() {
  local pkg=$1 alt=${present_if[$1]:-}
  case "$alt" in
    cmd:*) command -v "${alt#cmd:}" >/dev/null 2>&1 && return 0 ;;
    path:*) [[ -e "${alt#path:}" ]] && return 0 ;;
  esac
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"
}

sudo_cmd=()
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); fi

status=0
missing() {  # records a missing dependency in --check mode
  echo "missing: $*"
  status=1
}

apt_updated=0
apt_install() {
  if [[ $check_only -eq 1 ]]; then
    missing "Debian packages $*"
    return
  fi
  if [[ $(id -u) -ne 0 && ${#sudo_cmd[@]} -eq 0 ]]; then
    echo "install-deps.sh: need root or sudo to install the Debian packages: $*" >&2
    exit 1
  fi
  echo "install-deps.sh: installing Debian packages: $*"
  local apt=("${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o Dpkg::Use-Pty=0)
  if { [[ $apt_updated -eq 1 ]] || "${apt[@]}" update; } &&
    "${apt[@]}" install -y --no-install-recommends "$@" >/dev/null; then
    apt_updated=1
    return
  fi
  echo "install-deps.sh: could not install $* with apt-get. On a machine without package access," \
    "run scripts/prepare-device-deps.sh where you can and bring .deps/ along." >&2
  exit 1
}

packages=("${build_packages[@]}")
[[ $build_only -eq 1 ]] || packages+=("${test_packages[@]}")
todo=()
for pkg in "${packages[@]}"; do have_package "$pkg" || todo+=("$pkg"); done
[[ ${#todo[@]} -eq 0 ]] || apt_install "${todo[@]}"

if [[ $build_only -eq 0 ]]; then
  # libFuzzer comes with the compiler-rt package of the installed clang's major version.
  if command -v clang++ >/dev/null 2>&1 &&
    [[ ! -f "$(clang++ -print-file-name="libclang_rt.fuzzer-$(uname -m).a")" ]]; then
    apt_install "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev"
  fi

  python=${PYTHON:-python3}
  if ! "$python" -m pip --version >/dev/null 2>&1; then apt_install python3 python3-pip; fi
  for entry in "${pip_modules[@]}"; do
    module=${entry%%:*}
    package=${entry#*:}
    if "$python" -c "import $module" >/dev/null 2>&1; then continue; fi
    if [[ $check_only -eq 1 ]]; then
      missing "Python module $module (pip package $package)"
      continue
    fi
    echo "install-deps.sh: installing Python package: $package"
    pip=("$python" -m pip install --quiet --disable-pip-version-check --no-input)
    # A Debian-managed python refuses plain pip installs (PEP 668); these are test tools only.
    "${pip[@]}" "$package" 2>/dev/null || "${pip[@]}" --break-system-packages "$package"
  done
fi

# The CUDA toolkit: every build compiles the CUDA sources, so say clearly if it is missing.
if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "install-deps.sh: the CUDA toolkit (nvcc) is not at /usr/local/cuda or on PATH; install it" \
    "from NVIDIA, or set CUDACXX to nvcc" >&2
  status=1
fi

if [[ $status -eq 0 ]]; then echo "install-deps.sh: all dependencies present"; fi
exit $status
