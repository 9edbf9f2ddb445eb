#!/usr/bin/env bash
# Builds corral-gateway (gateway/, Go on stripe/smokescreen from the module proxy) as a static
# binary, cached in ~/.cache/corral/gateway by the sha256 of its sources, and prints its path.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$REPO/hack/build-go-binary.sh" "$REPO/gateway" corral-gateway
