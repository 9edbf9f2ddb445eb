#!/usr/bin/env bash
# End-to-end on kind (needs docker and kind; not part of CI on machines without a runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v docker >/dev/null && docker info >/dev/null 2>&1 || { echo "e2e-kind needs a running Docker engine" >&2; exit 2; }
command -v kind >/dev/null || { echo "e2e-kind needs kind on PATH" >&2; exit 2; }
BIN=$(bash hack/build-control-plane.sh)
export PATH="$BIN:$PATH"
cluster=corral-e2e
kind get clusters | grep -qx "$cluster" || kind create cluster --name "$cluster"
docker build -t corral-operator:dev -f operator/Dockerfile .
docker build -t corral-harness:dev -f harness_image/Dockerfile .
kind load docker-image --name "$cluster" corral-operator:dev corral-harness:dev
helm upgrade --install corral charts/corral --namespace corral-system --create-namespace \
  --set image.repository=corral-operator --set image.tag=dev \
  --set sandbox.image=corral-harness:dev --wait
kubectl create namespace corral-e2e --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace corral-e2e pod-security.kubernetes.io/enforce=restricted --overwrite
kubectl apply -n corral-e2e -f examples/agent.yaml -f examples/session.yaml
kubectl wait -n corral-e2e --for=jsonpath='{.status.phase}'=Succeeded session --all --timeout=600s
