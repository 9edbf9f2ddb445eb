"""corral_kube's client against a stand-in API server on 127.0.0.1 (aiohttp, real TLS where it
matters): TLS from inline kubeconfig data, the token file re-read per request with each new
value announced before it is sent, every error status mapped to its class, an unreachable
server, watches streamed line by line with `Gone`, and an exec plugin's token."""

from __future__ import annotations

import base64
import json
import socket
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from aiohttp import web

from corral_kube import (
    MERGE_PATCH,
    Conflict,
    ExecPlugin,
    Forbidden,
    Gone,
    KubeClient,
    KubeConfig,
    KubeConfigError,
    KubeError,
    KubeRefused,
    KubeUnreachable,
    NotFound,
    Unauthorized,
    load_kubeconfig,
)

from ._apiserver import ApiServer, Pki, status, watch_lines


def _kubeconfig_inline(path: Path, server: str, pki: Pki) -> Path:
    def data(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "current-context": "x",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority-data": data(pki.ca)}}
        ],
        "users": [
            {
                "name": "alice",
                "user": {
                    "client-certificate-data": data(pki.client_cert),
                    "client-key-data": data(pki.client_key),
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "alice"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_tls_with_inline_kubeconfig_data_presents_the_client_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    async with ApiServer(tls=pki.server_context()) as server:
        config = load_kubeconfig(_kubeconfig_inline(tmp_path / "config", server.url, pki))
        client = KubeClient(config)
        try:
            assert await client.get("/api/v1/namespaces/ns/pods/p") == {
                "kind": "Pod",
                "metadata": {"name": "p"},
            }
            assert await client.bearer_token() is None  # a certificate, no token
        finally:
            await client.aclose()
        # A client for someone else's token: the cluster's CA, never this identity's cert.
        async with httpx.AsyncClient(verify=config.ssl_context(client_cert=False)) as other:
            assert (await other.get(f"{server.url}/api")).status_code == 200
    assert [s.peer_cn for s in server.seen] == ["alice", None]
    assert not list(tmp_path.glob("**/*.key"))  # the key was never left on disk


async def test_a_server_the_ca_did_not_sign_is_unreachable(pki: Pki) -> None:
    async with ApiServer(tls=pki.server_context()) as server:
        client = KubeClient(KubeConfig(server.url))  # no CA given: the system's trust store
        try:
            with pytest.raises(KubeUnreachable, match="unreachable"):
                await client.get("/api")
        finally:
            await client.aclose()
    assert server.seen == []


async def test_the_token_file_is_read_per_request_and_each_new_value_announced_first(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123\n")
    async with ApiServer() as server:
        announced: list[tuple[str, int]] = []  # (token, requests the server had seen by then)

        def on_token(token: str) -> None:
            announced.append((token, len(server.seen)))

        client = KubeClient(KubeConfig(server.url, token_file=token_file, on_token=on_token))
        try:
            await client.get("/a")
            await client.get("/b")  # the same token: not announced again
            token_file.write_text("rotated-token-4567\n")  # the kubelet rotated it
            await client.get("/c")
        finally:
            await client.aclose()
    sent = [s.headers["Authorization"] for s in server.seen]
    assert sent == ["Bearer first-token-0123"] * 2 + ["Bearer rotated-token-4567"]
    assert announced == [("first-token-0123", 0), ("rotated-token-4567", 2)]


async def test_a_token_the_callback_refuses_is_never_sent(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("short\n")

    def refuse(token: str) -> None:
        raise ValueError(f"{len(token)} characters cannot be redacted")

    async with ApiServer() as server:
        client = KubeClient(KubeConfig(server.url, token_file=token_file, on_token=refuse))
        try:
            with pytest.raises(KubeConfigError, match="5 characters"):
                await client.get("/api")
            token_file.unlink()
            with pytest.raises(KubeConfigError, match="cannot be read"):
                await client.get("/api")
        finally:
            await client.aclose()
    assert server.seen == []


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", Conflict),
        (410, "Expired", Gone),
        (422, "Invalid", KubeRefused),
        (429, "TooManyRequests", KubeRefused),
        (500, "InternalError", KubeRefused),
    ],
)
async def test_each_error_status_is_refused_as_its_class(
    code: int, reason: str, kind: type[KubeRefused]
) -> None:
    async def answer(_: web.Request) -> web.StreamResponse:
        return status(code, reason, f'sessions.corral.dev "s" says {code}')

    async with ApiServer(handler=answer) as server:
        client = KubeClient(KubeConfig(server.url))
        try:
            with pytest.raises(KubeRefused) as refused:
                await client.request("POST", "/apis/corral.dev/v1alpha1/x", body={})
        finally:
            await client.aclose()
    assert type(refused.value) is kind
    err, message = refused.value, f'sessions.corral.dev "s" says {code}'
    assert (err.status, err.reason, err.message) == (code, reason, message)
    assert str(err) == f"{code} {reason}: {message}"


async def test_an_answer_that_is_no_status_object_keeps_its_text() -> None:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="upstream connect error\n")

    async with ApiServer(handler=answer) as server:
        client = KubeClient(KubeConfig(server.url))
        try:
            with pytest.raises(KubeRefused) as refused:
                await client.get("/api")
        finally:
            await client.aclose()
    assert (refused.value.status, refused.value.message, refused.value.reason) == (
        503,
        "upstream connect error",
        "",
    )


async def test_requests_carry_their_body_query_and_content_type_and_answer_as_asked() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/log"):
            return web.Response(text="line 1\nline 2\n", content_type="text/plain")
        if request.path.endswith("/missing"):
            return status(404, "NotFound", "not there")
        if request.method == "DELETE":
            return web.Response(status=200)
        return web.json_response({"items": [{"n": 1}, {"n": 2}]})

    async with ApiServer(handler=answer) as server:
        client = KubeClient(KubeConfig(server.url))
        try:
            patched = await client.request(
                "PATCH", "/p/status", body={"status": {"a": None}}, content_type=MERGE_PATCH
            )
            not_read = await client.request("POST", "/p", body={"x": 1}, answer=False)
            log = await client.request("GET", "/p/log", query=[("tailLines", "200")])
            listed = await client.list("/pods", label_selector="app=x")
            missing = await client.get("/missing")
            deleted = await client.request("DELETE", "/p")
        finally:
            await client.aclose()
    assert patched == {"items": [{"n": 1}, {"n": 2}]} and not_read is None
    assert (log, listed, missing, deleted) == ("line 1\nline 2\n", [{"n": 1}, {"n": 2}], None, None)
    first, second = server.seen[0], server.seen[1]
    assert first.headers["Content-Type"] == MERGE_PATCH
    assert json.loads(first.body) == {"status": {"a": None}}
    assert second.headers["Content-Type"] == "application/json"
    assert server.seen[2].query == {"tailLines": "200"}
    assert server.seen[3].query == {"labelSelector": "app=x"}
    assert all(s.headers["Accept"] == "application/json" for s in server.seen)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_server_that_is_not_there_is_unreachable_and_no_refusal() -> None:
    client = KubeClient(KubeConfig(f"http://127.0.0.1:{_closed_port()}"))
    try:
        with pytest.raises(KubeUnreachable) as unreachable:
            await client.get("/api")
        with pytest.raises(KubeUnreachable):
            async for _ in client.watch("/api/v1/pods", "1"):
                pass
    finally:
        await client.aclose()
    assert isinstance(unreachable.value, KubeError)
    assert not isinstance(unreachable.value, KubeRefused)


async def test_a_watch_streams_its_events_and_an_expired_version_is_gone() -> None:
    added = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "11"}}}
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}
    expired = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired",
                   "message": "too old resource version: 10 (12)"},
    }  # fmt: skip
    async with ApiServer(handler=watch_lines(added, bookmark, expired)) as server:
        client = KubeClient(KubeConfig(server.url))
        got: list[str] = []
        try:
            with pytest.raises(Gone, match="too old resource version") as gone:
                async for event in client.watch("/api/v1/pods", "10", timeout_seconds=5):
                    got.append(event["type"])
        finally:
            await client.aclose()
    assert got == ["ADDED", "BOOKMARK"] and gone.value.status == 410
    assert server.seen[0].query == {
        "watch": "1",
        "resourceVersion": "10",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "5",
    }


async def test_a_watch_refused_at_its_start_is_gone_too() -> None:
    async def answer(_: web.Request) -> web.StreamResponse:
        return status(410, "Expired", "too old resource version: 1 (9)")

    async with ApiServer(handler=answer) as server:
        client = KubeClient(KubeConfig(server.url))
        try:
            with pytest.raises(Gone):
                async for _ in client.watch("/api/v1/pods", "1"):
                    pass
        finally:
            await client.aclose()


def _exec_plugin(tmp_path: Path) -> ExecPlugin:
    """A plugin that prints a new token each run (run-1, run-2, ...) with the expiry in
    $EXPIRES, counting its runs in a file."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, os, pathlib, sys\n"
        "count = pathlib.Path(sys.argv[1])\n"
        "n = int(count.read_text() or 0) + 1 if count.exists() else 1\n"
        "count.write_text(str(n))\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "status = {'token': f'run-{n}-' + os.environ['SUFFIX']}\n"
        "if os.environ.get('EXPIRES'):\n"
        "    status['expirationTimestamp'] = os.environ['EXPIRES']\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',"
        " 'status': status}))\n"
    )
    return ExecPlugin(
        sys.executable, (str(script), str(tmp_path / "runs")), (("SUFFIX", "abcdefgh"),)
    )


async def test_an_exec_plugins_token_without_an_expiry_is_kept(tmp_path: Path) -> None:
    async with ApiServer() as server:
        client = KubeClient(KubeConfig(server.url, exec_plugin=_exec_plugin(tmp_path)))
        try:
            await client.get("/a")
            await client.get("/b")
            assert (tmp_path / "runs").read_text() == "1"  # no expiry given: kept
        finally:
            await client.aclose()
    assert [s.headers["Authorization"] for s in server.seen] == ["Bearer run-1-abcdefgh"] * 2


async def test_an_expired_or_refused_exec_token_runs_the_plugin_again(tmp_path: Path) -> None:
    plugin = _exec_plugin(tmp_path)
    env = (*plugin.env, ("EXPIRES", "2020-01-01T00:00:00Z"))
    expired = ExecPlugin(plugin.command, plugin.args, env)

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") == "Bearer run-2-abcdefgh":  # revoked early
            return status(401, "Unauthorized", "Unauthorized")
        return web.json_response({"ok": True})

    async with ApiServer(handler=answer) as server:
        client = KubeClient(KubeConfig(server.url, exec_plugin=expired))
        try:
            await client.get("/a")  # run 1
            await client.get("/b")  # run 1 expired: run 2, refused, run 3 and the retry
        finally:
            await client.aclose()
    sent = [s.headers["Authorization"] for s in server.seen]
    assert sent == ["Bearer run-1-abcdefgh", "Bearer run-2-abcdefgh", "Bearer run-3-abcdefgh"]
