"""Delivery guarantees (eKuiper's qos levels) mapped to concrete Spark settings; docs/delivery.md has the
table. A guarantee is a promise about the whole pipeline, so a job DECLARES what it reads from and writes
to, and the runtime judges the declaration before it starts anything: exactly-once refuses a sink it knows
is not idempotent, and one it knows nothing about. (Which output the writer goes to is read from Spark's
JVM writer for the sink guard, sink.py; that says where, not what the job promises.) A script run as it is
declares nothing in code: its source and sink are recognised from its query (script.py), and what only its author
knows, a foreachBatch that writes by batch id, its version declares in the jobs file (`foreach_batch`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.streaming import DataStreamWriter

    from .initial import InitialState


class Delivery(StrEnum):
    AT_MOST_ONCE = "at-most-once"  # qos 0: no recovery state, nothing replayed
    AT_LEAST_ONCE = "at-least-once"  # qos 1: checkpoint + rewindable source; a replayed batch may be written twice
    EXACTLY_ONCE = "exactly-once"  # qos 2: checkpoint + rewindable source + idempotent sink


class SourceKind(StrEnum):
    FILE = "file"  # rewindable while the input files stay where they are
    KAFKA = "kafka"  # rewindable by offsets (within the topic's retention)
    RATE = "rate"  # deterministic from its offset: rewindable
    DELTA = "delta"  # table versions: rewindable
    SOCKET = "socket"  # gone once read: not rewindable
    MEMORY = "memory"  # lives in one driver: not rewindable across processes
    UNKNOWN = "unknown"


class SinkKind(StrEnum):
    FILE = "file"  # the file sink logs committed batch ids in <output>/_spark_metadata and skips replays
    DELTA = "delta"  # a Delta table records (query id, batch id) in each commit and skips replays
    IDEMPOTENT_FOREACH_BATCH = "idempotent-foreach-batch"  # foreachBatch that overwrites by batch id
    NOOP = "noop"  # writes nothing
    KAFKA = "kafka"  # no transactions: a replayed batch is produced again
    CONSOLE = "console"
    MEMORY = "memory"
    FOREACH = "foreach"  # a row writer sees replayed rows again
    FOREACH_BATCH = "foreach-batch"  # foreachBatch not declared idempotent
    UNKNOWN = "unknown"


REWINDABLE = frozenset({SourceKind.FILE, SourceKind.KAFKA, SourceKind.RATE, SourceKind.DELTA})
NOT_REWINDABLE = frozenset({SourceKind.SOCKET, SourceKind.MEMORY})
IDEMPOTENT = frozenset({SinkKind.FILE, SinkKind.DELTA, SinkKind.IDEMPOTENT_FOREACH_BATCH, SinkKind.NOOP})

_WHY_NOT_IDEMPOTENT = {
    SinkKind.KAFKA: "the Kafka sink has no transactions: a batch replayed after a failure is produced again "
    "(at-least-once)",
    SinkKind.CONSOLE: "the console sink prints a replayed batch again and keeps nothing",
    SinkKind.MEMORY: "the memory sink lives in one driver and is lost with it",
    SinkKind.FOREACH: "a foreach writer receives the rows of a replayed batch again",
    SinkKind.FOREACH_BATCH: "a foreachBatch function sees a replayed batch id again; if it writes by batch id "
    "(a replay overwrites what it wrote), declare it: SinkKind.IDEMPOTENT_FOREACH_BATCH in a build, "
    'foreach_batch = "idempotent" on a script\'s version in the jobs file',
    SinkKind.UNKNOWN: "the job did not declare its sink: return StreamingJob(writer, sink=SinkKind...) from build",
}


@dataclass(frozen=True)
class StreamingJob:
    """What a job's `build` returns: the query, built but not started, and what it reads and writes.
    The runtime sets checkpointLocation and the trigger itself; don't."""

    writer: DataStreamWriter
    sink: SinkKind = SinkKind.UNKNOWN
    source: SourceKind = SourceKind.UNKNOWN
    name: str | None = None  # the query name; defaults to the job name
    # the output column holding each row's window end (a timestamp): a job that appends to a Delta table and
    # names it can be upgraded blue/green, the runtime writing its batches through the gate (gate.py)
    gate_column: str | None = None
    # how far behind the newest event time the query's state reaches, e.g. "2 minutes" (a window plus its
    # watermark delay); None: unbounded or not said. An upgrade's replay starts that far back (replay.py)
    state_horizon: str | None = None
    # the initial state its transformWithState takes (initial.py): what a migration function must return
    initial_state: InitialState | None = None


class DeliveryRefused(Exception):
    """The job's declared source or sink cannot give the requested guarantee: nothing was started."""

    error_class = "DELIVERY_GUARANTEE_NOT_MET"


@dataclass
class DeliveryPlan:
    """The concrete settings of one guarantee for one job."""

    delivery: Delivery
    checkpoint: str  # what the query's checkpointLocation is set to
    throwaway: bool  # a fresh location per driver process: nothing is ever resumed from it
    warnings: list[str] = field(default_factory=list)


def check(delivery: Delivery, job: StreamingJob) -> list[str]:
    """Raise DeliveryRefused if the declaration cannot give `delivery`; return warnings otherwise."""
    warnings: list[str] = []
    if delivery is Delivery.AT_MOST_ONCE:
        if job.source in (SourceKind.FILE, SourceKind.RATE):
            warnings.append(
                f"at-most-once with a {job.source} source: a fresh start reads the source from its beginning "
                "again (it has no 'latest' start position), so a restarted deployment repeats output"
            )
        return warnings
    if job.source in NOT_REWINDABLE:
        raise DeliveryRefused(
            f"{delivery} needs a rewindable source, but a {job.source} source cannot replay what it gave: "
            "use a file, Kafka, rate or Delta source, or run at-most-once"
        )
    if delivery is Delivery.EXACTLY_ONCE:
        if job.source not in REWINDABLE:
            raise DeliveryRefused(
                "exactly-once needs a rewindable source and the job did not declare its source: "
                "return StreamingJob(writer, sink=..., source=SourceKind...) from build"
            )
        if job.sink not in IDEMPOTENT:
            raise DeliveryRefused(
                f"exactly-once refuses the {job.sink} sink: {_WHY_NOT_IDEMPOTENT[job.sink]}. "
                f"Use an idempotent sink ({', '.join(sorted(IDEMPOTENT))}) or run at-least-once"
            )
    return warnings


def plan(delivery: Delivery, job: StreamingJob, checkpoint: str) -> DeliveryPlan:
    """Check the job, then decide the checkpoint: the deployment's own location, or for at-most-once a
    fresh sub-location per process start, so that nothing is ever replayed. It lives on the deployment's
    storage (not the driver's /tmp, which executors on other hosts cannot reach) and goes when retention
    deletes the deployment's checkpoint. Spark needs SOME checkpoint for stateful queries and file sinks."""
    warnings = check(delivery, job)
    if delivery is Delivery.AT_MOST_ONCE:
        throwaway = f"{checkpoint.rstrip('/')}/at-most-once-{int(time.time())}-{secrets.token_hex(3)}"
        return DeliveryPlan(delivery, throwaway, True, warnings)
    return DeliveryPlan(delivery, checkpoint, False, warnings)
