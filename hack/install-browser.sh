#!/usr/bin/env bash
# Installs what the console's browser tests drive (tests/browser, docs/console.md): Debian's
# `chromium` when it is missing, and playwright-core (exact version locked by
# tests/browser/package-lock.json) into a cache keyed by the lock's sha256. playwright-core
# downloads no browser; the tests point it at the system chromium.
# Prints two lines: the directory holding node_modules, then the chromium binary.
# Exits non-zero (with the reason on stderr) when anything cannot be installed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$REPO/tests/browser"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/corral/browser"

# One installer at a time on this machine (test workers may need it at once): apt and dpkg
# refuse a second caller, and the check below must see what the first one installed.
mkdir -p "${CORRAL_CACHE:-$HOME/.cache/corral}"
exec 8>"${CORRAL_CACHE:-$HOME/.cache/corral}/.apt.lock"
flock 8
chromium_bin() {
  command -v chromium || command -v chromium-browser || true
}

if [[ -z "$(chromium_bin)" ]]; then
  command -v apt-get >/dev/null || { echo "install-browser: no chromium and no apt-get" >&2; exit 1; }
  sudo_=""
  [[ $(id -u) -eq 0 ]] || sudo_="sudo"
  # Debian's package; its dependencies (fonts, libnss3, ...) come with it.
  $sudo_ apt-get -o DPkg::Lock::Timeout=600 install -y -q chromium >&2 || {
    $sudo_ apt-get -o DPkg::Lock::Timeout=600 update -q >&2 && $sudo_ apt-get -o DPkg::Lock::Timeout=600 install -y -q chromium >&2
  } || { echo "install-browser: apt-get could not install chromium" >&2; exit 1; }
fi
browser="$(chromium_bin)"
[[ -n "$browser" ]] || { echo "install-browser: chromium is still missing" >&2; exit 1; }

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "install-browser: $tool is not installed" >&2; exit 1; }
done
key=$(cat "$LOCK/package.json" "$LOCK/package-lock.json" | sha256sum | cut -d' ' -f1)
dir="$CACHE/$key"
if [[ ! -f "$dir/.installed" ]]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$LOCK/package.json" "$LOCK/package-lock.json" "$dir/"
  # No install scripts: playwright-core's would fetch nothing anyway, and we want nothing fetched.
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$dir/.installed"
fi
echo "$dir"
echo "$browser"
