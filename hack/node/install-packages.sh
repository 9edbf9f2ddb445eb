#!/usr/bin/env bash
# Installs the Debian packages a real node needs: containerd, runc, the CNI plugins, buildah
# (images), debootstrap (the base root filesystem), iptables, ipset, iproute2, busybox-static
# (the pause image) and conntrack. Only what is missing is installed; a machine that has them
# all does nothing. Needs root (CI and this machine run as root).
set -euo pipefail

# One installer at a time on this machine (test workers may need it at once): apt and dpkg
# refuse a second caller, and the check below must see what the first one installed.
mkdir -p "${CORRAL_CACHE:-$HOME/.cache/corral}"
exec 8>"${CORRAL_CACHE:-$HOME/.cache/corral}/.apt.lock"
flock 8
start=$(date +%s.%N)
pkgs=(containerd runc containernetworking-plugins buildah debootstrap iptables ipset iproute2
      busybox-static conntrack util-linux)
# A package can be installed while its binary is what we look for; check by dpkg status.
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-packages: all present (${pkgs[*]}) in $(python3 -c "import time;print(f'{time.time()-$start:.1f}')")s"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-packages: missing ${missing[*]} and not root: cannot install them" >&2
  exit 1
fi
echo "install-packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts containerd as a service on install; the node runs its own instance with its own
# root, state and socket, so the system one is not needed (and is left as the admin had it
# before only if it was already there).
if [[ " ${missing[*]} " == *" containerd "* ]] && command -v systemctl >/dev/null \
   && systemctl is-system-running >/dev/null 2>&1; then
  systemctl disable --now containerd >/dev/null 2>&1 || true
fi
echo "install-packages: installed ${missing[*]} in $(python3 -c "import time;print(f'{time.time()-$start:.1f}')")s"
