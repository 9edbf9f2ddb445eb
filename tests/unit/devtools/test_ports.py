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


def test_a_worker_is_handed_ports_of_its_block_in_turn_skipping_a_bound_one() -> None:
    """In this process's own block (another run beside this one has the other workers'): a
    port bound by someone else is skipped."""
    first = ports.free_port()
    block = ports._block()
    assert first in block
    with socket.socket() as held:
        # The next ports in turn, so the one held is one the cycle would have handed out.
        for candidate in [*range(first + 1, block.stop), *range(block.start, first)]:
            try:
                held.bind(("127.0.0.1", candidate))
                break
            except OSError:
                continue
        taken = held.getsockname()[1]
        handed = [ports.free_port() for _ in range(5)]
    assert first not in handed and taken not in handed
    assert len(set(handed)) == 5 and all(p in ports._block() for p in handed)
