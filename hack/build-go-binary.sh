#!/usr/bin/env bash
# build-go-binary.sh MODULE_DIR NAME: builds one of Corral's Go modules as a static binary into
# ~/.cache/corral/NAME/<sha256 of its sources>/NAME (go.sum included: a dependency bump is a new
# binary), reusing a build that is already there, and prints the binary's path. Parallel
# callers (pytest workers) take a lock, so one builds and the others find its binary.
set -euo pipefail

MODULE="$1"
NAME="$2"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/corral/${NAME#corral-}"

cd "$MODULE"
# The sources that make the binary: go.mod, go.sum and every non-test .go file.
sources=$(find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) ! -name '*_test.go' | LC_ALL=C sort)
key=$(for f in $sources; do printf '%s\n' "$f"; sha256sum < "$f"; done | sha256sum | cut -d' ' -f1)
out="$CACHE/$key/$NAME"

if [[ ! -x "$out" ]]; then
  mkdir -p "$CACHE/$key"
  exec 9>"$CACHE/.lock"
  flock 9
  if [[ ! -x "$out" ]]; then  # another caller may have built it while this one waited
    tmp="$out.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
      go build -trimpath -ldflags='-s -w' -o "$tmp" . >&2
    mv -f "$tmp" "$out"
  fi
fi
echo "$out"
