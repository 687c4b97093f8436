"""A job's load as its runtime reports it: its committed batches summed into buckets of BUCKET_S seconds (the
heartbeat's `load`, spark_jobs/runtime/status.py), the last KEEP_S seconds of them; and `Figures`, what a window
of buckets says:

    utilisation     the share of the window the query spent running batches (their durations over the window):
                    above the target the job cannot keep up with room to spare; near 1 it runs batch after batch
    processing      rows a second while busy: what the job can do at its size (Flink's "true processing rate")
    arrival         rows a second arriving at the sources: the rows read plus the backlog's growth, over the window
    backlog         Kafka records behind the latest offsets at the window's end (None without a Kafka source), and
                    its growth over the window

A bucket is data, in JSON: {"t": its start (epoch s), "batches", "rows", "busy_ms", "backlog": records behind at
its last batch or None}; an idle query's bucket has no batch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

BUCKET_S = 10  # a bucket's length: windows are read in these steps
KEEP_S = 1800  # the runtime keeps this much: the longest window a decision reads (scale-down's) fits in it


def add_batch(
    load: list[dict[str, Any]], at: float, rows: int, busy_ms: int, backlog: int | None
) -> list[dict[str, Any]]:
    """`load` with one committed batch added (a new list: the heartbeat's copy is written as it was)."""
    kept = add_idle(load, at)
    bucket = kept[-1]
    bucket["batches"] += 1
    bucket["rows"] += max(rows, 0)
    bucket["busy_ms"] += max(busy_ms, 0)
    bucket["backlog"] = backlog
    return kept


def add_idle(load: list[dict[str, Any]], at: float) -> list[dict[str, Any]]:
    """`load` with a bucket for the time `at` (a new list): a query up and waiting for data (Spark's idle event, a
    trigger that found none) is measured as a time of no batch. Without it a deployment that never ran a batch (a
    quiet night after a rescale) would look unmeasured, and never be scaled down."""
    start = int(at // BUCKET_S * BUCKET_S)
    kept = [dict(b) for b in load if b["t"] > start - KEEP_S]
    if not kept or kept[-1]["t"] != start:
        kept.append({"t": start, "batches": 0, "rows": 0, "busy_ms": 0, "backlog": None})
    return kept


@dataclass(frozen=True)
class Figures:
    """What one window of load says (load.py's docstring); rates in rows a second."""

    seconds: float  # the window the buckets cover
    batches: int
    rows: int
    utilization: float
    processing_rate: float | None  # None: no row processed in the window (nothing to measure it by)
    arrival_rate: float
    backlog: int | None
    backlog_growth: int | None  # records: the backlog at the window's end less at its start
    backlog_floor: int | None  # the least backlog seen in the window

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def window(load: Sequence[dict[str, Any]], seconds: float, now: float) -> Sequence[dict[str, Any]]:
    """The buckets of the last `seconds` before `now` (whole buckets: a bucket counts if it began in the window)."""
    return [b for b in load if now - seconds <= b["t"] < now]


def span(seconds: float, now: float) -> float:
    """The time the buckets of `window(load, seconds, now)` stand for: from the first bucket start in the window to
    `now` (the newest bucket is only as full as the time it has run). Dividing by `seconds` instead would read a
    job busy all the time as up to a bucket less busy."""
    return now - math.ceil((now - seconds) / BUCKET_S) * BUCKET_S


def covered(load: Sequence[dict[str, Any]], since: float, now: float) -> float:
    """How many seconds of the window from `since` the runtime's load covers: from its oldest bucket (a
    deployment that started within the window covers only its own part of it)."""
    if not load:
        return 0.0
    return max(0.0, now - max(since, float(load[0]["t"])))


def figures(buckets: Sequence[dict[str, Any]], seconds: float) -> Figures:
    """The figures of a window of `seconds` whose buckets are `buckets` (a window with no batch at all, its buckets
    idle or missing, has utilisation 0)."""
    seconds = max(seconds, float(BUCKET_S))
    rows = sum(int(b["rows"]) for b in buckets)
    busy = sum(int(b["busy_ms"]) for b in buckets) / 1000.0
    backlogs = [int(b["backlog"]) for b in buckets if b.get("backlog") is not None]
    growth = backlogs[-1] - backlogs[0] if len(backlogs) >= 2 else (0 if backlogs else None)
    arrival = (rows + max(growth or 0, -rows)) / seconds  # a backlog that fell was read, not newly arrived
    return Figures(
        seconds=seconds,
        batches=sum(int(b["batches"]) for b in buckets),
        rows=rows,
        utilization=min(busy / seconds, 1.0),
        processing_rate=rows / busy if busy > 0 and rows > 0 else None,
        arrival_rate=arrival,
        backlog=backlogs[-1] if backlogs else None,
        backlog_growth=growth,
        backlog_floor=min(backlogs) if backlogs else None,
    )
