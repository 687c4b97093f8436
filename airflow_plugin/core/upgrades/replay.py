"""Where a replay starts: the new version ("green") begins with empty state from source positions early enough
to rebuild every state it needs by the cutover, and runs beside the old one until it takes over at T.

What green needs. The job declares how far behind the newest event time its state reaches, `state_horizon` H
(a tumbling window plus its watermark delay). Green writes the windows ending after T, and T is at least the
old version's watermark W at the live savepoint (the floor the gate gets), so green needs every record whose
event time is at or after W - window, and W - H is earlier still. Both versions must have exactly one event-time
watermark, which their plans show (spark_jobs/runtime/shape.py); otherwise a replay is not offered.

Where those records start. Exact, from the old version's own offset log: batch k ran with watermark W_k =
(the newest event time of batches before k) - delay, so every record read before batch k has an event time at
most W_k + delay, where delay is the OLD version's. Green needs the records after W - window, that is after
W - H + its own delay. So the latest logged batch with W_k < W - H - max(0, old delay - new delay), the horizon
widened by how much longer the old version's delay is, starts at positions before which no record green needs
can lie: green starts at batch k's start (batch k-1's end, or the query's initial positions for k = 0), with the
watermark W_k (so it drops as late what the old version dropped). This holds for queries with one event-time
watermark (`withWatermark` once, on one stream).

When the offset log no longer reaches back that far (Spark keeps the newest 100 batches), the broker's
offsets-for-times instead: the first record whose Kafka timestamp is at or after W - H - margin. That assumes a
record's Kafka timestamp is at most `margin` earlier than its event time (producers that set the timestamp
from the event time, or write soon after it), and it is checked in every partition: green starts one record
earlier in each partition that holds records before its start (`boundary`), so that its first batch (batch 0)
reads exactly the last record the timestamps would skip there, and the newest event time of that batch must not
be after W - H (`check_first_batch`): otherwise records before the start may be needed, and the upgrade aborts.
The boundary records themselves belong to windows that end before T (their event times are that early), which
green never writes.

Unbounded state (no horizon declared: a running total since the beginning) can be replayed only from the
start of every partition, and only while the topic still holds it (nothing deleted).

A file source is replayed the same way from the files since then: batch k's start is the files its source's
log had taken in by batch k-1 (its `logOffset`, or none for k = 0); green starts with those counted as seen
(sources/files.py), so it reads exactly the files batch k and later read, and every file that arrives after.
When the offset log no longer reaches back, by the files' modification times instead: those modified before
W - H - margin count as seen (the same assumption as Kafka's timestamps, checked the same way). Without a
declared horizon, or without the old version's log, green starts fresh and reads every file.

The positions are then checked against the broker like any restore's (sources/kafka.py `compare`): records
retention deleted since make replay impossible, named per partition."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ..jobs.context import JobContext
from ..records.manifest import Manifest
from ..snapshots.checkpoint import LoggedBatch, OffsetLog
from ..sources import FILE, KAFKA, SourcePosition, offsets_by_source, positions
from ..sources import files as file_log
from ..sources.kafka import Broker, SourceCheck, Watermarks, compare, topics_of
from ..storage import Storage

DEFAULT_MARGIN_SECONDS = 60.0
HISTORY = "offset log"
TIMESTAMPS = "broker timestamps"
TOPIC_START = "topic start"
FILES = "file source"


@dataclass(frozen=True)
class ReplayStart:
    """Where green starts: its seed (spark_jobs/runtime: an empty batch 0 at `offsets` with `watermark_ms`, and
    per file source the old version's files it starts after, `files`; `offsets` None: a plain fresh start, every
    file read), what T may not be earlier than, and how it was found."""

    offsets: list[str] | None
    watermark_ms: int
    floor_ms: int
    cutoff_ms: int  # the event time green must hold every record from
    found: str  # HISTORY, TIMESTAMPS, TOPIC_START or FILES
    note: str
    check: dict[str, Any] | None = None  # the positions against the broker (SourceCheck.to_dict)
    records: int | None = None  # records to replay up to the live savepoint's positions
    # per file source id: {"checkpoint": the old version's, "through": log id} or {..., "before_ms": file time}
    files: dict[str, dict[str, Any]] | None = None
    # by broker timestamps: per source, where green really starts, one record before `offsets` in each partition
    # that holds records before them: its batch 0 reads exactly those, the records the timestamps decided to skip
    boundary: list[str] | None = None

    @property
    def seed(self) -> dict[str, Any] | None:
        """The runtime's `--seed` (spark_jobs/runtime): None for a plain fresh start."""
        if self.offsets is None:
            return None
        seed: dict[str, Any] = {"offsets": self.offsets, "watermark_ms": self.watermark_ms}
        return (
            seed
            | ({"files": self.files} if self.files else {})
            | ({"boundary": self.boundary} if self.boundary else {})
        )

    @property
    def by_timestamps(self) -> bool:
        return self.found == TIMESTAMPS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: dict[str, Any]) -> ReplayStart:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ReplayPlan:
    start: ReplayStart | None  # None: replay is not a path
    reason: str  # why it is one (what it reads), or why not and what would make it one


def _kafka_lines(snapshot: Sequence[SourcePosition], offsets: Mapping[tuple[str, int], int]) -> list[str]:
    """Per source of the snapshot, the position JSON with `offsets` for its topics' partitions."""
    lines = []
    for position in snapshot:
        chosen = {
            topic: {str(p): offsets[(topic, int(p))] for p in sorted(partitions, key=int)}
            for topic, partitions in sorted(position.offset.items())
        }
        lines.append(json.dumps(chosen, separators=(",", ":")))
    return lines


def partitions_of(snapshot: Sequence[SourcePosition]) -> list[tuple[str, int]]:
    return sorted({(topic, int(p)) for s in snapshot for topic, parts in s.offset.items() for p in parts})


def from_history(
    log_batches: Sequence[int], read: Callable[[int], LoggedBatch], initial: Callable[[str], str | None], before_ms: int
) -> tuple[LoggedBatch, list[str]] | None:
    """The latest logged batch k whose watermark is before `before_ms`, and where it started: batch k-1's end
    positions, or the query's initial positions for k = 0. A binary search: watermarks never fall. None when no
    logged batch qualifies (or its start is no longer logged)."""
    low, high, found = 0, len(log_batches) - 1, None
    while low <= high:
        middle = (low + high) // 2
        batch = read(log_batches[middle])
        if batch.watermark_ms < before_ms:
            found, low = (middle, batch), middle + 1
        else:
            high = middle - 1
    if found is None:
        return None
    index, batch = found
    if batch.batch_id == 0:
        sources = offsets_by_source(batch.offsets_version, batch.source_offsets)
        starts = [initial(source) for source in sources]
        return (batch, [s for s in starts if s is not None]) if all(starts) else None
    if index == 0 or log_batches[index - 1] != batch.batch_id - 1:
        return None  # batch k-1 is no longer logged: its end positions are unknown
    previous = read(batch.batch_id - 1)
    return batch, list(offsets_by_source(previous.offsets_version, previous.source_offsets).values())


def plan_replay(
    *,
    horizon_ms: int | None,
    snapshot_watermark_ms: int | None,
    snapshot_sources: Sequence[SourcePosition],
    history: OffsetLog | None,
    watermarks: Watermarks | None,
    by_time: Callable[[list[tuple[str, int]], int], dict[tuple[str, int], int]] | None,
    margin_ms: int,
    missing_files: Callable[[list[str]], list[str]] | None = None,
    wider_ms: int = 0,
) -> ReplayPlan:
    """Decide where green starts (see the module's doc). `history`: the old version's live checkpoint;
    `watermarks`: what the broker holds now (None: no broker known); `by_time`: the broker's offsets-for-times;
    `missing_files`: which of a file source's files are gone from its input (None: not checked); `wider_ms`: how
    much longer the old version's watermark delay is than the new one's (`delay_difference`)."""
    kinds = {p.kind for p in snapshot_sources}
    if not snapshot_sources:
        return ReplayPlan(None, "the snapshot records no source positions: nothing to replay from")
    if kinds == {FILE}:
        watermark = int(snapshot_watermark_ms or 0)
        horizon = None if horizon_ms is None else horizon_ms + wider_ms
        return _plan_files(horizon, watermark, snapshot_sources, history, margin_ms, missing_files)
    if kinds != {KAFKA}:
        other = ", ".join(sorted(kinds - {KAFKA}))
        return ReplayPlan(
            None, f"only Kafka sources (or a single file source) can be replayed; this query also reads {other}"
        )
    if watermarks is None:
        return ReplayPlan(
            None, "no Kafka broker is known to check the replay's positions against: declare the job's kafka"
        )
    kafka = list(snapshot_sources)
    watermark = int(snapshot_watermark_ms or 0)
    if horizon_ms is None:
        earliest = {(t, p): held[p][0] for t, held in watermarks.items() if held for p in held}
        deleted = {tp: e for tp, e in earliest.items() if e > 0 and tp in set(partitions_of(kafka))}
        if deleted:
            where = ", ".join(f"{t}-{p} starts at offset {e}" for (t, p), e in sorted(deleted.items()))
            return ReplayPlan(
                None,
                "the new version declares no state_horizon (its state is unbounded, or it does not say): a replay "
                f"must read every partition from its first record, but retention deleted records ({where}): declare "
                "the state's horizon in the job (StreamingJob(state_horizon=...)), or migrate the state",
            )
        lines = _kafka_lines(kafka, dict.fromkeys(partitions_of(kafka), 0))
        start = ReplayStart(lines, 0, watermark, 0, TOPIC_START, "every partition from offset 0")
        return _checked(start, kafka, watermarks, "the state is unbounded: every record from the topic's start")
    cutoff = watermark - horizon_ms - wider_ms
    logged = from_history(history.batch_ids, history.read, history.initial_offsets, cutoff) if history else None
    if logged is not None:
        batch, lines = logged
        note = f"where batch {batch.batch_id} of the old version began (its watermark {batch.watermark_ms} ms)"
        start = ReplayStart(lines, batch.watermark_ms, watermark, cutoff, HISTORY, note)
        return _checked(start, kafka, watermarks, f"from {note}, found in its offset log")
    if by_time is None:
        return ReplayPlan(
            None,
            "the old version's offset log no longer reaches back to where the replay must start (Spark keeps its "
            "newest 100 batches), and no broker is known to find the positions by time",
        )
    target = cutoff - margin_ms
    offsets = by_time(partitions_of(kafka), target)
    missing = [tp for tp in partitions_of(kafka) if tp not in offsets]
    if missing:
        return ReplayPlan(None, f"the broker gave no offset for {', '.join(f'{t}-{p}' for t, p in missing)}")
    trimmed = sorted(
        f"{t}-{p} (offset {o})"
        for (t, p), o in offsets.items()
        if o > 0 and o == ((watermarks.get(t) or {}).get(p) or (0,))[0]
    )
    if trimmed:  # the first record it still holds is already after the start time: what came before is unknown
        return ReplayPlan(
            None,
            f"the replay must start at the first records with a Kafka timestamp at or after {target} ms, but the "
            f"first records Kafka still holds are already later ({', '.join(trimmed)}): retention deleted records "
            "that may be needed. Raise the topic's retention (retention.ms), or migrate",
        )
    note = f"the first records with a Kafka timestamp at or after {target} ms (the horizon and a {margin_ms} ms margin)"
    earliest = {(t, p): held[0] for t, parts in watermarks.items() for p, held in (parts or {}).items()}
    before = {tp: o - 1 if o > earliest.get(tp, 0) else o for tp, o in offsets.items()}
    start = ReplayStart(
        _kafka_lines(kafka, offsets),
        max(cutoff, 0),
        watermark,
        cutoff,
        TIMESTAMPS,
        note,
        boundary=_kafka_lines(kafka, before),
    )
    return _checked(start, kafka, watermarks, f"from {note}, by the broker's offsets-for-times")


def _plan_files(
    horizon_ms: int | None,
    watermark: int,
    sources: Sequence[SourcePosition],
    history: OffsetLog | None,
    margin_ms: int,
    missing_files: Callable[[list[str]], list[str]] | None,
) -> ReplayPlan:
    """A file source's replay (see the module's doc): after the files the old version had read before the batch
    its start lies in, or before a file time; every file when neither can be known. Refused when files it must
    read again are gone from the input (a job that cleans its source, or someone who deleted them)."""
    if horizon_ms is None or history is None:
        why = "its state declares no horizon" if horizon_ms is None else "the old version's checkpoint is gone"
        start = ReplayStart(None, 0, watermark, 0, FILES, "a fresh start reads every file")
        return ReplayPlan(start, f"starts fresh and reads every file of its source directory again ({why})")
    cutoff = watermark - horizon_ms
    logged = {p.source: file_log.log_entries(history.storage, p.source) for p in sources}
    found = from_history(history.batch_ids, history.read, lambda _: file_log.NOTHING_READ, cutoff)
    if found is not None:
        batch, lines = found
        through = {p.source: file_log.log_offset(line) for p, line in zip(sources, lines, strict=True)}
        bounds = {source: {"through": -1 if at is None else at} for source, at in through.items()}
        where = f"after the files the old version read before its batch {batch.batch_id}"
        where += f" (watermark {batch.watermark_ms} ms)"
        how, watermark_ms = HISTORY, batch.watermark_ms
    else:
        bounds = {p.source: {"before_ms": cutoff - margin_ms} for p in sources}
        where = f"after the files modified before {cutoff - margin_ms} ms (the horizon and a {margin_ms} ms margin)"
        how, watermark_ms = TIMESTAMPS, max(cutoff, 0)
    skipped_paths = {
        e["path"]
        for s, bound in bounds.items()
        for e in file_log.seen(logged[s], through=bound.get("through"), before_ms=bound.get("before_ms"))
    }
    to_read = sorted({e["path"] for entries in logged.values() for e in entries} - skipped_paths)
    skipped, again = len(skipped_paths), len(to_read)
    gone = missing_files(to_read) if missing_files is not None else []
    if gone:
        named = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        return ReplayPlan(
            None,
            f"the replay must read again the {again} files {where}, but {len(gone)} of them are gone from the "
            f"input ({named}): put them back, or migrate",
        )
    uri = history.storage.uri
    start = ReplayStart(
        [file_log.START] * len(sources),
        watermark_ms,
        watermark,
        cutoff,
        how,
        f"{where}: {skipped} files skipped, {again} read again",
        files={source: {"checkpoint": uri, **bound} for source, bound in bounds.items()},
    )
    source_found = "found in its offset log" if how == HISTORY else "by file modification times"
    return ReplayPlan(start, f"reads {again} files again {where}, {source_found}, and every file after them")


def _checked(start: ReplayStart, snapshot: Sequence[SourcePosition], watermarks: Watermarks, why: str) -> ReplayPlan:
    """The start against what the broker holds: records gone before it make replay impossible."""
    assert start.offsets is not None
    replayed = positions(1, start.offsets)
    check: SourceCheck = compare(replayed, watermarks)
    records = _between(replayed, snapshot)
    start = ReplayStart(**{**asdict(start), "check": check.to_dict(), "records": records})
    if not check.restorable:
        problems = "; ".join(p.describe().replace("the snapshot resumes", "the replay starts") for p in check.problems)
        return ReplayPlan(
            None,
            f"the replay must start {start.note}, but the broker no longer holds those records: {problems}. Raise the "
            "topic's retention (retention.ms) above the state's horizon plus the time an upgrade takes, or migrate",
        )
    return ReplayPlan(start, f"replays {records} records, {why}")


def _between(start: Sequence[SourcePosition], end: Sequence[SourcePosition]) -> int:
    """Records from `start` up to the snapshot's positions `end`, over every partition."""
    ends = {(t, int(p)): int(o) for s in end for t, parts in s.offset.items() for p, o in parts.items()}
    begins = {(t, int(p)): int(o) for s in start for t, parts in s.offset.items() for p, o in parts.items()}
    return sum(max(ends[tp] - o, 0) for tp, o in begins.items() if tp in ends)


def delay_difference(old_shape: dict[str, Any] | None, new_shape: dict[str, Any] | None) -> int | str:
    """How much longer the old version's watermark delay is than the new one's (0 when it is not: the start then
    follows the new version's horizon), from each version's plan (DeploymentStatus.query_shape); or why a replay's
    start cannot be checked: each version needs exactly one event-time watermark of a known delay."""
    delays = []
    for which, shape in (("the running version", old_shape), ("the new version", new_shape)):
        if not shape or "unknown" in shape:
            why = (shape or {}).get("unknown") or "it was started before its runtime reported it"
            return f"{which}'s plan is not known ({why}): where a replay must start cannot be checked"
        marks = shape.get("watermarks") or []
        if len(marks) != 1 or marks[0].get("delay_ms") is None:
            return (
                f"{which} has {len(marks)} event-time watermarks: a replay's start is exact only for a query with "
                "one (withWatermark once, on one stream)"
            )
        delays.append(int(marks[0]["delay_ms"]))
    return max(0, delays[0] - delays[1])


def observe_replay(
    ctx: JobContext,
    manifest: Manifest,
    old_checkpoint: Storage,
    declared: dict[str, Any] | None,
    margin_s: float,
    shapes: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> ReplayPlan:
    """Where a replay from the live savepoint `manifest` would start (`plan_replay`), from what is there: the old
    version's live checkpoint (its offset log), the broker, what the new version declared in its pre-flight
    (`declared`: its state horizon) and both versions' plans (`shapes`, old and new: their watermark delays)."""
    wider = delay_difference(*shapes)
    if isinstance(wider, str):
        return ReplayPlan(None, wider)
    sources = positions(manifest.offsets_version, manifest.source_offsets)
    kafka = [p for p in sources if p.kind == KAFKA]
    watermarks: Watermarks | None = None
    by_time = None
    if kafka and ctx.kafka is not None:
        broker = Broker(ctx.kafka)
        watermarks = broker.watermarks(topics_of(kafka))
        by_time = broker.offsets_for_times
    return plan_replay(
        horizon_ms=(declared or {}).get("state_horizon_ms"),
        snapshot_watermark_ms=manifest.watermark_ms,
        snapshot_sources=sources,
        history=OffsetLog(old_checkpoint) if old_checkpoint.stat("metadata") is not None else None,
        watermarks=watermarks,
        by_time=by_time,
        margin_ms=int(margin_s * 1000),
        missing_files=lambda uris: file_log.missing(uris, ctx.open),
        wider_ms=wider,
    )


def check_first_batch(start: ReplayStart, first_rows: dict[str, Any] | None) -> str | None:
    """Green's first records against what a replay found by broker timestamps assumed (`first_rows`: the first batch
    that read rows, its batch id and event-time min and max, as the runtime reports them). Its batch 0 holds the
    last record the timestamps skipped in each partition (`boundary`): the newest of them must not be after the
    event time green must cover. Without boundary records (none before the start), its first records must begin
    at or before it. Why not, or None (also while green has read nothing yet)."""
    if not start.by_timestamps or not first_rows:
        return None
    boundary = start.boundary is not None and first_rows.get("batch") == 0
    seen_ms = _millis(first_rows.get("max" if boundary else "min"))
    if seen_ms is None or seen_ms <= start.cutoff_ms:
        return None
    which = "the last records before its start hold event times up to" if boundary else "its first records begin at"
    return (
        f"the replay by broker timestamps: in some partition {which} {seen_ms} ms, after the {start.cutoff_ms} ms it "
        "must cover from, so records before its start may have been needed (their Kafka timestamps are further from "
        "their event times than the margin assumes): raise the replay margin (--replay-margin)"
    )


def _millis(stamp: str | None) -> int | None:
    if not stamp:
        return None
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
