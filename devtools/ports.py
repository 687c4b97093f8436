"""Ports for the servers the tests, the demo and `make airflow` start on 127.0.0.1 (Airflow's API server, Kafka,
Hadoop, Spark standalone, Prometheus).

A port the kernel hands out (a bind to port 0) comes from its ephemeral range, where every outbound connection on
the machine also takes its local port. Between that pick and the server's own bind (seconds, for a JVM or Airflow's
API server) a connection of another process could take it, and the server dies with "address already in use" (seen
on CI with two test workers). Below the ephemeral range only another listener can take it, and a random pick there
makes that unlikely."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default


def _candidates() -> tuple[int, int] | None:
    """The ports to pick from: up to 15,000 below the ephemeral range; None where there is no room below it."""
    try:
        ephemeral_low = int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = _DEFAULT_EPHEMERAL_LOW
    high = ephemeral_low - 1
    low = max(1024, high - 15_000)
    return (low, high) if high - low >= 1000 else None


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` different ports free on 127.0.0.1 now, below the ephemeral range where the machine allows it."""
    span = _candidates()
    if span is None:  # the whole range is ephemeral: the kernel's own picks
        sockets = [socket.socket() for _ in range(count)]
        try:
            for s in sockets:
                s.bind(("127.0.0.1", 0))  # all bound at once: the ports differ
            return [s.getsockname()[1] for s in sockets]
        finally:
            for s in sockets:
                s.close()
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(*span)
        if port not in chosen and _free(port):
            chosen.append(port)
    return chosen


def free_port() -> int:
    return free_ports(1)[0]
