#!/usr/bin/env bash
# Builds corral-exec (harness_image/corral_exec, Go stdlib only) as a static binary, cached in
# ~/.cache/corral/exec by the sha256 of its sources, and prints the binary's path.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$REPO/hack/build-go-binary.sh" "$REPO/harness_image/corral_exec" corral-exec
