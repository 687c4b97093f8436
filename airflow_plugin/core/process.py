"""What makes a process id mean something: a pid names a process only within one PID namespace of one boot of
one kernel. A host name says none of that (containers on the host's network share it, two machines can share
one), so a process is known by its boot id (/proc/sys/kernel/random/boot_id), its PID namespace
(/proc/self/ns/pid), its pid and its start time (/proc/PID/stat field 22: tells a reused pid apart).

From another boot or another PID namespace the answer is "cannot tell" (UNKNOWN), never "gone": the process may
be alive on another machine or in another container. Only a process of this boot and namespace is looked up.

Pure engine code: no airflow, no pyspark."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_KEY = re.compile(r"^(?P<pid>\d+)/(?P<boot>[0-9a-f]{1,32})/(?P<namespace>\d+)/(?P<started>\d+)$")


class Liveness(StrEnum):
    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "cannot tell"  # another boot, another PID namespace, or no /proc to look in


@cache
def _here() -> tuple[str | None, str | None]:
    """This process's boot id (hex, no dashes) and PID namespace (its inode number); None where unreadable."""
    try:
        boot = BOOT_ID.read_text().strip().replace("-", "")
    except OSError:
        boot = None
    try:
        namespace = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or None
    except OSError:
        namespace = None
    return boot, namespace


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), None when it does not exist in this namespace or is a
    zombie (it has ended: only its exit status waits to be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


@dataclass(frozen=True)
class ProcessId:
    pid: int
    boot: str | None  # boot id
    namespace: str | None  # PID namespace inode
    started: str | None  # start time, clock ticks since boot

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        """A process of this namespace (this process's own, or a child it started)."""
        boot, namespace = _here()
        return cls(pid, boot, namespace, start_time(pid))

    @classmethod
    def current(cls) -> ProcessId:
        return cls.of(os.getpid())

    def look(self) -> Liveness:
        """Whether the process runs: ALIVE or GONE where this process can tell (same boot, same PID namespace),
        else UNKNOWN."""
        boot, namespace = _here()
        if None in (self.boot, self.namespace, self.started, boot, namespace):
            return Liveness.UNKNOWN
        if (self.boot, self.namespace) != (boot, namespace):
            return Liveness.UNKNOWN
        return Liveness.ALIVE if start_time(self.pid) == self.started else Liveness.GONE

    @property
    def key(self) -> str:
        """A compact text form, `pid/boot/namespace/started` (a lease holder's or a catalog mark's suffix)."""
        return f"{self.pid}/{self.boot or 0}/{self.namespace or 0}/{self.started or 0}"

    @classmethod
    def parse(cls, key: str) -> ProcessId | None:
        match = _KEY.match(key)
        if match is None:
            return None
        known = {name: (None if value == "0" else value) for name, value in match.groupdict().items()}
        return cls(int(match["pid"]), known["boot"], known["namespace"], known["started"])

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "boot_id": self.boot, "pid_namespace": self.namespace, "started": self.started}

    @classmethod
    def from_handle(cls, handle: dict[str, Any]) -> ProcessId | None:
        """The driver process a launcher handle records (jobs/launcher.py); None for a handle without a pid."""
        pid = handle.get("pid")
        if not pid:
            return None
        return cls(int(pid), handle.get("boot_id"), handle.get("pid_namespace"), handle.get("started"))
