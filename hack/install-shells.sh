#!/usr/bin/env bash
# Installs Debian's zsh and fish for the completion tests (tests/unit/cli/test_completion.py
# loads `corral completion zsh|fish` into the real shells). Does nothing when both are there.
# Needs root to install.
set -euo pipefail

# One installer at a time on this machine (apt and dpkg refuse a second caller).
mkdir -p "${CORRAL_CACHE:-$HOME/.cache/corral}"
exec 8>"${CORRAL_CACHE:-$HOME/.cache/corral}/.apt.lock"
flock 8
if command -v zsh >/dev/null && command -v fish >/dev/null; then
  echo "install-shells: present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-shells: zsh or fish is missing and this is not root: install the 'zsh' and" \
       "'fish' packages, or run this script as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends zsh fish >/dev/null
echo "install-shells: installed zsh and fish"
