#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane (kube-apiserver, kube-controller-manager, kubectl),
# etcd and helm from the Go module proxy into a cache outside the clone.
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod points every k8s.io staging
# module at ./staging. A wrapper module requires k8s.io/kubernetes and replaces each staging
# module by its published v0.Y.Z; the list is derived from the release's own go.mod.
# The result is keyed by the pins, so a warm machine rebuilds nothing.
#
# `build-control-plane.sh node` also builds the node's kubelet and kube-proxy, and the
# kube-scheduler that places pods on a real node, from the same wrapper module into the same
# directory (their own stamp, .node-complete), after the control plane; without the argument
# nothing of the node is built.
set -euo pipefail

WANT_NODE=0
[[ "${1:-}" == node ]] && WANT_NODE=1

K8S_VERSION="${CORRAL_K8S_VERSION:-v1.34.4}"
HELM_VERSION="${CORRAL_HELM_VERSION:-v3.19.0}"
CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
OUT="$CACHE/bin/k8s-$K8S_VERSION"
STAMP="$OUT/.complete"

# One build at a time: a second caller (a test fixture, `make node`) waits for the first, then
# finds its stamp; two at once would remove each other's wrapper module.
mkdir -p "$CACHE"
exec 9>"$CACHE/.build-control-plane.lock"
flock 9

NODE_STAMP="$OUT/.node-complete"

# kubelet, kube-proxy and kube-scheduler from the control plane's wrapper module (its go.mod, go.sum and
# caches), added to it by a second tools file; the control plane's own outputs are untouched.
build_node() {
  if [[ -f "$NODE_STAMP" && -x "$OUT/kubelet" && -x "$OUT/kube-proxy" && -x "$OUT/kube-scheduler" ]]; then
    return 0
  fi
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
  export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}" GOCACHE="${GOCACHE:-$CACHE/gocache}"
  local work="$CACHE/wrapper-$K8S_VERSION"
  local major_minor="${K8S_VERSION%.*}"
  [[ -f "$work/go.mod" ]] || { echo "no wrapper module at $work" >&2; return 1; }
  cd "$work"
  echo "building kubelet, kube-proxy and kube-scheduler $K8S_VERSION into $OUT" >&2
  cat > tools_node.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  go mod tidy >&2
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${major_minor#v1.} \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${major_minor#v1.}"
  for cmd in kubelet kube-proxy kube-scheduler; do
    go build -trimpath -ldflags "$ldflags" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
    echo "built $cmd" >&2
  done
  touch "$NODE_STAMP"
}

if [[ -f "$STAMP" && -x "$OUT/helm" ]]; then
  if ((WANT_NODE)); then build_node; fi
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
if ((WANT_NODE)); then build_node; fi
echo "$OUT"
