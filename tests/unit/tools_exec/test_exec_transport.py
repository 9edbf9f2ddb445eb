"""The exec client's own HTTP/1.1 (corral_harness/http1.py) against the real service: kept-alive
connections reused, a restarted service, a service away, requests at once, and a peer that
answers something other than HTTP."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from corral_harness.ports import WorkspaceError
from corral_harness.tools._exec_client import ExecWorkspace

from ._service import ExecService


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


async def test_connections_are_reused_and_a_restarted_service_is_reached_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    socket = tmp_path / "exec.sock"
    service = ExecService(root, socket, _env())
    workspace = ExecWorkspace(socket, root)
    try:
        for _ in range(3):
            done = await workspace.run(["/bin/sh", "-c", "echo step"], timeout=10, keep_bytes=1000)
            assert (done.exit_code, done.output.strip()) == (0, "step")
        # One connection carried all three commands and a listing after them.
        assert len(workspace._client._idle) == 1
        first = workspace._client._idle[0]
        assert [e.name for e in await workspace.list_dir(".")] == []
        assert workspace._client._idle == [first]

        service.stop()
        with pytest.raises(WorkspaceError) as away:
            await workspace.list_dir(".")
        assert away.value.kind == "unavailable"
        assert not await workspace.healthy()

        service = ExecService(root, socket, _env())
        assert await workspace.healthy()
        done = await workspace.run(["/bin/sh", "-c", "echo back"], timeout=10, keep_bytes=1000)
        assert done.output.strip() == "back"
    finally:
        await workspace.aclose()
        service.stop()


async def test_a_command_and_other_requests_run_at_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("alpha\n")
    socket = tmp_path / "exec.sock"
    service = ExecService(root, socket, _env())
    workspace = ExecWorkspace(socket, root)
    try:
        # Output larger than one chunk of the stream, while reads go on beside it.
        command = asyncio.ensure_future(
            workspace.run(
                ["/bin/sh", "-c", "sleep 0.3; head -c 300000 /dev/zero | tr '\\0' x; echo"],
                timeout=10,
                keep_bytes=1_000_000,
            )
        )
        texts = await asyncio.gather(*(workspace.read_text("a.txt", 100) for _ in range(5)))
        assert texts == ["alpha\n"] * 5
        done = await command
        assert done.exit_code == 0 and done.output.strip() == "x" * 300000
    finally:
        await workspace.aclose()
        service.stop()


async def test_a_peer_that_is_not_the_service_is_unavailable(tmp_path: Path) -> None:
    socket = tmp_path / "garbled.sock"

    async def garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(garble, path=str(socket))
    workspace = ExecWorkspace(socket, tmp_path)
    try:
        with pytest.raises(WorkspaceError) as garbled:
            await workspace.list_dir(".")
        assert garbled.value.kind == "unavailable" and "malformed" in str(garbled.value)
        with pytest.raises(WorkspaceError) as cut:
            await workspace.run(["/bin/true"], timeout=5, keep_bytes=100)
        assert cut.value.kind == "unavailable"
    finally:
        await workspace.aclose()
        server.close()
        await server.wait_closed()
