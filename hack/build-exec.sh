#!/usr/bin/env bash
# Builds corral-exec (harness_image/corral_exec, Go stdlib only) as a static binary into a cache
# keyed by the sha256 of the module's sources, reusing a build that is already there, and
# prints the binary's path.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$REPO/harness_image/corral_exec"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/corral/exec"

cd "$MODULE"
# The sources that make the binary: go.mod (and go.sum) and every non-test .go file.
sources=$(find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) ! -name '*_test.go' | LC_ALL=C sort)
key=$(for f in $sources; do printf '%s\n' "$f"; sha256sum < "$f"; done | sha256sum | cut -d' ' -f1)
out="$CACHE/$key/corral-exec"

if [[ ! -x "$out" ]]; then
  mkdir -p "$CACHE/$key"
  tmp="$out.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
    go build -trimpath -ldflags='-s -w' -o "$tmp" . >&2
  mv -f "$tmp" "$out"
fi
echo "$out"
