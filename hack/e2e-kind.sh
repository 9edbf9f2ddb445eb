#!/usr/bin/env bash
# End-to-end on kind: the node tier's Corral tests (tests/node/test_corral_on_node.py, the same
# test functions `make test` runs on the real node) against a kind cluster, with Corral's images
# built by Docker from the project's Dockerfiles and loaded into the cluster.
#
# The tests install the chart with `helm install` (values the schema accepts: the images, the
# watched namespace they prepare, the model and the git daemon as platform egress), serve a git
# repository (`git daemon`) and the scripted model on this host where the cluster's pods reach
# it, apply Sessions with kubectl and check the sandbox's isolation, NetworkPolicy included.
#
# Needs Linux (pods reach this host through the gateway of kind's Docker network), Docker, kind
# v0.24 or later (its kindnet enforces NetworkPolicy), python3.11, go (kubectl and helm are the
# control plane's pinned builds) and git. A host firewall must let the kind network reach this
# host's ports. Not part of CI here: this machine has no Docker.
#
#   CORRAL_KIND_CLUSTER   cluster name (default corral-e2e); created when missing
#   CORRAL_KIND_KEEP=0    delete the cluster afterwards when this script created it
#   extra arguments       passed to pytest (e.g. -k secrets -x)
set -euo pipefail
cd "$(dirname "$0")/.."

command -v docker >/dev/null && docker info >/dev/null 2>&1 \
  || { echo "e2e-kind needs a running Docker engine" >&2; exit 2; }
command -v kind >/dev/null || { echo "e2e-kind needs kind on PATH" >&2; exit 2; }
[[ $(uname -s) == Linux ]] \
  || { echo "e2e-kind needs Linux: pods reach this host through kind's Docker network" >&2; exit 2; }

make venv >/dev/null
BIN=$(bash hack/build-control-plane.sh | tail -n1)   # kubectl and helm, pinned
export PATH="$BIN:$PATH"

cluster=${CORRAL_KIND_CLUSTER:-corral-e2e}
created=0
if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --wait 180s
  created=1
fi
work=$(mktemp -d)
cleanup() {
  rm -rf "$work"
  if [[ $created == 1 && ${CORRAL_KIND_KEEP:-1} == 0 ]]; then
    kind delete cluster --name "$cluster" || true
  fi
}
trap cleanup EXIT
kind get kubeconfig --name "$cluster" > "$work/kubeconfig"

# Images: tagged by the tree (never `latest`, so IfNotPresent uses the loaded image).
tag="e2e-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo "-$(date +%s)")"
operator_image="corral-operator:$tag"
sandbox_image="corral-sandbox:$tag"
docker build -t "$operator_image" -f operator/Dockerfile .
docker build -t "$sandbox_image" -f harness_image/Dockerfile .
kind load docker-image --name "$cluster" "$operator_image" "$sandbox_image"

# This host as the pods reach it: the IPv4 gateway of kind's Docker network.
host_ip=$(docker network inspect kind \
  -f '{{range .IPAM.Config}}{{if .Gateway}}{{println .Gateway}}{{end}}{{end}}' \
  | grep -v ':' | head -n1)
[[ -n $host_ip ]] || { echo "no IPv4 gateway on Docker network 'kind'" >&2; exit 1; }

export CORRAL_E2E_KUBECONFIG="$work/kubeconfig"
export CORRAL_E2E_OPERATOR_IMAGE="$operator_image"
export CORRAL_E2E_SANDBOX_IMAGE="$sandbox_image"
export CORRAL_E2E_HOST_IP="$host_ip"
.venv/bin/pytest -q -p no:cacheprovider tests/node/test_corral_on_node.py "$@"
