"""Ports for tests: each worker's own block, below the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from corral_dev import ports


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_next", None)


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_workers_get_disjoint_blocks_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocks = []
    for worker in [*(f"gw{i}" for i in range(ports.MAX_WORKERS)), ""]:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        blocks.append(set(ports._block()))
    for i, block in enumerate(blocks):
        assert max(block) < _ephemeral_start()
        for other in blocks[i + 1 :]:
            assert not block & other


def test_a_worker_is_handed_ports_of_its_block_in_turn_skipping_a_bound_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    first = ports.free_port()
    assert first in ports._block()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first + 1 if first + 1 in ports._block() else first - 1))
        taken = held.getsockname()[1]
        handed = [ports.free_port() for _ in range(5)]
    assert first not in handed and taken not in handed
    assert len(set(handed)) == 5 and all(p in ports._block() for p in handed)
