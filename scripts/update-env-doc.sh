#!/usr/bin/env bash
# Regenerates docs/env.md from the environment table in src/core/env.cpp, through
# `ferry-info --env-markdown`. Builds ferry-info in build/default first if needed (or in $BUILD_DIR).
# The unit test EnvDoc.DocsEnvMdIsUpToDate fails until this has been run after a table change.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build/default}
quiet() {  # runs a command, showing its output only if it fails
  local out
  if ! out=$("$@" 2>&1); then
    echo "$out" >&2
    echo "update-env-doc.sh: failed: $*" >&2
    exit 1
  fi
}
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  if [[ "$build_dir" == build/default ]]; then
    quiet cmake --preset default
  else
    echo "update-env-doc.sh: $build_dir is not a configured build directory" >&2
    exit 1
  fi
fi
quiet cmake --build "$build_dir" --target ferry-info

info="$build_dir/tools/ferry-info/ferry-info"
if [[ ! -x "$info" ]]; then
  echo "update-env-doc.sh: $info was not built" >&2
  exit 1
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$info" --env-markdown >"$tmp"
if cmp -s "$tmp" docs/env.md; then
  echo "docs/env.md is up to date"
else
  mkdir -p docs
  cp "$tmp" docs/env.md
  echo "docs/env.md updated"
fi
