#!/usr/bin/env bash
# Builds Corral's images here, with no registry: a base image from a debootstrap root filesystem
# (Debian bookworm, minbase + Python 3.11, venv, git, ripgrep, ca-certificates), then the
# operator and sandbox images from the project's own Dockerfiles with that base as `BASE`.
# Each image is saved as an OCI archive under ~/.cache/corral/images, keyed by its inputs (the
# base by this script's package list; the others by the Dockerfile, the base and every source
# file the Dockerfile copies), so a warm machine rebuilds nothing; the real node imports the
# archives into its containerd. Prints `KEY=VALUE` lines (BASE_IMAGE, BASE_OCI, OPERATOR_IMAGE,
# OPERATOR_OCI, SANDBOX_IMAGE, SANDBOX_OCI). Needs root, buildah, debootstrap
# (hack/node/install-packages.sh) and, for a Dockerfile with a Go stage, this machine's go.
#
# Until the Dockerfiles take `ARG BASE` themselves, a copy with `FROM ${BASE}` is built (the
# copy is made from the current Dockerfile each time, so it follows its changes).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
IMAGES="$CACHE/images"
MIRROR="${CORRAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
BASE_PACKAGES="python3,python3-venv,python-is-python3,git,ripgrep,ca-certificates"
t0=$(date +%s.%N)
# One build at a time on this machine (test runs may start side by side).
mkdir -p "$CACHE"
exec 9>"$CACHE/.build-images.lock"
flock 9
elapsed() { python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}s')" "$1"; }
log() { echo "build-images: $*" >&2; }
mkdir -p "$IMAGES"

# Make sure an archived image is in buildah's storage (a later build may start FROM it).
ensure_local() {  # ensure_local REF ARCHIVE
  if ! buildah inspect --type image "$1" >/dev/null 2>&1; then
    buildah pull -q "oci-archive:$2" >/dev/null
    # An archive pulled back may carry no name; tag its one image.
    buildah inspect --type image "$1" >/dev/null 2>&1 || buildah tag "$(buildah pull -q "oci-archive:$2")" "$1"
  fi
}

# ------------------------------------------------------------------------------ the base
base_key=$(printf '%s\n' "base-v1" "$SUITE" "$MIRROR" "$BASE_PACKAGES" | sha256sum | cut -c1-16)
BASE_IMAGE="localhost/corral-base:$base_key"
BASE_OCI="$IMAGES/corral-base-$base_key.oci.tar"
if [[ -s "$BASE_OCI" ]]; then
  log "$BASE_IMAGE: cached in $BASE_OCI"
else
  t=$(date +%s.%N)
  rootfs=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap $SUITE (minbase + $BASE_PACKAGES) from $MIRROR"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
    > "$CACHE/debootstrap.log" 2>&1 || { tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/root/.cache
  printf 'nameserver 127.0.0.1\n' > "$rootfs/etc/resolv.conf"  # the runtime mounts its own
  log "debootstrap done in $(elapsed "$t")"
  c=$(buildah from scratch)
  mnt=$(buildah mount "$c")
  tar -C "$rootfs" -cf - . | tar -C "$mnt" -xf - --numeric-owner
  buildah umount "$c" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd '["/bin/bash"]' \
    --label org.opencontainers.image.description="Corral base: Debian $SUITE minbase + $BASE_PACKAGES" "$c"
  buildah commit -q --rm "$c" "$BASE_IMAGE" >/dev/null
  buildah push -q "$BASE_IMAGE" "oci-archive:$BASE_OCI.tmp:$BASE_IMAGE" >&2
  mv "$BASE_OCI.tmp" "$BASE_OCI"
  rm -rf "$rootfs"; trap - EXIT
  log "$BASE_IMAGE: built $BASE_OCI in $(elapsed "$t")"
fi

# ---------------------------------------------------------------- the project's images
# A Dockerfile with `ARG BASE` / `FROM ${BASE}` (and `ARG GO_IMAGE` / `FROM ${GO_IMAGE}` for a
# Go build stage): the project's own lines where it has them already, else a copy with every
# `FROM python:3.11-slim-bookworm` and `FROM golang:<tag>` replaced.
patched_dockerfile() {  # patched_dockerfile SRC DEST
  local src=$1 dest=$2 args=()
  grep -q '^ARG BASE' "$src" || args+=('ARG BASE=python:3.11-slim-bookworm')
  if grep -qE '^FROM golang:' "$src" && ! grep -q '^ARG GO_IMAGE' "$src"; then
    args+=("ARG GO_IMAGE=$(grep -oE '^FROM golang:[^ ]+' "$src" | head -n1 | cut -c6-)")
  fi
  { ((${#args[@]})) && printf '%s\n' "${args[@]}"
    sed -E -e 's#^FROM python:3\.11-slim-bookworm#FROM ${BASE}#' \
           -e 's#^FROM golang:[^ ]+#FROM ${GO_IMAGE}#' "$src"; } > "$dest"
}

# The Go toolchain image for a Dockerfile's Go build stage: the base with this machine's Go
# (the one hack/ builds everything else with), kept in buildah's storage only.
go_image() {  # go_image -> sets GO_IMAGE
  local goroot key t c mnt
  goroot=$(go env GOROOT)
  key=$(printf '%s\n' "$BASE_IMAGE" "$(go version)" "$goroot" | sha256sum | cut -c1-16)
  GO_IMAGE="localhost/corral-go:$key"
  if buildah inspect --type image "$GO_IMAGE" >/dev/null 2>&1; then
    log "$GO_IMAGE: cached ($(go version | cut -d' ' -f3))"
    return 0
  fi
  t=$(date +%s.%N)
  ensure_local "$BASE_IMAGE" "$BASE_OCI"
  c=$(buildah from --pull-never "$BASE_IMAGE")
  mnt=$(buildah mount "$c")
  mkdir -p "$mnt/usr/local"
  cp -a "$goroot" "$mnt/usr/local/go"
  buildah umount "$c" >/dev/null
  buildah config --env PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env GOTOOLCHAIN=local --env GOPATH=/go "$c"
  buildah commit -q --rm "$c" "$GO_IMAGE" >/dev/null
  log "$GO_IMAGE: built from $goroot in $(elapsed "$t")"
}

# A build context holding exactly what the Dockerfile COPYs from it (files git would see:
# tracked, or untracked and not ignored), so the image key changes only with those files.
copy_sources() {  # copy_sources DOCKERFILE -> one source path a line
  grep -E '^(COPY|ADD)[[:space:]]' "$1" | grep -v -- '--from=' \
    | sed -E 's/^(COPY|ADD)[[:space:]]+(--[^[:space:]]+[[:space:]]+)*//' \
    | awk '{ for (i = 1; i < NF; i++) print $i }' | sort -u
}
make_context() {  # make_context DOCKERFILE DIR -> prints the sources' hash
  local paths=()
  mapfile -t paths < <(copy_sources "$1")
  (cd "$REPO" && git ls-files -co --exclude-standard -z -- "${paths[@]}" \
    | xargs -0 -I{} sh -c 'test -f "{}" && printf "%s\0" "{}"' \
    | tar --null -T - -cf -) | tar -C "$2" -xf -
  (cd "$2" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)
}
workdir=$(mktemp -d "$CACHE/context.XXXXXX")
trap 'rm -rf "$workdir"' EXIT

build_image() {  # build_image NAME DOCKERFILE -> sets REF and OCI
  local name=$1 src=$2 t df key context sources_hash
  df="$workdir/Dockerfile.$name"
  context="$workdir/$name"
  mkdir -p "$context"
  patched_dockerfile "$REPO/$src" "$df"
  sources_hash=$(make_context "$df" "$context")
  local go_arg=()
  if grep -q 'FROM ${GO_IMAGE}' "$df"; then
    go_image
    go_arg=(--build-arg "GO_IMAGE=$GO_IMAGE")
  fi
  key=$(printf '%s\n' "$(sha256sum < "$df")" "$BASE_IMAGE" "${go_arg[*]}" "$sources_hash" \
    | sha256sum | cut -c1-16)
  REF="localhost/$name:$key"
  OCI="$IMAGES/$name-$key.oci.tar"
  if [[ -s "$OCI" ]]; then
    log "$REF: cached in $OCI"
    return 0
  fi
  t=$(date +%s.%N)
  ensure_local "$BASE_IMAGE" "$BASE_OCI"
  # The build's RUN steps reach Debian's packages and PyPI through this machine's network; the
  # machine's CA bundle and a pip configuration are mounted for them only (not kept in the
  # image). pip prefers wheels: a dependency whose newest release is only an sdist needing a
  # Rust toolchain (ripgrep 15.1.0 today) then installs from its newest wheel instead.
  local mounts=() pipconf="$CACHE/build-pip.conf"
  printf '[global]\nprefer-binary = true\n' > "$pipconf"
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    mounts+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    printf 'cert = /etc/ssl/certs/ca-certificates.crt\n' >> "$pipconf"
  fi
  mounts+=(-v "$pipconf:/etc/pip.conf:ro")
  # A Go stage downloads its modules (the gateway's smokescreen) into this machine's module
  # cache, which `make gateway` fills too: a warm machine downloads nothing.
  if [[ ${#go_arg[@]} -gt 0 ]]; then
    local modcache
    modcache=$(go env GOMODCACHE 2>/dev/null || true)
    if [[ -n "$modcache" ]]; then
      mkdir -p "$modcache"
      mounts+=(-v "$modcache:/go/pkg/mod")
    fi
  fi
  buildah bud -q --isolation chroot --network host --pull-never --layers=false \
    "${mounts[@]}" --build-arg "BASE=$BASE_IMAGE" "${go_arg[@]}" -f "$df" -t "$REF" "$context" \
    > "$CACHE/build-$name.log" 2>&1 || { tail -40 "$CACHE/build-$name.log" >&2; return 1; }
  buildah push -q "$REF" "oci-archive:$OCI.tmp:$REF" >&2
  mv "$OCI.tmp" "$OCI"
  log "$REF: built $OCI in $(elapsed "$t")"
  # The archive is what the node imports: drop this image's older archives and every copy of
  # it in buildah's storage (the base and the Go image stay there for the next build).
  find "$IMAGES" -maxdepth 1 -name "$name-*.oci.tar" ! -name "$name-$key.oci.tar" -delete
  buildah images --noheading --format '{{.Name}}:{{.Tag}}' | grep -E "^localhost/$name:" \
    | xargs -r buildah rmi -f >/dev/null 2>&1 || true
}

build_image corral-operator operator/Dockerfile
OPERATOR_IMAGE=$REF OPERATOR_OCI=$OCI
build_image corral-sandbox harness_image/Dockerfile
SANDBOX_IMAGE=$REF SANDBOX_OCI=$OCI

log "done in $(elapsed "$t0")"
echo "BASE_IMAGE=$BASE_IMAGE"
echo "BASE_OCI=$BASE_OCI"
echo "OPERATOR_IMAGE=$OPERATOR_IMAGE"
echo "OPERATOR_OCI=$OPERATOR_OCI"
echo "SANDBOX_IMAGE=$SANDBOX_IMAGE"
echo "SANDBOX_OCI=$SANDBOX_OCI"
