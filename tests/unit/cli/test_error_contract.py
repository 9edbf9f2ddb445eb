"""The error contract of every `corral` command (docs/cli.md, "Exit status and errors"): each
command, run as a real `corral` process, is given no kubeconfig, an API server that is not
there, a forbidden identity, a missing object and a bad flag; each prints a line or two on
stderr and exits 2 (`corral version` reports the cluster and exits 0), and none prints a
traceback. The commands are the ones `corral` has (`main.COMMANDS`): a new one must be added
here.

The forbidden identity and the missing object come from a stand-in for the API server (and for
the archive reader `corral logs` reads): a loopback HTTP server that answers every request with
the Kubernetes Status object of one error code, as a real API server answers a request RBAC
refuses (403) or one for an object or a resource it does not have (404). The processes run on
a small thread pool, so the whole table costs a few seconds of wall time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
SESSION = ROOT / "examples" / "session.yaml"
REVISION = "0" * 40

# A cluster command's argv, reaching the API server with a name that is not there.
CLUSTER_ARGV: dict[str, list[str]] = {
    "get": ["get", "sessions"],
    "describe": ["describe", "session", "s1"],
    "logs": ["logs", "s1"],
    "tree": ["tree", "s1"],
    "approve": ["approve", "a1"],
    "deny": ["deny", "a1", "--reason", "not now"],
    "reply": ["reply", "s1", "yes"],
    "suspend": ["suspend", "s1"],
    "resume": ["resume", "session", "s1"],
    "freeze": ["freeze", "session", "s1"],
    "unfreeze": ["unfreeze", "session", "s1"],
    "evidence": ["evidence", "check", "--repo", "https://r.invalid/r.git", "--revision", REVISION],
    "console": ["console", "--port", "0"],  # the port is set per run (a free one)
    "version": ["version"],
}
# The commands that need no cluster, and how each is given bad input of its own.
LOCAL_ARGV: dict[str, list[list[str]]] = {
    "run": [
        ["run", "-f", "/nonexistent/session.yaml"],
        ["run", "-f", str(SESSION), "--state-dir", "{file}"],
        ["run", "-f", str(SESSION), "--state-dir", "{file}/below"],
        ["run", "-f", str(SESSION), "--state-dir", "/proc/corral-nope/state"],
    ],
    "context": [["context", "-f", "/nonexistent/session.yaml", "--workspace", "/tmp"]],
    "completion": [["completion", "tcsh"]],
}
CLUSTER_CASES = ("no-kubeconfig", "unreachable", "forbidden", "not-found")


def corral_argv() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from corral_cli.main import main; sys.exit(main())"]


class _StatusAnswers(BaseHTTPRequestHandler):
    """Every method, every path: the Status object of the server's code."""

    def _answer(self) -> None:
        code = self.server.code  # type: ignore[attr-defined]
        if code == 200:  # a namespace with nothing in it: an empty list for every read
            self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})
            return
        reason = {403: "Forbidden", 404: "NotFound"}[code]
        message = (
            'sessions.corral.dev "s1" is forbidden: User "alice" cannot get resource '
            '"sessions" in API group "corral.dev" in the namespace "default"'
            if code == 403
            else "the server could not find the requested resource"
        )
        self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": message, "reason": reason,
                          "code": code})  # fmt: skip

    def _send(self, code: int, doc: dict[str, object]) -> None:
        body = json.dumps(doc).encode()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stand_ins() -> Iterator[dict[int, str]]:
    """Stand-in API servers on loopback: one answering 403, one 404, one empty lists."""
    servers = {}
    for code in (403, 404, 200):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _StatusAnswers)
        server.code = code  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[code] = server
    yield {code: f"http://127.0.0.1:{s.server_address[1]}" for code, s in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "alice", "user": {"token": "alice-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "alice"}}],
    }))  # fmt: skip
    return path


@dataclass(frozen=True)
class Case:
    command: str
    case: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass
class Ran:
    case: Case
    code: int
    stdout: str
    stderr: str


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CORRAL_",
                                                                    "KUBECONFIG"))}  # fmt: skip
    return env | {"HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
                  "PYTHONDONTWRITEBYTECODE": "1", **extra}  # fmt: skip


def _cases(tmp: Path, stand_ins: dict[int, str]) -> list[Case]:
    closed = f"http://127.0.0.1:{_free_port()}"  # bound a moment ago, listened on by nobody
    servers = {"unreachable": closed, "forbidden": stand_ins[403], "not-found": stand_ins[404]}
    kubeconfigs = {"no-kubeconfig": tmp / "no-such-kubeconfig"}
    for case, server in servers.items():
        kubeconfigs[case] = _kubeconfig(tmp / f"kubeconfig-{case}", server)
    cases = []
    for command, argv in CLUSTER_ARGV.items():
        for case in CLUSTER_CASES:
            run = list(argv)
            if command == "console":
                run[-1] = str(_free_port())
            reader = servers.get(case, closed)  # `corral logs` reads from the same stand-in
            env = {"KUBECONFIG": str(kubeconfigs[case]), "CORRAL_ARCHIVE_URL": reader}
            cases.append(Case(command, case, tuple(run), tuple(env.items())))
    file = tmp / "a-file"
    file.write_text("not a directory\n")
    for command in COMMANDS:
        cases.append(Case(command, "bad-flag", (command, "--no-such-flag"), ()))
    for command, variants in LOCAL_ARGV.items():
        for n, argv in enumerate(variants):
            run = [a.replace("{file}", str(file)) for a in argv]
            cases.append(Case(command, f"bad-input-{n}", tuple(run), ()))
    return cases


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, stand_ins: dict[int, str]) -> dict[str, Ran]:
    """Every case, run once, four processes at a time."""
    tmp = tmp_path_factory.mktemp("contract")
    home = tmp / "home"
    home.mkdir()

    def run(case: Case) -> Ran:
        done = subprocess.run(
            [*corral_argv(), *case.argv], capture_output=True, text=True, timeout=180,
            env=_env(home, **dict(case.env)), cwd=tmp, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return Ran(case, done.returncode, done.stdout, done.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, _cases(tmp, stand_ins)))
    return {f"{r.case.command}/{r.case.case}": r for r in results}


def test_every_command_of_corral_is_in_the_table() -> None:
    assert set(CLUSTER_ARGV) | set(LOCAL_ARGV) == set(COMMANDS)


def _assert_contract(result: Ran, code: int) -> None:
    where = f"{result.case.argv}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, where
    assert result.code == code, where
    if code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert 1 <= len(lines) <= 2, where
        assert lines[0].startswith(f"corral {result.case.command}: error: "), where
        assert "internal error" not in result.stderr, where


EXPECTED_WORDS = {
    "no-kubeconfig": "kubeconfig",
    "unreachable": "cannot reach",
    "forbidden": "403",
    "not-found": "not found",
}


@pytest.mark.parametrize("case", CLUSTER_CASES)
@pytest.mark.parametrize("command", sorted(CLUSTER_ARGV))
def test_a_cluster_command_explains_what_is_wrong_and_exits_2(
    ran: dict[str, Ran], command: str, case: str
) -> None:
    result = ran[f"{command}/{case}"]
    if command == "version":
        # The client's version is the answer; the cluster is a line that says why it is not.
        _assert_contract(result, 0)
        assert result.stdout.startswith("Client Version: corral "), result.stdout
        said = result.stdout.lower()
        wanted = {"no-kubeconfig": "unreachable (no kubeconfig", "unreachable": "unreachable",
                  "forbidden": "403", "not-found": "not installed"}[case]  # fmt: skip
        assert wanted in said, result.stdout
        return
    _assert_contract(result, 2)
    said = result.stderr.lower()
    assert EXPECTED_WORDS[case] in said or (case == "not-found" and "404" in said), result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_flag_is_two_lines_and_exit_2(ran: dict[str, Ran], command: str) -> None:
    result = ran[f"{command}/bad-flag"]
    _assert_contract(result, 2)
    assert "--no-such-flag" in result.stderr or "required" in result.stderr, result.stderr
    assert f"see `corral {command}" in result.stderr


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("run/bad-input-0", "/nonexistent/session.yaml"),
        ("run/bad-input-1", "is not a directory"),
        ("run/bad-input-2", "is not a directory"),
        ("run/bad-input-3", "cannot be created"),
        ("context/bad-input-0", "/nonexistent/session.yaml"),
        ("completion/bad-input-0", "invalid choice"),
    ],
)
def test_a_local_command_names_its_bad_input(ran: dict[str, Ran], key: str, words: str) -> None:
    result = ran[key]
    _assert_contract(result, 2)
    assert words in result.stderr, result.stderr


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*corral_argv(), *argv], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_with_json_the_error_is_also_the_last_line_of_stdout(
    tmp_path: Path, stand_ins: dict[int, str]
) -> None:
    env = _env(tmp_path, KUBECONFIG=str(_kubeconfig(tmp_path / "kc", stand_ins[403])))
    for argv in (
        ["get", "sessions", "-o", "json"],
        ["evidence", "check", "--repo", "r", "--revision", REVISION, "-o", "json"],
        ["run", "-f", str(SESSION), "--state-dir", str(tmp_path / "kc"), "--json"],
        ["get", "sessions", "--no-such-flag", "-o", "json"],
    ):
        done = _run(argv, env, tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (argv, done.stderr)
        last = json.loads(done.stdout.splitlines()[-1])
        assert last["outcome"] == "Error" and last["exitCode"] == 2, last
        assert last["error"]["message"] and {"answer", "commit"} <= set(last), last


def test_an_unexpected_failure_is_one_line_and_the_traceback_is_there_on_demand(
    tmp_path: Path,
) -> None:
    # A kubeconfig of the wrong shape: nothing in the contract names it, so it is a bug's line.
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: 5\n")
    env = _env(tmp_path, KUBECONFIG=str(broken))
    done = _run(["get", "sessions"], env, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("corral get: error: internal error: TypeError: ")
    assert line.endswith("; rerun with CORRAL_DEBUG=1 for the traceback")
    debug = _run(["get", "sessions"], env | {"CORRAL_DEBUG": "1"}, tmp_path)
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _CountingAnswers(_StatusAnswers):
    """Empty lists, and a count of the requests answered (the server's `asked` event)."""

    def _answer(self) -> None:
        super()._answer()
        self.server.asked.set()  # type: ignore[attr-defined]

    do_GET = _answer


def test_ctrl_c_in_a_cluster_command_is_exit_130_without_a_traceback(tmp_path: Path) -> None:
    """`corral evidence check --wait` polls an empty namespace until Ctrl-C, sent once it has
    asked the API server (not after a fixed sleep: a loaded machine takes seconds to start)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CountingAnswers)
    server.code = 200  # type: ignore[attr-defined]
    asked = server.asked = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = _env(tmp_path, KUBECONFIG=str(_kubeconfig(tmp_path / "kc", url)))
    argv = ["evidence", "check", "--repo", "r", "--revision", REVISION, "--wait", "10m"]
    # As a terminal starts it: Ctrl-C's signal at its default. A job a non-interactive shell
    # started in the background (`make test`'s path test) inherits SIGINT ignored, and a
    # Python started with SIGINT ignored leaves it so: the Ctrl-C would never arrive.
    process = subprocess.Popen([*corral_argv(), *argv], env=env, cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=_default_sigint)  # fmt: skip
    try:
        assert asked.wait(120), "the command never asked the API server"
        time.sleep(0.5)  # answered: waiting for its next poll
        assert process.poll() is None
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        server.shutdown()
        server.server_close()
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "corral evidence: interrupted", err


HIDE_MODULE = """
import sys

class _Hidden:
    \"\"\"A Python without {name}: its import fails as an uninstalled module's does.\"\"\"

    def find_spec(self, fullname, path=None, target=None):
        if fullname == {name!r} or fullname.startswith({name!r} + "."):
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None

sys.meta_path.insert(0, _Hidden())
"""


@pytest.mark.parametrize("hidden", ["anthropic", "httpx"])
def test_run_without_the_sandbox_extra_says_which_extra_to_install(
    tmp_path: Path, hidden: str
) -> None:
    """`anthropic` is looked for before anything starts (the harness needs it); `httpx` fails
    the import of `corral run` itself. Both name the extra, exit 2."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_MODULE.format(name=hidden))
    env = _env(tmp_path, PYTHONPATH=str(site))
    proof = subprocess.run([sys.executable, "-c", f"import {hidden}"], env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert proof.returncode == 1 and "ModuleNotFoundError" in proof.stderr  # it is hidden
    done = _run(["run", "-f", str(SESSION), "--state-dir", str(tmp_path / "state")], env, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert hidden in done.stderr and "pip install 'corral[sandbox]'" in done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was written


def test_a_reader_that_goes_away_ends_the_output_quietly() -> None:
    """`corral ... | head`: the pipe closes under the command, which ends without a traceback."""
    corral = Path(sys.executable).parent / "corral"
    # `true` reads nothing and is gone before corral writes: every write meets a closed pipe.
    script = f"'{corral}' completion bash | true; echo rc=${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr and "pipe" not in done.stderr.lower(), done.stderr
    assert done.stdout.strip() == "rc=0", done.stdout
