#!/usr/bin/env bash
# The demo `make demo` runs: the example Session on a fresh copy of the example repository.
#
# It copies examples/demo/repo to a temporary directory, makes it a git repository with one
# commit, and runs `corral run` on it. With no ANTHROPIC_API_KEY the scripted demo model plays
# examples/demo/scenario.yaml, so it needs no network and no cluster; with a key, Claude works
# on the same task. The agent's commits go on the session's branch (the copy's main is left
# as it was). Afterwards it shows what the agent changed and where the record is (outside the
# workspace: `corral run` keeps its state, logs and secrets out of the repository).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corral="${CORRAL_BIN:-$root/.venv/bin/corral}"
if [[ ! -x "$corral" ]]; then
  corral="$(command -v corral || true)"
fi
if [[ -z "$corral" ]]; then
  echo "demo: no corral command; run 'make demo' (it installs one into .venv)" >&2
  exit 2
fi

workspace="$(mktemp -d "${TMPDIR:-/tmp}/corral-demo.XXXXXX")"
cp -R "$root/examples/demo/repo/." "$workspace/"
git -C "$workspace" init -q -b main
git -C "$workspace" add -A
git -C "$workspace" -c user.name=corral -c user.email=corral@localhost \
  commit -q -m "The example repository, before the agent"

state_home="${XDG_STATE_HOME:-$HOME/.local/state}"
state_dir="${CORRAL_DEMO_STATE_DIR:-$state_home/corral/runs/demo-$(date +%Y%m%d-%H%M%S)}"
echo "demo: workspace $workspace (a copy of examples/demo/repo)"
if [[ -z "${ANTHROPIC_API_KEY:-}" ]]; then
  echo "demo: no ANTHROPIC_API_KEY, so the scripted demo model plays examples/demo/scenario.yaml"
fi

# SCENARIO=plan: the same fix under a forced plan whose checked step misses once and is
# replanned (examples/session-plan.yaml, docs/turns.md). The scripted model plays each
# Session's own conversation of scenario.yaml, so only the Session file changes.
session_file="$root/examples/session.yaml"
case "${SCENARIO:-}" in
  "") ;;
  plan) session_file="$root/examples/session-plan.yaml" ;;
  *) echo "demo: unknown SCENARIO=${SCENARIO} (known: plan)" >&2; exit 2 ;;
esac

base=$(git -C "$workspace" rev-parse HEAD)
status=0
"$corral" run -f "$session_file" --workspace "$workspace" \
  --state-dir "$state_dir" "$@" || status=$?

branch=$(git -C "$workspace" for-each-ref --format='%(refname:short)' refs/heads/corral \
  | head -n 1)
branch="${branch:-HEAD}"
echo
echo "demo: what the agent changed in $workspace on $branch (committed at each turn's end, as"
echo "      the agent; \`git -C $workspace switch $branch\` checks it out):"
git -C "$workspace" --no-pager log --format='  %h %an: %s' "$base..$branch"
git -C "$workspace" --no-pager diff --stat "$base" "$branch"
git -C "$workspace" --no-pager diff "$base" "$branch"
echo "demo: the record of the session is in $state_dir"
echo "      state.json (phase, turns, usage), ledger.jsonl (one receipt per turn),"
echo "      transcript.jsonl (every wire event), logs/ (the model, custodian and harness)"
exit "$status"
