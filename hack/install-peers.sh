#!/usr/bin/env bash
# Installs the peer harnesses the per-step benchmark compares against (bench/peers/package.json,
# exact versions locked by its package-lock.json) into a cache keyed by the lock's sha256,
# reusing an install that is already there, and prints the directory holding node_modules.
# Exits non-zero (with the reason on stderr) when node/npm are missing or the registry is away.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$REPO/bench/peers"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/corral/peers"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "install-peers: $tool is not installed" >&2; exit 1; }
done
key=$(cat "$PEERS/package.json" "$PEERS/package-lock.json" | sha256sum | cut -d' ' -f1)
dir="$CACHE/$key"
if [[ ! -f "$dir/.installed" ]]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$PEERS/package.json" "$PEERS/package-lock.json" "$dir/"
  # No install scripts: the bench runs pi's JavaScript, nothing it would build or fetch.
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$dir/.installed"
fi
echo "$dir"
