"""Which upgrade mode applies, and why (a pure decision from what was observed: the running deployment's
status, the new version's pre-flight, where a replay would start, the machine).

blue_green needs both versions to write through the gate (spark_jobs/runtime/gate.py): each appends to the
same Delta table and names the same gate column (the window's end), in append mode, so that every window is
written by exactly one of them; and room for two drivers at once. And it is offered only where each version's plan
(spark_jobs/runtime/shape.py) proves that splitting by window end writes every window once, whole: one time window
aggregation (tumbling or sliding), perhaps after a deduplication, with one event-time watermark, the gate column
being the window's end. A session window is not (a record one version drops as late and the other accepts merges
sessions differently: counted twice or lost), nor a stream-stream join or arbitrary state (no window to split by),
nor a query without state (its rows are written as they arrive: late rows at or before T would be filtered by the
new version and never written, and without a watermark the old version never finishes). Everything else (a file
sink, whose log takes one writer; update or complete mode, which rewrites windows; Kafka and foreachBatch sinks)
upgrades by stop_restore, which is possible whenever the new version takes over the old state. When it cannot (a new
grouping key, another operator), the state is rebuilt or converted instead, beside the old version and through the
same gate: `migrate` where the version declares a migration function, `replay` where the source still holds
the records the new state needs (replay.py); otherwise the upgrade is blocked, saying what would unblock it.

Every mode that runs two versions at once (blue_green, replay, migrate) also needs their two drivers to take turns
at committing to the table (`commit_problem`): Delta's log takes one writer per version only where the store's
put-if-absent holds across JVMs (HDFS) or the runtime's commit lock stands in for it (spark_jobs/runtime/gate.py
`commit_lock`: a file lock on a local table, a lock object made of conditional writes on S3, which the pre-flight
tries on the table's store)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..sinks import DELTA, from_description
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
    # why the new version cannot take over the old state (the pre-flight's reason), None when it can
    state_problem: str | None = None
    replay: str | None = None  # None: a replay is possible (replay.py); else why not
    replay_reason: str = ""  # what a possible replay reads
    migrate: str | None = None  # the version's migration function (jobs file `migrate`), if it declares one
    kafka_only: bool = False  # every source of the snapshot is Kafka (green can be started at its positions)
    old_shape: dict[str, Any] | None = None  # what each version's query is made of (DeploymentStatus.query_shape)
    new_shape: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decision:
    mode: Mode | None  # None: the requested mode does not apply (the upgrade is blocked)
    reasons: dict[str, str]  # mode -> why it applies, or why not
    blocked: str | None = None


def blue_green_problem(seen: Observed) -> str | None:
    """Why the new version cannot run beside the old one and take over through the gate, or None when it can."""
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
    if (problem := commit_problem(seen.new_sink, new_gate)) is not None:
        return problem
    column = str(new_gate["column"])
    versions = (("the running version", seen.old_shape), ("the new version", seen.new_shape))
    problems = [p for which, shape in versions if (p := window_problem(shape, which, column))]
    return "; ".join(problems) if problems else room_for_two(seen)


LOCAL = ("", "file")  # the drivers (one host) take turns through a file lock beside the log
ATOMIC = ("hdfs",)  # a rename never overwrites: Delta's own put-if-absent holds across JVMs
STORE_LOCKED = ("s3", "s3a")  # a lock object in the table's storage, made of conditional writes
CONDITIONAL_WRITES = "conditional_writes"  # the pre-flight's finding in the new gate: True, or why not


def lock_store(sink: str | None) -> str | None:
    """The location of a Delta table whose drivers take turns through a lock object in its storage (on S3), which
    works only where that storage honours conditional writes (what the pre-flight tries); None otherwise."""
    ref = from_description(sink)
    if ref is None or ref.kind != DELTA or urlsplit(ref.location).scheme.lower() not in STORE_LOCKED:
        return None
    return ref.location


def commit_problem(sink: str | None, gate: dict[str, Any]) -> str | None:
    """Why two drivers cannot take turns at committing to the version's Delta table (both could write one version
    of its log, the second over the first: a commit lost), None where they can: a local table (a file lock), HDFS
    (atomic rename), S3 where the pre-flight found the table's storage honouring conditional writes (the lock
    object: gate.py `StoreLock`). Delta's default LogStore on S3 excludes other writers within one JVM only."""
    ref = from_description(sink)
    if ref is None or ref.kind != DELTA:
        return None  # not a Delta table: the gate refuses it already
    scheme = urlsplit(ref.location).scheme.lower()
    if scheme in LOCAL + ATOMIC:
        return None
    apart = f"two drivers cannot take turns at committing to {ref.location} (both could write one version of its log)"
    if scheme not in STORE_LOCKED:
        return f"{apart}: there is no commit lock for a {scheme}:// table"
    checked = gate.get(CONDITIONAL_WRITES)
    if checked is True:
        return None
    why = checked if isinstance(checked, str) else "the pre-flight did not try them"
    return (
        f"{apart}: on S3 they take turns through a lock object in the table's storage, made of conditional writes "
        f"(If-None-Match, If-Match), and {why}"
    )


SPLITTABLE = ("time window aggregation", "deduplication")  # what a plan may hold for its windows to be split at T
OWN_WINDOWS = "arbitrary state (TransformWithState"  # writes its own windows (what a migration's state feeds)
WHY_NOT = {
    "session window aggregation": "a session window (a record one version drops as late and the other accepts "
    "merges sessions differently: counted twice or lost)",
    "stream-stream join": "a stream-stream join (no window to split its rows by)",
    "aggregation": "an aggregation without a time window (its rows are updated, not closed per window)",
}


def window_problem(shape: dict[str, Any] | None, which: str, column: str) -> str | None:
    """Why a version's output cannot be split at a window end T with every window written once, whole, by one
    version; None when it can: one time window aggregation (tumbling or sliding; a deduplication before it
    allowed), one event-time watermark, and the gate column the window's end. A transformWithState writes its
    windows itself (the state a migration makes is one): its code, not its plan, says what a window is, so the job's
    declaration of its gate column is trusted; it still needs one watermark."""
    if not shape or "unknown" in shape:
        why = (shape or {}).get("unknown") or "it was started before its runtime reported it"
        return f"{which}'s plan is not known ({why}): nothing proves its windows can be split"
    watermarks, stateful = shape.get("watermarks") or [], list(shape.get("stateful") or [])
    if len(watermarks) != 1:
        return f"{which} has {len(watermarks)} event-time watermarks: the gate needs exactly one"
    if any(kind.startswith(OWN_WINDOWS) for kind in stateful):
        return None
    other = [WHY_NOT.get(kind, kind) for kind in stateful if kind not in SPLITTABLE]
    if other:
        return f"{which} holds {', '.join(other)}"
    windows = stateful.count("time window aggregation")
    if windows != 1:
        if not windows:
            return (
                f"{which} has no windowed state: its rows are written as they arrive, so late rows at or before T "
                "would be left by both versions"
            )
        return f"{which} has {windows} time window aggregations: the gate splits one"
    if not shape.get("gate_is_window_end"):
        return f"{which}'s gate column {column} is not the end of its time window"
    return None


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


def _problems(seen: Observed) -> dict[Mode, str | None]:
    """Per mode, why it is not possible (None: it is)."""
    beside = blue_green_problem(seen)
    state = f"the new version cannot take over the old state: {seen.state_problem}" if seen.state_problem else None
    migrate = beside
    if not seen.migrate:
        migrate = 'the version declares no migration function (jobs file: migrate = "package.module:function")'
    elif not seen.kafka_only:
        migrate = "the new version can start at the savepoint's positions only on Kafka sources"
    return {
        Mode.BLUE_GREEN: "; ".join(p for p in (state, beside) if p) or None,  # each reason there is
        Mode.STOP_RESTORE: state,
        Mode.MIGRATE: migrate,
        Mode.REPLAY: beside or seen.replay,
    }


def decide(requested: str | None, seen: Observed) -> Decision:
    """The requested mode if it is possible; else (auto) blue_green, or stop_restore, when the new version takes
    over the old state; when it cannot: migrate where the version declares how, else replay; else blocked."""
    problems = _problems(seen)
    gate = seen.new_gate["column"] if seen.new_gate and seen.new_gate.get("column") else "-"
    possible = {
        Mode.BLUE_GREEN: f"both versions write {seen.new_sink} through the gate on {gate} (append mode): the new "
        "version runs beside the old one and takes over at a window boundary, no gap",
        Mode.STOP_RESTORE: "the old version stops with a savepoint, the new one starts from it (always possible "
        "when the new version takes over the old state)",
        Mode.MIGRATE: f"{seen.migrate} turns the old state into the new version's initial state (checked on a "
        "throwaway run first); the new version runs beside the old one and takes over through the gate",
        Mode.REPLAY: f"the new version rebuilds its state: it {seen.replay_reason}, beside the old one, and takes "
        "over through the gate",
    }
    reasons = {
        mode: possible[mode] if problem is None else f"not possible: {problem}" for mode, problem in problems.items()
    }
    if requested:
        mode = Mode(requested)
        if problems[mode]:
            return Decision(None, reasons, f"{mode} was asked for but is {reasons[mode]}")
        return Decision(mode, reasons)
    order = [Mode.MIGRATE, Mode.REPLAY] if seen.state_problem else [Mode.BLUE_GREEN, Mode.STOP_RESTORE]
    for mode in order:
        if problems[mode] is None:
            return Decision(mode, reasons)
    why = "; ".join(f"{mode}: {problems[mode]}" for mode in (Mode.REPLAY, Mode.MIGRATE))
    return Decision(None, reasons, f"the new version cannot take over the old state ({seen.state_problem}), and {why}")


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
