"""The workspace checkout: one script for the cold pod's init container and a pooled pod's adopt.

Clone, then put the checkout on the session's branch. Values arrive as positional parameters,
never spliced into the script, so a hostile repo or ref cannot inject shell. A retried run finds
what a failed attempt left in the directory, so it starts from an empty one. The volume's root
belongs to root (the kubelet makes it) while this runs as the tools uid: git's ownership check
is satisfied for this one directory on the command line (protected configuration, which nothing
in the repository can set). The destination may be relative (a pooled pod's exec service runs
it in its root); git's ownership check wants the absolute path, so it is resolved first.
"""

from __future__ import annotations

CHECKOUT_SCRIPT = """set -eu
repo="$1"; ref="$2"; branch="$3"; dest=$(cd "$4" && pwd -P); creds="${5:-}"
find "$dest" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
if [ -n "$creds" ]; then
  set -- -c "safe.directory=$dest" -c "credential.helper=store --file=$creds"
else
  set -- -c "safe.directory=$dest"
fi
git "$@" clone --quiet --no-checkout -- "$repo" "$dest"
cd "$dest"
if rev=$(git "$@" rev-parse --verify --quiet "refs/remotes/origin/$ref^{commit}"); then :
elif rev=$(git "$@" rev-parse --verify --quiet "$ref^{commit}"); then :
else
  git "$@" fetch --quiet origin "$ref"
  rev=$(git "$@" rev-parse --verify FETCH_HEAD^{commit})
fi
git "$@" checkout --quiet -B "$branch" "$rev"
"""


def checkout_argv(repo: str, ref: str, branch: str, dest: str) -> list[str]:
    """The command that checks `repo` at `ref` out onto `branch` in `dest`, without credentials
    and without ever prompting for them."""
    return [
        "env", "HOME=/tmp", "GIT_TERMINAL_PROMPT=0",
        "sh", "-c", CHECKOUT_SCRIPT, "checkout", repo, ref, branch, dest,
    ]  # fmt: skip
