#!/usr/bin/env bash
# Copies the third-party code the build needs into .deps/, for a machine that cannot install it:
# the lent GPU machine has no internet and no apt. Run it here (where scripts/install-deps.sh put the
# Debian packages), then carry .deps to the GPU machine with the tree; cmake/FerryDeps.cmake finds
# it there. Layout:
#   .deps/googletest/               GoogleTest sources (Debian's googletest package, tests trimmed)
#   .deps/include/{CLI,nlohmann}/   CLI11 and nlohmann-json headers
#   .deps/include/openssl/          OpenSSL's headers (libssl-dev; the GPU machine has libcrypto.so.3
#                                   but not its headers), the configuration header of this arch merged in
#   .deps/share/cmake/{CLI11,nlohmann_json}/   their CMake package files, where the packages ship them
# .deps stays out of git through .git/info/exclude. About 4 MB.
#
#   scripts/prepare-device-deps.sh
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

dest=.deps
arch_openssl=/usr/include/$(gcc -dumpmachine)/openssl
sources=(/usr/src/googletest /usr/include/CLI /usr/include/nlohmann /usr/include/openssl "$arch_openssl")
for path in "${sources[@]}"; do
  if [[ ! -e $path ]]; then
    echo "prepare-device-deps.sh: $path is missing; run scripts/install-deps.sh (Debian packages" \
      "googletest, libcli11-dev, nlohmann-json3-dev, libssl-dev) first" >&2
    exit 1
  fi
done

rm -rf "$dest"
mkdir -p "$dest/include" "$dest/share/cmake"
cp -a /usr/src/googletest "$dest/googletest"
# GoogleTest's own tests, samples and docs are not built from here; they only add weight.
rm -rf "$dest"/googletest/{googletest,googlemock}/{test,docs} "$dest/googletest/googletest/samples"
cp -a /usr/include/CLI /usr/include/nlohmann /usr/include/openssl "$dest/include/"
cp -a "$arch_openssl"/. "$dest/include/openssl/"  # configuration.h and friends: one include root
for config in /usr/share/cmake/CLI11 /usr/lib/cmake/CLI11 /usr/share/cmake/nlohmann_json \
  /usr/lib/cmake/nlohmann_json; do
  # Their paths are relative to the config file (three folders up is the prefix), so they work
  # from .deps/share/cmake as they do from /usr/share/cmake.
  if [[ -d $config ]]; then cp -a "$config" "$dest/share/cmake/"; fi
done

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$dest/" "$exclude" 2>/dev/null || echo "/$dest/" >>"$exclude"
if [[ -n $(git status --porcelain --ignored=no -- "$dest" 2>/dev/null) ]]; then
  echo "prepare-device-deps.sh: git still sees $dest; check $exclude" >&2
  exit 1
fi

echo "prepare-device-deps.sh: $(du -sh "$dest" | cut -f1) in $dest (git-ignored); carry it to the GPU machine"
