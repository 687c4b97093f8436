"""Which TCP addresses a group of processes listens on, read from /proc (Linux): for the checks that local
Spark and Airflow bind loopback only."""

from __future__ import annotations

import ipaddress
from pathlib import Path


def _listening_by_inode() -> dict[str, tuple[str, int]]:
    """Every listening TCP socket of this machine: inode -> (address, port)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A":  # LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(words)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            found[inode] = (str(ip), int(port, 16))
    return found


def process_group(pgid: int) -> list[int]:
    """The pids of a process group (a detached spark-submit and its JVM, Python workers ...)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                pids.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """The (address, port) pairs these processes listen on."""
    sockets = _listening_by_inode()
    found = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:[") and (inode := target[8:-1]) in sockets:
                found.add(sockets[inode])
    return found


def not_loopback(addresses: set[tuple[str, int]]) -> set[tuple[str, int]]:
    return {(ip, port) for ip, port in addresses if not ipaddress.ip_address(ip).is_loopback}
