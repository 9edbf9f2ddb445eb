#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane (kube-apiserver, kube-controller-manager, kubectl),
# etcd and helm from the Go module proxy into a cache outside the clone.
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod points every k8s.io staging
# module at ./staging. A wrapper module requires k8s.io/kubernetes and replaces each staging
# module by its published v0.Y.Z; the list is derived from the release's own go.mod.
# The result is keyed by the pins, so a warm machine rebuilds nothing.
set -euo pipefail

K8S_VERSION="${CORRAL_K8S_VERSION:-v1.34.4}"
HELM_VERSION="${CORRAL_HELM_VERSION:-v3.19.0}"
CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
OUT="$CACHE/bin/k8s-$K8S_VERSION"
STAMP="$OUT/.complete"

if [[ -f "$STAMP" && -x "$OUT/helm" ]]; then
  echo "$OUT"
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}" GOCACHE="${GOCACHE:-$CACHE/gocache}"
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE"
work="$CACHE/wrapper-$K8S_VERSION"
rm -rf "$work" && mkdir -p "$work"
cd "$work"

echo "building control plane $K8S_VERSION into $OUT (first time only; this takes a while)" >&2
kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
minor="${K8S_VERSION#v1.}"        # 34.4
staging_version="v0.${minor}"     # v0.34.4
major_minor="${K8S_VERSION%.*}"   # v1.34

{
  echo "module corral.dev/controlplane"
  echo
  grep -E '^go [0-9]' "$kmod"
  grep -E '^godebug' "$kmod" || true
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  grep -E '=> \./staging/' "$kmod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
go mod tidy >&2

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${major_minor#v1.} \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${major_minor#v1.}"
for cmd in kube-apiserver kube-controller-manager kubectl; do
  go build -trimpath -ldflags "$ldflags" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
  echo "built $cmd" >&2
done
go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3 >&2
echo "built etcd" >&2
GOBIN="$OUT" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
echo "built helm" >&2
touch "$STAMP"
echo "$OUT"
