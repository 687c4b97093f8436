"""Whether a query may start on its sink: the one rule every start applies, whatever starts it (a restore's
plan, a deployment's fresh start, the job runtime in the driver just before it starts the query).

A query that starts after batch N runs batches N+1, N+2, ... into its sink. An exactly-once sink that
already holds those batch ids makes them vanish:
  - the file sink skips every batch id its log (`_spark_metadata`) already has: nothing is written, and a
    stateful query never runs those batches, so their state versions never exist either (the next real
    batch fails to load them). A fresh start is a start after batch -1: onto an output an earlier deployment
    wrote, EVERY record it reads is lost, silently (docs/spark-checkpoints.md section 6);
  - a Delta table skips a batch id at or below the newest one its log records for the query's id (the txn
    appId). A fresh query has a new id, so Delta skips nothing: a fresh start onto a table an earlier
    deployment wrote re-reads the source from its start position and writes those records a second time.

`start_bound` says which batches a sink may already hold, `ahead` whether it holds more, and `Ahead.refusal`
words the refusal with the ways out; `plan_fresh_rewind` and `execute_rewind` move a sink back for a fresh
start (a restore's rewinds are planned by snapshots/restore.py and carried out the same way). Only the kinds
in GUARDED are understood."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Refused
from ..sinks import DELTA, FILE, SinkRef
from ..sinks import delta as delta_sink
from ..sinks import file as file_sink
from ..spark_app import SparkAccess
from ..storage import Storage

SINK_AHEAD = "SINK_AHEAD"  # the error class of a start the job runtime refused: the engine's exit 4
FRESH = -1  # the batch a fresh start resumes after
FRESH_START = "at batch 0 (a fresh start, with a new query id)"


def start_bound(last_committed: int | None, pending: int | None, stateful: bool) -> int:
    """The last batch a sink may already hold for a query resuming after `last_committed` (None: nothing
    committed, a fresh start). A stateful query must run every later batch itself (a skipped batch writes
    no state); a stateless one may find its pending batch (logged offsets, no commit) already in the sink:
    it is replayed with the same offsets, so skipping it loses nothing."""
    committed = FRESH if last_committed is None else last_committed
    if stateful or pending is None:
        return committed
    return pending


@dataclass(frozen=True)
class Ahead:
    """A sink that holds batches the starting query would run again."""

    sink: SinkRef
    holds: str  # what it holds: "file sink s3a://lake/out has committed batches up to 87"
    skipped: str  # the batches the query would lose or write twice: "0..87"
    duplicates: bool  # True: written twice (Delta under a new query id); False: skipped, so lost

    def refusal(self, start: str, stateful: bool, rewind: str) -> str:
        """The refusal: what the sink holds, where the query starts (`start`: "at batch 0, a fresh start"), what
        would happen, the ways out (`rewind`: what --rewind-sink does for it, or why it cannot)."""
        if self.duplicates:
            consequence = (
                f"Delta does not skip a new query's batches, so every record the query reads again would be "
                f"written to the table twice (batches {self.skipped} hold them already)"
            )
        else:
            consequence = f"Spark would skip batches {self.skipped} as already written: every record they read is lost"
            if stateful:
                consequence += " and the state they should write never exists"
        return (
            f"{self.holds}, and this query starts {start}: {consequence}. Nothing was started. Ways out: write to "
            f"another output location; rewind the sink (`--rewind-sink`, the deploy DAG's `rewind_sink`): {rewind}; "
            "or restore the state that matches the sink (`--restore latest-state`)"
        )


def ahead(
    sink: SinkRef, storage: Storage, bound: int, query_id: str | None = None, planned_ms: int | None = None
) -> Ahead | None:
    """Whether `sink` (opened as `storage`) holds batches after `bound` that the query would run. `query_id`:
    the id the query restarts with (a checkpoint's `metadata`); None for a fresh start, whose id is new.
    `planned_ms`: when batch `bound` was planned (a Delta table's log is read back to about then; None: whole)."""
    if sink.kind == FILE:
        position = file_sink.position(storage)
        if position is None or position <= bound:
            return None
        held = f"file sink {sink.location} has committed batches up to {position}"
        return Ahead(sink, held, _span(bound + 1, position), False)
    if sink.kind != DELTA or not delta_sink.is_table(storage):
        return None
    if query_id is None:
        newest = delta_sink.newest_streaming_write(storage)
        if newest is None:
            return None
        held = f"Delta table {sink.location} holds batches up to {newest.batch_id} of query {newest.query_id}"
        return Ahead(sink, held, _span(0, newest.batch_id), True)
    last = delta_sink.last_batch(storage, query_id, planned_ms)
    if last is None or last <= bound:
        return None
    held = f"Delta table {sink.location} holds batches up to {last} of query {query_id}"
    return Ahead(sink, held, _span(bound + 1, last), False)


def rewind_of_fresh_start(sink: SinkRef, storage: Storage) -> str:
    """What `--rewind-sink` does for a fresh start onto this sink (for messages)."""
    if sink.kind == FILE:
        return f"its output is moved aside into {sink.location.rstrip('/')}/{file_sink.QUARANTINE} and written again"
    version = delta_sink.version_before_streaming(storage)
    if version is None:
        return (
            "not possible here: the table was created by its first streaming write, so Delta's RESTORE cannot take "
            "it back to before it; move the table aside instead"
        )
    return f"Delta's RESTORE takes the table back to version {version}, before its first streaming write"


def _span(first: int, last: int) -> str:
    return f"{first}..{last}" if last > first else str(last)


Rewind = file_sink.Rewind | delta_sink.Rewind


def plan_fresh_rewind(sink: SinkRef, storage: Storage, tag: str, spark: SparkAccess | None) -> Rewind:
    """`--rewind-sink` for a fresh start: the file sink's whole output moved aside (a rewind to before batch
    0), or the Delta table RESTOREd to the version before its first streaming write. `tag` names the file
    sink's quarantine directory."""
    if sink.kind == FILE:
        return file_sink.plan_rewind(storage, None, FRESH, tag)
    version = delta_sink.version_before_streaming(storage)
    if version is None:
        raise Refused(
            f"Delta table {sink.location} cannot be rewound for a fresh start: {rewind_of_fresh_start(sink, storage)}. "
            "Nothing was written"
        )
    return delta_sink.plan_rewind(storage, version, delta_sink.writes_after(storage, version), spark)


def execute_rewind(storage: Storage, rewind: Rewind) -> None:
    """Carry out a planned rewind (each kind's `execute` may be repeated after an interruption)."""
    if isinstance(rewind, delta_sink.Rewind):
        delta_sink.execute(storage, rewind)
    else:
        file_sink.execute(storage, rewind)
