"""This host, as the node tier checks it: its iptables rules."""

from __future__ import annotations

import subprocess


def host_iptables_rules() -> set[str]:
    """This host's iptables chains and rules (`iptables-save`, counters dropped)."""
    done = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    lines = set()
    for line in done.stdout.splitlines():
        if line.startswith("#"):
            continue
        lines.add(line.split(" [", 1)[0] if line.startswith(":") else line)
    return lines
