#!/usr/bin/env bash
# The suite passes wherever it is cloned (docs/operations.md, "Running the tests"): the unit tier
# and the local node's tier run from a copy of this tree under a path with a space in it, beside
# `make test`'s main run (which leaves them out), as one more process beside its workers.
#
#   hack/path-tests.sh start   copy the tree, make its venv, start the run in the background
#   hack/path-tests.sh wait    wait for it; its exit status, its output on failure
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
state="$src/.path-tests"
case "${1:-}" in
start)
  rm -rf "$state" && mkdir -p "$state"
  dest=$(mktemp -d "${TMPDIR:-/tmp}/corral clone.XXXXXX")
  chmod 755 "$dest"  # as a clone is (mktemp makes it 0700: the containers' uids could not enter)
  echo "$dest" > "$state/dest"
  # What the tree holds now, committed or not (the tests of this tree, not of HEAD); a tracked
  # file deleted in the tree is listed too, and left out.
  git -C "$src" ls-files -z -co --exclude-standard \
    | (cd "$src" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$dest"
  (
    cd "$dest"
    make -s venv > "$state/log" 2>&1
    # Port block 7 (corral_dev.ports): the main run's workers take 0-2, its controller 8.
    rc=0
    PYTEST_XDIST_WORKER=gw7 .venv/bin/pytest -q -p no:cacheprovider -rs \
      tests/unit tests/cluster/test_localnode.py >> "$state/log" 2>&1 || rc=$?
    echo "$rc" > "$state/rc"
  ) < /dev/null > /dev/null 2>&1 &
  echo $! > "$state/pid"
  echo "path test: the unit and local-node tiers run from '$dest' (log: .path-tests/log)"
  ;;
wait)
  if [ ! -f "$state/pid" ]; then
    echo "path test FAILED: it did not start (hack/path-tests.sh start)" >&2
    exit 1
  fi
  pid=$(cat "$state/pid")
  dest=$(cat "$state/dest")
  status=0
  # Not our child once make's recipe line ended: wait for the pid, then read its result.
  while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  tail -n 1 "$state/log"
  # 5 (no test ran) fails like any other status but 0.
  if [ "$(cat "$state/rc" 2>/dev/null)" != 0 ]; then
    echo "path test FAILED in '$dest': the unit or local-node tier from a path with a space" >&2
    tail -n 60 "$state/log" >&2
    status=1
  else
    rm -rf "$dest"
  fi
  exit $status
  ;;
*)
  echo "usage: $0 start|wait" >&2
  exit 2
  ;;
esac
