"""A harness whose history never ends cannot exhaust the operator's memory.

The harness is a stand-in (tests/_endless_harness.py: a real HTTP server on loopback, named as
such) that answers `GET .../history` and `GET .../updates` with a body that never ends. The
reader is the operator's own code (archiving a Session, and following a turn) in a process of
its own with the cap at 1 MiB, which reports its VmRSS before and its VmHWM (the peak) after
from /proc; this process watches it from outside too and kills it if it grows past what no
bounded read could need. The stand-in says how much it sent before the reader hung up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .._endless_harness import EndlessHarness

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
CAP = 1 * MiB
GROWTH_LIMIT = 50 * MiB
# Beyond this the child is killed: an unbounded reader would grow without end.
RUNAWAY = 400 * MiB
# What the stand-in sent beyond what the reader took: socket buffers on both ends.
SOCKET_SLACK = 4 * MiB

READER = r"""
import asyncio, json, sys
from pathlib import Path

from corral_api.kinds import AdmissionLedger
from corral_operator.archive import FileArchive
from corral_operator.archive.capture import archive_from_harness
from corral_operator.wireclient import AnswerTooLarge, WireClient

def memory():
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found

SESSION = {
    "apiVersion": "corral.dev/v1alpha1", "kind": "Session",
    "metadata": {"name": "c1", "namespace": "agents", "uid": "u-1"},
    "spec": {"agentRef": "fixer"}, "status": {"phase": "Succeeded"},
}

async def main(mode, url, cap, root):
    # One client made and closed first: its TLS context and pools are not the read's memory.
    await WireClient(url, "fixer").aclose()
    before = memory()
    result = {}
    if mode == "history":
        captured = await archive_from_harness(
            FileArchive(root, max_bytes=cap), SESSION, url, "t", cause="finished",
            max_history_bytes=cap,
        )
        result = {"events": captured.events, "omitted": captured.omitted}
    else:
        ledger = AdmissionLedger(stream_url="/agents/fixer/c1/updates", offset=0,
                                 submission_id="s1", turn=1)
        async with WireClient(url, "fixer", token="t", max_answer_bytes=cap) as client:
            try:
                await client.wait("c1", ledger)
            except AnswerTooLarge as too_large:
                result = {"omitted": str(too_large)}
    after = memory()
    print(json.dumps({"before": before, "after": after, **result}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


@pytest.fixture
def endless() -> Iterator[EndlessHarness]:
    harness = EndlessHarness()
    harness.start()
    yield harness
    harness.stop()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _read_in_a_process(mode: str, url: str, root: Path) -> dict[str, object]:
    """Run the reader; kill it if its memory runs away (the failure this test is about)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, mode, url, str(CAP), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    start = 0
    while proc.poll() is None:
        try:
            rss = _rss(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        start = start or rss
        if rss - start > RUNAWAY or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"the reader ran away: {rss / MiB:.0f} MiB resident, still reading")
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("mode", ["history", "updates"])
def test_an_endless_answer_is_read_to_the_cap_and_the_reader_stays_small(
    mode: str, endless: EndlessHarness, tmp_path: Path
) -> None:
    report = _read_in_a_process(mode, endless.url, tmp_path)
    before, after = report["before"], report["after"]
    assert isinstance(before, dict) and isinstance(after, dict)
    grown = after["VmHWM"] - before["VmRSS"]
    assert grown < GROWTH_LIMIT, f"the reader grew by {grown / MiB:.1f} MiB"
    omitted = str(report["omitted"])
    assert f"{mode} answer is larger than 1 MiB" in omitted and "--max-history-bytes" in omitted
    # The stand-in saw the connection closed after about the cap.
    assert endless.closed.wait(10)
    assert CAP < endless.sent < CAP + SOCKET_SLACK, endless.sent
    assert len(endless.requests) == 1 and f"/agents/fixer/c1/{mode}" in endless.requests[0]
    if mode == "history":
        # The Session is archived all the same: its record, without the transcript.
        assert report["events"] == 0
        record = json.loads((tmp_path / "agents" / "c1" / "u-1" / "record.json").read_text())
        assert record["historyOmitted"] == omitted and record["events"] == 0
