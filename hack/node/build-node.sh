#!/usr/bin/env bash
# Builds what a real node runs besides Debian's containerd and runc, into caches keyed by
# version, and prints `KEY=PATH` lines the node's starter reads:
#   K8S_BIN      kubelet, kube-proxy, kube-scheduler (and the control plane) from the control
#                plane's wrapper module (hack/build-control-plane.sh node), at its pinned version
#   COREDNS      CoreDNS at a pinned version, built with the plugins the node's Corefile uses
#   KUBE_ROUTER  kube-router (only its NetworkPolicy firewall controller is used)
#   PAUSE_OCI    the pod sandbox ("pause") image localhost/pause:1, an OCI archive built here
#                from busybox-static (the node imports it into its containerd)
#   COREDNS_OCI  CoreDNS as image localhost/coredns:<version> (scratch + the static binary)
# A warm machine rebuilds nothing. Needs go, buildah and busybox-static
# (hack/node/install-packages.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
COREDNS_VERSION="${CORRAL_COREDNS_VERSION:-v1.13.1}"      # client-go v0.34, as Kubernetes 1.34
KUBE_ROUTER_VERSION="${CORRAL_KUBE_ROUTER_VERSION:-v2.1.0}"
PAUSE_IMAGE="localhost/pause:1"
t0=$(date +%s.%N)
# One build at a time on this machine (test runs may start side by side).
mkdir -p "$CACHE"
exec 9>"$CACHE/.build-node.lock"
flock 9
elapsed() { python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}s')" "$1"; }
log() { echo "build-node: $*" >&2; }

export GOTOOLCHAIN=local CGO_ENABLED=0
export GOMODCACHE="${GOMODCACHE:-$CACHE/gomod}" GOCACHE="${GOCACHE:-$CACHE/gocache}"

# kubelet, kube-proxy, kube-scheduler (+ the control plane, if this machine has not built it yet).
t=$(date +%s.%N)
kdir="$CACHE/bin/k8s-${CORRAL_K8S_VERSION:-v1.34.4}"
before=$(test -f "$kdir/.node-complete" -a -x "$kdir/kube-scheduler" && echo cached || echo built)
k8s_bin=$(bash "$HERE/../build-control-plane.sh" node | tail -n1)
log "kubelet, kube-proxy, kube-scheduler: $k8s_bin ($before, $(elapsed "$t"))"

gobuild() {  # gobuild NAME MODULE/PKG VERSION -> prints the binary's path
  local name=$1 pkg=$2 version=$3 dir="$CACHE/bin/$1-$3"
  if [[ -x "$dir/$name" ]]; then
    log "$name $version: cached in $dir"
  else
    local t; t=$(date +%s.%N)
    mkdir -p "$dir.tmp"
    GOBIN="$dir.tmp" go install -trimpath -ldflags "-s -w" "$pkg@$version" >&2
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    log "$name $version: built into $dir in $(elapsed "$t")"
  fi
  echo "$dir/$name"
}
# CoreDNS with only the plugins the node's Corefile uses (corral_dev/_realnode_config.py):
# `go install github.com/coredns/coredns` compiles every plugin and downloads their cloud SDKs
# (~900 MB of modules, ~20 of a cold build's minutes); a main of our own that imports four
# plugins builds in about a minute, its client-go shared with the kubelet's build cache.
COREDNS_PLUGINS=(errors ready kubernetes cache)
coredns_build() {  # -> prints the binary's path
  local key dir work t
  key=$(printf '%s\n' "$COREDNS_VERSION" "${COREDNS_PLUGINS[@]}" | sha256sum | cut -c1-12)
  dir="$CACHE/bin/coredns-$COREDNS_VERSION-$key"
  if [[ -x "$dir/coredns" ]]; then
    log "coredns $COREDNS_VERSION (${COREDNS_PLUGINS[*]}): cached in $dir"
  else
    t=$(date +%s.%N)
    work="$CACHE/coredns-wrapper-$key"
    rm -rf "$work" && mkdir -p "$work"
    {
      echo "module corral.dev/coredns"
      echo
      echo "go 1.24.0"
      echo
      echo "require github.com/coredns/coredns $COREDNS_VERSION"
    } > "$work/go.mod"
    {
      echo "// The node's CoreDNS: the plugins its Corefile names, in CoreDNS's own order."
      echo "package main"
      echo
      echo "import ("
      for plugin in "${COREDNS_PLUGINS[@]}"; do
        echo "	_ \"github.com/coredns/coredns/plugin/$plugin\""
      done
      echo "	\"github.com/coredns/coredns/coremain\""
      echo ")"
      echo
      echo "func main() { coremain.Run() }"
    } > "$work/main.go"
    (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2 \
      && mkdir -p "$dir.tmp" && go build -trimpath -ldflags "-s -w" -o "$dir.tmp/coredns" . >&2)
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    log "coredns $COREDNS_VERSION (${COREDNS_PLUGINS[*]}): built into $dir in $(elapsed "$t")"
  fi
  echo "$dir/coredns"
}
coredns=$(coredns_build)
kube_router=$(gobuild kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
  "$KUBE_ROUTER_VERSION")

# Images: OCI archives built with buildah from scratch, keyed by what is inside them.
images="$CACHE/images"
mkdir -p "$images"
busybox=$(command -v busybox)
oci_image() {  # oci_image NAME:TAG KEY SETUP-FUNCTION -> prints the archive's path
  local ref=$1 key=$2 setup=$3 archive="$images/${1//[:\/]/_}-$2.oci.tar"
  if [[ -s "$archive" ]]; then
    log "$ref: cached in $archive"
  else
    local t c; t=$(date +%s.%N)
    c=$(buildah from scratch)
    # shellcheck disable=SC2064
    trap "buildah rm $c >/dev/null 2>&1 || true" RETURN
    "$setup" "$c"
    buildah commit -q --rm "$c" "$ref" >/dev/null
    trap - RETURN
    buildah push -q "$ref" "oci-archive:$archive.tmp:$ref" >&2
    mv "$archive.tmp" "$archive"
    log "$ref: built $archive in $(elapsed "$t")"
  fi
  echo "$archive"
}
pause_setup() {
  local c=$1 mnt
  mnt=$(buildah mount "$c")
  mkdir -p "$mnt/bin"
  cp "$busybox" "$mnt/bin/busybox"
  ln -s busybox "$mnt/bin/sleep"
  buildah umount "$c" >/dev/null
  # The sandbox container only holds the pod's namespaces; containerd SIGKILLs it on stop.
  buildah config --entrypoint '["/bin/sleep","inf"]' --cmd '' --user 65535:65535 "$c"
}
coredns_setup() {
  local c=$1
  buildah copy -q "$c" "$coredns" /coredns >/dev/null
  buildah config --entrypoint '["/coredns"]' --cmd '' --user 65532:65532 --port 53/udp "$c"
}
pause_key=$(sha256sum "$busybox" | cut -c1-16)
pause_oci=$(oci_image "$PAUSE_IMAGE" "$pause_key" pause_setup)
coredns_key=$(sha256sum "$coredns" | cut -c1-16)
coredns_oci=$(oci_image "localhost/coredns:$COREDNS_VERSION" "$coredns_key" coredns_setup)

log "done in $(elapsed "$t0")"
echo "K8S_BIN=$k8s_bin"
echo "COREDNS=$coredns"
echo "KUBE_ROUTER=$kube_router"
echo "PAUSE_IMAGE=$PAUSE_IMAGE"
echo "PAUSE_OCI=$pause_oci"
echo "COREDNS_IMAGE=localhost/coredns:$COREDNS_VERSION"
echo "COREDNS_OCI=$coredns_oci"
