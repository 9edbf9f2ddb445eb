"""`corral run` applies the Agent's `sandbox.egress` through a local corral-gateway: the agent's
commands reach what the Agent names and are refused the rest with the reason, while the
custodian still reaches the model through the same gateway with the run's credential. Real
processes: the CLI, the harness, the custodian, the scripted model and the gateway."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..wire._gateway import gateway_binary
from .conftest import corral_argv, read_lines, run_env, write_session

pytestmark = pytest.mark.timeout(120)

ALLOWED, REFUSED = "127.0.0.2", "127.0.0.3"


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the allowed host\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    made = [http.server.ThreadingHTTPServer((ip, 0), _Hello) for ip in (ALLOWED, REFUSED)]
    for server in made:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield made[0].server_address[1], made[1].server_address[1]
    finally:
        for server in made:
            server.shutdown()
            server.server_close()


def test_the_agents_commands_reach_what_the_agent_names_and_nothing_else(
    demo_workspace: Path, tmp_path: Path, servers: tuple[int, int]
) -> None:
    allowed_port, refused_port = servers
    fetch = (
        "python3 - <<'PY'\n"
        "import urllib.request, urllib.error\n"
        f"for url in ('http://{ALLOWED}:{allowed_port}/', 'http://{REFUSED}:{refused_port}/'):\n"
        "    try:\n"
        "        print(url, urllib.request.urlopen(url, timeout=5).read().decode().strip())\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(url, e.code, e.reason)\n"
        "PY"
    )
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"tool_use": {"name": "bash", "input": {"command": fetch}}},
            {"text": "Fetched what I was allowed."},
        ],
    )
    docs = session.read_text().split("\n---\n")
    agent = json.loads(docs[0])
    # An address written out in the Agent's rule: explicit, so reachable although loopback.
    agent["spec"]["sandbox"] = {"egress": [{"host": ALLOWED, "ports": [allowed_port]}]}
    session.write_text(json.dumps(agent) + "\n---\n" + docs[1])
    env = {**run_env(), "CORRAL_GATEWAY_BINARY": str(gateway_binary())}
    state = tmp_path / "state"
    done = subprocess.run(
        [*corral_argv(), "run", "-f", str(session), "--workspace", str(demo_workspace),
         "--scenario", str(scenario), "--state-dir", str(state)],
        capture_output=True, text=True, env=env, timeout=100, cwd=tmp_path, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "egress: through a local gateway; the agent's commands reach 127.0.0.2" in out, out
    results = [
        str(line.get("result"))
        for line in read_lines(state / "transcript.jsonl")
        if line.get("type") == "tool_end"
    ]
    seen = "\n".join(results)
    assert "hello from the allowed host" in seen, seen
    assert f"{REFUSED}:{refused_port} is not allowed for agent" in seen, seen
    # The run's summary line names what was refused.
    assert f"denied {REFUSED}:{refused_port}" in out, out
    log = (state / "logs" / "gateway.log").read_text()
    decisions = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    agent_decisions = {
        (d["host"], d["decision"]) for d in decisions if d.get("identity") == "agent"
    }
    assert agent_decisions == {(ALLOWED, "allowed"), (REFUSED, "denied")}, decisions
    # The custodian has the run's credential; the agent's commands have none of it.
    credential = (state / "secrets" / "egress-credential").read_text().strip()
    assert credential not in seen and credential not in out
