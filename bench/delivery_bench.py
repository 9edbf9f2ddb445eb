"""Turn end to delivery record: how long the work of a turn takes to reach the remote.

A real harness, a real `corral-exec` (the tools container) and a real custodian run as in a
pod, with a `git daemon` on loopback as the remote. Each turn the scripted model answers with
one `bash` call that changes a file, then with its final text; the harness then commits,
hands the commit to the custodian and settles. The figure is measured from outside: from the
scripted model server's timestamp of the turn's last request (the request whose answer ends
the turn) to the moment the wire's long-poll shows the turn settled, which the harness
publishes only after the custodian answered the delivery; the custodian's delivery record
must then show the turn's revision pushed (checked every turn, untimed).

Two repositories: the demo repository (examples/demo/repo) and a generated one of 20,000
files with 200 commits of history (cached under ~/.cache/corral/bench). With `--baseline REV`
the code of git revision REV (its packages and its corral-exec, from `git archive`) runs the
same turns in the same run, turns of the two alternating so load falls on both alike; the
target is now / baseline <= 1.5 on each repository. Each figure is the median of `--turns`
turns (default 10), after one warm-up turn.

    python bench/delivery_bench.py [--turns 10] [--baseline REV (default: e074456)]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_bench import build_tree
from harness_bench import AGENT, checkout_baseline, start_exec, wait_ready
from steps_bench import build_baseline_exec

from corral_dev.ports import free_port

RATIO_TARGET = 1.5
# The last revision before delivery became a bundle the tools side writes (the custodian still
# fetched from the workspace): the figure the change is held to.
BEFORE_BUNDLES = "e074456"
REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corral" / "bench"
BIG_COMMITS = 200
GIT_ID = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def demo_remote(work: Path) -> Path:
    """The demo repository as a bare remote with one commit on main."""
    src = work / "demo-src"
    shutil.copytree(REPO_ROOT / "examples" / "demo" / "repo", src)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "the demo repository")
    bare = work / "remotes" / "demo.git"
    git(work, "clone", "-q", "--bare", str(src), str(bare))
    return bare


def big_remote(work: Path) -> Path:
    """20,000 files with 200 commits of history, built once and cached as a bare repository."""
    cached = CACHE / "delivery-20000-files-200-commits.git"
    if not (cached / "HEAD").exists():
        src = work / "big-src"
        build_tree(src)
        shutil.rmtree(src / ".git")  # build_tree's stand-in .git: this one is a repository
        git(src, "init", "-q", "-b", "main")
        git(src, "add", "-A")
        git(src, "commit", "-q", "-m", "commit 1")
        files = sorted(p for p in src.rglob("*.py"))
        for i in range(2, BIG_COMMITS + 1):
            for f in files[i * 7 % len(files) :][:5]:
                f.write_text(f.read_text() + f"y{i} = {i}\n")
            git(src, "commit", "-q", "-am", f"commit {i}")
        tmp = cached.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        git(work, "clone", "-q", "--bare", str(src), str(tmp))
        tmp.replace(cached)
        shutil.rmtree(src)
    bare = work / "remotes" / "big.git"
    git(work, "clone", "-q", "--bare", "--no-hardlinks", str(cached), str(bare))
    return bare


def start_git_daemon(base: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
         f"--base-path={base}", "--listen=127.0.0.1", f"--port={port}", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["git", "ls-remote", f"git://127.0.0.1:{port}/demo.git"], capture_output=True
        )
        if probe.returncode in (0, 128) and b"Connection refused" not in probe.stderr:
            return proc, port
        time.sleep(0.05)
    raise SystemExit("git daemon did not start")


@dataclass
class Sandbox:
    """One harness + exec service + custodian on one workspace, as a pod runs them."""

    kind: str
    procs: list[subprocess.Popen[bytes]]
    harness_url: str
    delivery_url: str
    wire_token: str
    conversation: str

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _env(baseline: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}
    if baseline is not None:
        env["PYTHONPATH"] = f"{baseline / 'api'}:{baseline / 'harness_image'}"
    return env


def _logged(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        wait_ready(url, proc)
    except SystemExit as exc:
        raise SystemExit(f"{exc}; its log {log}:\n{log.read_text()[-3000:]}") from None


def start_sandbox(
    work: Path,
    kind: str,
    repo: str,
    remote_url: str,
    model_url: str,
    *,
    baseline: Path | None,
    exec_binary: Path | None,
) -> Sandbox:
    root = work / f"{kind}-{repo}" / "workspace"
    root.parent.mkdir(parents=True)
    branch = f"corral/bench-{kind}"
    subprocess.run(["git", "clone", "-q", "-b", "main", remote_url, str(root)], check=True)
    git(root, "checkout", "-q", "-b", branch)
    procs: list[subprocess.Popen[bytes]] = []
    exec_proc, socket = start_exec(root.parent, root, binary=exec_binary)
    procs.append(exec_proc)

    secrets_dir = root.parent / "secrets"
    secrets_dir.mkdir()
    credential = secrets_dir / "custodian-credential"
    credential.write_text("bench-custodian-credential-0123456789")
    wire_token = "bench-wire-token-0123456789abcdef"
    (secrets_dir / "wire-token").write_text(wire_token)
    port, operator_port = free_port(), free_port()
    custodian_env = _env(baseline) | {
        "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}",
        "CORRAL_CUSTODIAN_OPERATOR_ADDR": f"127.0.0.1:{operator_port}",
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
        "CORRAL_WIRE_TOKEN_FILE": str(secrets_dir / "wire-token"),
        "CORRAL_UPSTREAM_URL": model_url,
        "ANTHROPIC_API_KEY": "bench-model-key-0123456789",
        "CORRAL_SESSION_NAME": "bench",
        "CORRAL_SESSION_NAMESPACE": "default",
        "CORRAL_SESSION_UID": "00000000-0000-0000-0000-000000000000",
        "CORRAL_STATE_DIR": str(root.parent / "custodian-state"),
        "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
        "CORRAL_GIT_REMOTE_URL": remote_url,
        "CORRAL_SESSION_BRANCH": branch,
    }
    if baseline is not None:
        # Before the change the custodian fetched the agent's commits from the workspace.
        custodian_env["CORRAL_WORKSPACE"] = str(root)
    argv = [sys.executable, "-m", "corral_custodian.main"]
    procs.append(_logged(argv, custodian_env, root.parent / "custodian.log"))
    custodian_url = f"http://127.0.0.1:{port}"
    _ready(custodian_url, procs[-1], root.parent / "custodian.log")

    harness_port = free_port()
    harness_env = _env(baseline) | {
        "CORRAL_HARNESS_ADDR": f"127.0.0.1:{harness_port}",
        "CORRAL_STATE_DIR": str(root.parent / "harness-state"),
        "CORRAL_GRANTED_ROOT": str(root),
        "ANTHROPIC_BASE_URL": model_url,
        "CORRAL_EXEC_SOCKET": str(socket),
        "CORRAL_CUSTODIAN_URL": custodian_url,
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
    }
    argv = [sys.executable, "-m", "corral_harness.main"]
    procs.append(_logged(argv, harness_env, root.parent / "harness.log"))
    harness_url = f"http://127.0.0.1:{harness_port}"
    _ready(harness_url, procs[-1], root.parent / "harness.log")
    return Sandbox(
        kind, procs, harness_url, f"http://127.0.0.1:{operator_port}/v1/delivery",
        wire_token, f"{kind}-{repo}",
    )  # fmt: skip


def timed_turn(client: httpx.Client, box: Sandbox, model_url: str, turn: int) -> float:
    """One turn; seconds from the turn's last model request to its settlement on the wire."""
    base = f"{box.harness_url}/agents/bench/{box.conversation}"
    admitted = client.post(base, json={"message": f"turn {turn}", "agent": AGENT})
    admitted.raise_for_status()
    sid, offset = admitted.json()["submissionId"], admitted.json()["offset"]
    while True:
        body = client.get(f"{base}/updates", params={"offset": offset, "wait": 60}).json()
        seen = time.time()
        offset = body["offset"]
        done = [e for e in body["events"] if e["type"] == "settled" and e["submissionId"] == sid]
        if done:
            break
    if done[0]["status"] != "completed":
        raise SystemExit(f"{box.kind}: turn {turn} did not complete: {done[0]}")
    requests = client.get(f"{model_url}/_requests", params={"conversation": box.conversation})
    last = max(r["ts"] for r in requests.json())
    record = client.get(
        box.delivery_url, headers={"authorization": f"Bearer {box.wire_token}"}
    ).json()["delivery"]
    if record.get("state") != "Delivered" or record.get("submissionId") != sid:
        raise SystemExit(f"{box.kind}: turn {turn} was not delivered: {record}")
    return seen - last


def short(repo: str) -> str:
    return "demo" if repo == "demo" else "big"


def turn_script(turns: int) -> list[dict[str, object]]:
    replies: list[dict[str, object]] = []
    for i in range(turns):
        command = f"echo 'change {i}' >> CHANGES.md"
        replies.append({"tool_use": {"name": "bash", "input": {"command": command}}})
        replies.append({"text": f"turn {i} done"})
    return replies


@contextlib.contextmanager
def bench_dir() -> Iterator[Path]:
    """A scratch directory, removed after the run unless CORRAL_BENCH_KEEP_STATE is set."""
    work = Path(tempfile.mkdtemp(prefix="corral-delivery-bench-"))
    try:
        yield work
    finally:
        if os.environ.get("CORRAL_BENCH_KEEP_STATE"):
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        default=BEFORE_BUNDLES,
        help=f"also run git revision REV (default {BEFORE_BUNDLES}, the last revision whose "
        "custodian fetched from the workspace); '' to run this tree alone",
    )
    parser.add_argument("--lenient", action="store_true", help="exit 0 on a missed target")
    args = parser.parse_args()
    kinds = ["now"] + (["before"] if args.baseline else [])
    missed = False
    with bench_dir() as work:
        remotes = {"demo": demo_remote(work), "20,000 files": big_remote(work)}
        baseline = checkout_baseline(work, args.baseline) if args.baseline else None
        baseline_exec = build_baseline_exec(baseline) if baseline is not None else None
        daemon, git_port = start_git_daemon(work / "remotes")
        script = work / "script.json"
        convs = {
            f"{kind}-{short(repo)}": turn_script(args.turns + 1)
            for kind in kinds
            for repo in remotes
        }
        script.write_text(json.dumps({"conversations": convs}))
        model_port = free_port()
        model = subprocess.Popen(
            [sys.executable, "-m", "corral_dev.scripted", "--port", str(model_port),
             "--script", str(script)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        model_url = f"http://127.0.0.1:{model_port}"
        boxes: list[Sandbox] = []
        figures: dict[tuple[str, str], list[float]] = {}
        try:
            wait_ready(model_url, model)
            with httpx.Client(timeout=120) as client:
                for repo, bare in remotes.items():
                    url = f"git://127.0.0.1:{git_port}/{bare.name}"
                    here = {
                        kind: start_sandbox(
                            work, kind, short(repo), url, model_url,
                            baseline=baseline if kind == "before" else None,
                            exec_binary=baseline_exec if kind == "before" else None,
                        )
                        for kind in kinds
                    }  # fmt: skip
                    boxes.extend(here.values())
                    for box in here.values():
                        timed_turn(client, box, model_url, 0)  # warm-up: first push
                    for turn in range(1, args.turns + 1):
                        for kind, box in here.items():
                            figures.setdefault((kind, repo), []).append(
                                timed_turn(client, box, model_url, turn)
                            )
                    for box in here.values():
                        box.stop()
        finally:
            for box in boxes:
                box.stop()
            model.terminate()
            daemon.terminate()
    print(f"turn end to delivery record, median of {args.turns} turns (ms):")
    for repo in remotes:
        line = f"  {repo:>13}: now {statistics.median(figures[('now', repo)]) * 1000:.0f}"
        if args.baseline:
            before = statistics.median(figures[("before", repo)])
            now = statistics.median(figures[("now", repo)])
            ratio = now / before
            line += f", at {args.baseline} {before * 1000:.0f}, now / before {ratio:.2f}"
            line += f" (target <= {RATIO_TARGET})"
            missed |= ratio > RATIO_TARGET
        print(line)
    if missed and not args.lenient:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
