"""The workspace checkout: one script for the cold pod's init container and a pooled pod's adopt.

Clone, then put the checkout on the session's branch. Values arrive as positional parameters,
never spliced into the script, so a hostile repo or ref cannot inject shell. The volume's root
belongs to root (the kubelet makes it) while this runs as the tools uid: git's ownership check
is satisfied for this one directory on the command line (protected configuration, which nothing
in the repository can set). The destination may be relative (a pooled pod's exec service runs
it in its root); git's ownership check wants the absolute path, so it is resolved first.

It trusts nothing the agent could have written (docs/security.md, "the checkout"). The init
containers run again in the same pod after a node or runtime restart, with the agent's files
still in the workspace and the git credentials mounted, so:
- no configuration but the command line's: no system or global file (`GIT_CONFIG_NOSYSTEM`,
  `GIT_CONFIG_GLOBAL=/dev/null`, so a `.gitconfig` planted in a HOME is never read), no
  configuration or repository location from the environment, no templates, no hooks, no
  fsmonitor, no `ext::` transport;
- the workspace is emptied before git runs at all, and cloned afresh: git never runs in the
  agent's repository, so its `.git/config`, hooks and `url.*.insteadOf` are never in effect.
  (Simpler and sturdier than reusing the tree: anything kept would have to be re-checked, and a
  clone is what the first run did anyway.) A directory the agent made unwritable is made
  writable first, so a re-run cannot be wedged;
- the credentials reach git through a one-shot helper on the command line that answers `get`
  from the mounted file and ignores `store` and `erase`; every other helper is reset first.
"""

from __future__ import annotations

CHECKOUT_SCRIPT = """set -eu
repo="$1"; ref="$2"; branch="$3"; dest=$(cd "$4" && pwd -P); creds="${5:-}"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0
unset GIT_DIR GIT_WORK_TREE GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY \
  GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT \
  GIT_TEMPLATE_DIR XDG_CONFIG_HOME
if ! find "$dest" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + 2>/dev/null; then
  chmod -R u+rwX -- "$dest" 2>/dev/null || true
  find "$dest" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
fi
set -- -c "safe.directory=$dest" -c core.hooksPath=/dev/null -c core.fsmonitor=false \
  -c protocol.ext.allow=never -c credential.helper=
if [ -n "$creds" ]; then
  export CORRAL_GIT_CREDENTIALS="$creds"
  helper='!f() { if [ "$1" = get ]; then exec git credential-store'
  set -- "$@" -c "credential.helper=$helper"' --file="$CORRAL_GIT_CREDENTIALS" get; fi; }; f'
fi
# A new pod's first connections may be refused while the network programs its policy (kube-router,
# Calico: asynchronous to the pod's start): a clone that could not connect is tried again, for
# about 10 s in all; any other failure (no such repository, refused credentials) is final.
attempt=1; err=$(mktemp)
until git "$@" clone --quiet --no-checkout --template= -- "$repo" "$dest" 2>"$err"; do
  cat "$err" >&2
  if [ "$attempt" -ge 5 ] || ! grep -qiE 'connect|could not read from remote|timed out' "$err"
  then rm -f "$err"; exit 128; fi
  find "$dest" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
  sleep "$attempt"; attempt=$((attempt + 1))
done
rm -f "$err"
cd "$dest"
if rev=$(git "$@" rev-parse --verify --quiet "refs/remotes/origin/$ref^{commit}"); then :
elif rev=$(git "$@" rev-parse --verify --quiet "$ref^{commit}"); then :
else
  git "$@" fetch --quiet origin "$ref"
  rev=$(git "$@" rev-parse --verify FETCH_HEAD^{commit})
fi
# The branch the ref names (HEAD: the remote's default) is never the session branch: a session
# does not push onto the branch its work starts from (corral_common.branches.ref_branch).
case "$ref" in
  refs/heads/*) named=${ref#refs/heads/} ;;
  refs/remotes/origin/*) named=${ref#refs/remotes/origin/} ;;
  origin/*) named=${ref#origin/} ;;
  *) named=$ref ;;
esac
if target=$(git "$@" symbolic-ref -q "refs/remotes/origin/$named" 2>/dev/null); then
  named=${target#refs/remotes/origin/}
fi
if [ "$named" = "$branch" ]; then
  echo "checkout refused: the session branch '$branch' is the branch spec.workspace.ref" \
    "'$ref' names on the remote; a session never pushes onto the branch its work starts" \
    "from: name another spec.workspace.branch" >&2
  exit 3
fi
git "$@" checkout --quiet -B "$branch" "$rev"
"""


# What the checkout's process environment says of git, for a container that runs the script:
# the same as the script exports, so nothing run before it (or instead of it) reads a HOME.
CHECKOUT_GIT_ENV = (
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
)


def checkout_argv(repo: str, ref: str, branch: str, dest: str) -> list[str]:
    """The command that checks `repo` at `ref` out onto `branch` in `dest`, without credentials
    and without ever prompting for them."""
    return [
        "env", "HOME=/tmp", *(f"{k}={v}" for k, v in CHECKOUT_GIT_ENV),
        "sh", "-c", CHECKOUT_SCRIPT, "checkout", repo, ref, branch, dest,
    ]  # fmt: skip
