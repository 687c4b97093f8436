"""Which upgrade mode applies, and why (a pure decision from what was observed: the running deployment's
status, the new version's pre-flight, the machine).

blue_green needs both versions to write through the gate (spark_jobs/runtime/gate.py): each appends to the
same Delta table and names the same gate column (the window's end), in append mode, so that every window is
written by exactly one of them; and room for two drivers at once. Everything else (a file sink, whose log
takes one writer; update or complete mode, which rewrites windows; Kafka and foreachBatch sinks) upgrades by
stop_restore, which is always possible."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .record import Mode

DEFAULT_DRIVER_MEMORY = 1 << 30  # Spark's spark.driver.memory default, 1g
JVM_OVERHEAD = 1.5  # a driver's process takes more than its heap (metaspace, threads, Python, local executors)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Observed:
    """What the decision looks at."""

    old_sink: str | None  # the running deployment's sink (its status), as Spark names it
    old_gate: dict[str, Any] | None  # its gate (status.gate): None when its writes are not gated
    new_sink: str | None  # the new version's (its pre-flight run's status)
    new_gate: dict[str, Any] | None  # its gate column, or `not_gated`: why not
    master: str  # spark_master of the job
    driver_memory: str | None  # spark.driver.memory of the new version, as configured
    available_memory: int | None  # bytes this machine has free now (local masters only)


@dataclass(frozen=True)
class Decision:
    mode: Mode | None  # None: the requested mode does not apply (the upgrade is blocked)
    reasons: dict[str, str]  # mode -> why it applies, or why not
    blocked: str | None = None


def blue_green_problem(seen: Observed) -> str | None:
    """Why blue/green cannot run for this upgrade, or None when it can."""
    old_gate, new_gate = seen.old_gate or {}, seen.new_gate or {}
    if not new_gate.get("column"):
        return f"the new version's writes cannot be gated: {new_gate.get('not_gated') or 'its pre-flight said nothing'}"
    if not old_gate.get("column"):
        return (
            "the running deployment does not write through the gate (it was deployed before its job named a gate "
            "column, or its writes cannot be gated): upgrade once by stop_restore"
        )
    if old_gate.get("role") not in ("sole", "green"):
        return f"the running deployment is {old_gate.get('role')} in another upgrade"
    if old_gate["column"] != new_gate["column"]:
        return f"the versions gate on different columns ({old_gate['column']} and {new_gate['column']})"
    if seen.old_sink != seen.new_sink:
        return f"the versions write different tables ({seen.old_sink} and {seen.new_sink})"
    return room_for_two(seen)


def room_for_two(seen: Observed) -> str | None:
    """A second driver beside the running one: on a local master it must fit into this machine's free
    memory; on a cluster the cluster manager decides (not checked here)."""
    if not seen.master.startswith("local") or seen.available_memory is None:
        return None
    needed = int(parse_size(seen.driver_memory) * JVM_OVERHEAD)
    if needed > seen.available_memory:
        return (
            f"a second driver needs about {needed >> 20} MiB (spark.driver.memory {seen.driver_memory or '1g'} and "
            f"its overhead) but this machine has {seen.available_memory >> 20} MiB free: size the drivers down in "
            "the jobs file, or upgrade by stop_restore"
        )
    return None


def decide(requested: str | None, seen: Observed) -> Decision:
    problem = blue_green_problem(seen)
    reasons = {
        Mode.BLUE_GREEN: f"not possible: {problem}"
        if problem
        else f"both versions write {seen.new_sink} through the gate on {seen.new_gate['column']}"  # type: ignore[index]
        " (append mode): the new version runs beside the old one and takes over at a window boundary, no gap",
        Mode.STOP_RESTORE: "always possible: the old version stops with a savepoint, the new one starts from it",
    }
    if requested == Mode.BLUE_GREEN and problem:
        return Decision(None, reasons, f"blue_green was asked for but is {reasons[Mode.BLUE_GREEN]}")
    if requested:
        return Decision(Mode(requested), reasons)
    return Decision(Mode.STOP_RESTORE if problem else Mode.BLUE_GREEN, reasons)


def parse_size(text: str | None) -> int:
    """A JVM size ("2g", "512m"); Spark's default driver memory when unset."""
    if not text:
        return DEFAULT_DRIVER_MEMORY
    match = _SIZE.match(text)
    if not match:
        return DEFAULT_DRIVER_MEMORY
    return int(float(match[1]) * _UNITS[match[2].lower()])


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable of this machine (Linux), None where unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
