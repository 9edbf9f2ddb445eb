#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries for the memory tests (tests/_postgres.py starts
# its own throwaway server from them, as an unprivileged user, on a loopback port). Does nothing
# when initdb is already there. Debian's package would create and start a "main" cluster; the
# tests never use it, so that is switched off before installing. Needs root to install.
set -euo pipefail

# One installer at a time on this machine (test workers may need it at once): apt and dpkg
# refuse a second caller, and the check below must see what the first one installed.
mkdir -p "${CORRAL_CACHE:-$HOME/.cache/corral}"
exec 8>"${CORRAL_CACHE:-$HOME/.cache/corral}/.apt.lock"
flock 8
found=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n1 || true)
if [[ -n "$found" ]]; then
  echo "install-postgres: present ($found)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-postgres: PostgreSQL is missing and this is not root: install the" \
       "'postgresql' package, or run this script as root" >&2
  exit 1
fi
start=$(date +%s)
mkdir -p /etc/postgresql-common
conf=/etc/postgresql-common/createcluster.conf
if ! grep -qs '^create_main_cluster' "$conf"; then
  echo "create_main_cluster = false" >> "$conf"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends postgresql >/dev/null
found=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n1 || true)
if [[ -z "$found" ]]; then
  echo "install-postgres: installed, but no initdb under /usr/lib/postgresql" >&2
  exit 1
fi
echo "install-postgres: installed $found in $(( $(date +%s) - start ))s"
