"""A socket path longer than sockaddr_un allows (the local node's host path of a pod's volume)
still serves: both ends reach it through an open handle on its directory."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from corral_dev.execbin import exec_binary
from corral_harness.tools import WorkingTools
from corral_harness.tools._exec_client import SUN_PATH_MAX, ExecWorkspace


async def test_a_socket_path_past_the_sun_path_limit_serves(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    deep = tmp_path / ("volumes-" + "x" * 60) / ("exec-socket-" + "y" * 60)
    socket = deep / "exec.sock"
    assert len(str(socket)) >= SUN_PATH_MAX
    proc = subprocess.Popen(
        [str(exec_binary()), "serve", "--socket", str(socket), "--root", str(root)],
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(500):
            if socket.exists():
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            await asyncio.sleep(0.02)
        workspace = ExecWorkspace(socket, root)
        try:
            assert await workspace.healthy()
            result = await WorkingTools(workspace).run("bash", {"command": "echo far && pwd"})
            assert not result.is_error, result.content
            assert result.content.split() == ["far", str(root)]
        finally:
            await workspace.aclose()
    finally:
        proc.terminate()
        proc.wait(5)
