"""The gate of a blue/green upgrade, inside the driver: which rows this deployment writes to its Delta table.

During a blue/green upgrade two versions of a job run at once (docs/architecture.md, "Blue/green upgrades"):
the running one (blue) and the new one (green), restored from a live savepoint of blue under a query id of its
own. Both compute the same windows; each window must reach the table from exactly one of them. The gate splits
them by an output column the job names, the window's end (`StreamingJob(..., gate_column="window_end")`): blue
writes the windows ending at or before a time T, green those ending after it. Until T is chosen green writes
into a staging table of its own; blue accepts T only if it has written nothing ending after T, and green then
publishes, in one Delta commit, what it staged and what its batch emits, of the windows after T. From then on
no window can come from both, and none from neither.

The runtime owns the write for that: a job whose query appends to a Delta table and names its gate column runs
through `foreachBatch` here instead of Spark's Delta sink, appending each batch with Delta's idempotent batch
writes (`txnAppId` = the query id, `txnVersion` = the batch id): what Spark's own Delta sink records, so the
table's exactly-once is the same, and a deployment may switch between the two across a restore.

T is chosen by blue itself, at a batch boundary: the latest window end it has written (plus a margin, if the
upgrade asks for one), and no earlier than the floor the upgrade names (a green that rebuilt its state by replay
holds every window only from the live savepoint's watermark on: the windows up to it are all blue's, already
written by then). So blue never has to decline for having written past a T chosen elsewhere a moment
earlier; the windows of that batch ending after T are left to green, which holds every one of them.

Roles (`status.gate`): `sole` writes every window of its interval (a deployment on its own; an interval
inherited from an upgrade still applies); `staging` is green before the cutover; `blue` writes only windows
ending at or before `until`; `green` only those ending after `after`. `gate` (to blue), `ungate` (to blue,
when an upgrade is aborted) and `publish` (to green) requests come through the control channel and are
decided at the start of the next batch, in the query's own thread, and answered in the status."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_plugin.core.jobs.deployments import ControlRequest
from airflow_plugin.core.sinks.delta import is_table
from airflow_plugin.core.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

SOLE, STAGING, BLUE, GREEN = "sole", "staging", "blue", "green"
ACTIONS = ("gate", "ungate", "publish")
WRITE_ATTEMPTS = 5  # a Delta append that lost a race with the other version's commit is tried again
# Delta's optimistic concurrency: a commit that lost to a concurrent one (the other version's append, or its
# schema change: v2 may add a column with mergeSchema) is refused with one of these; tried again, it re-reads
LOST_RACE = re.compile(r"io\.delta\.exceptions\.(Concurrent\w*|MetadataChanged|ProtocolChanged)Exception")


def iso(millis: int | None) -> str | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class GateState:
    """The gate as the status records it (`DeploymentStatus.gate`); times in epoch milliseconds."""

    column: str
    role: str = SOLE
    after: int | None = None  # writes only rows whose column is later than this (green)
    until: int | None = None  # ... and not later than this (blue)
    max_written: int | None = None  # the latest column value this deployment wrote to the live table
    dropped: int = 0  # rows blue left to green (ending after `until`): once any, blue cannot simply go on alone
    staging: str | None = None  # green's staging table, until it publishes
    published_batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "after_at": iso(self.after), "until_at": iso(self.until)}


@dataclass(frozen=True)
class DeltaTarget:
    """Where and how the job's query appends (read from its writer: sink.py), written here per batch."""

    path: str
    options: dict[str, str] = field(default_factory=dict)


Answer = Callable[[ControlRequest, str], None]  # a request and "accepted" or why it was declined


class GatedWriter:
    """The `foreachBatch` function of a gated Delta job. The runner hands it the gate's requests (`submit`);
    it reports the gate after every batch (`report`) and answers each request (`answer`)."""

    def __init__(
        self,
        spark: SparkSession,
        target: DeltaTarget,
        gate: GateState,
        checkpoint: str,
        report: Callable[[GateState], None],
        answer: Answer,
    ) -> None:
        self.spark, self.target, self.gate, self.checkpoint = spark, target, gate, checkpoint
        self._report, self._answer = report, answer
        self._pending: list[ControlRequest] = []
        self._publishing: ControlRequest = ControlRequest("", "publish")
        self._lock = threading.Lock()
        self._query_id: str | None = None

    def submit(self, request: ControlRequest) -> None:
        with self._lock:
            self._pending.append(request)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            requests, self._pending = self._pending, []
        publish = [t for request in requests if (t := self._decide(request, batch_id)) is not None]
        from pyspark.sql import functions as F

        column = F.unix_millis(F.col(self.gate.column))
        batch = batch.persist()  # one run of the batch's plan (its state), however often it is read here
        try:
            # the plan runs here, before any write: a batch a table already holds (its txn), which Delta then
            # skips, still writes its state; a restored pending batch the live table took before a crash is safe
            batch.count()
            if publish:
                self._publish(batch, batch_id, column, publish[-1])
                self._report(self.gate)
                self._answer(self._publishing, "accepted")  # only now: the engine may remove the staging table
            elif self.gate.role == STAGING:
                self._append(batch, str(self.gate.staging), batch_id)
            else:
                if self.gate.until is not None:
                    self.gate.dropped += batch.where(column > self.gate.until).count()
                self._write_live(self._within(batch, column), batch_id, column)
        finally:
            batch.unpersist()
        self._report(self.gate)

    def _decide(self, request: ControlRequest, batch_id: int) -> int | None:
        """Apply or decline one request at this batch boundary; returns T when it is a publish to do now. A gate
        request names no T but a margin: T is chosen here, at a batch boundary, from what this deployment has
        written (nothing after T, by construction), plus the margin; the status then holds it (`until`)."""
        values = request.gate or {}
        t = int(values.get("t", 0))
        gate, declined, publish = self.gate, None, None
        if request.action == "gate":
            if gate.role == STAGING:
                declined = "it is staging, not writing the live table"
            else:
                floor = int(values.get("floor", 0))  # a green that did not start from this state holds no earlier
                t = max(gate.max_written or 0, gate.after or 0, floor) + int(values.get("margin", 0))
                gate.role, gate.until = BLUE, t
        elif request.action == "ungate":
            if gate.role == BLUE and gate.dropped:
                declined = f"it already left {gate.dropped} rows ending after {iso(gate.until)} to the new version"
            elif gate.role == BLUE:
                gate.role, gate.until = SOLE, None
        elif gate.role != STAGING:  # publish
            declined = f"it is {gate.role}, not staging"
        else:
            self._publishing = request  # answered once its commit is in (__call__)
            return t
        answer = "accepted" if declined is None else f"declined: {declined}"
        log.info("%s request %s (T %s) at batch %d: %s", request.action, request.id, iso(t), batch_id, answer)
        self._report(self.gate)  # the gate as it is now (T), before the answer the engine waits for
        self._answer(request, answer)
        return publish

    def _within(self, rows: DataFrame, column: Column) -> DataFrame:
        if self.gate.after is not None:
            rows = rows.where(column > self.gate.after)
        if self.gate.until is not None:
            rows = rows.where(column <= self.gate.until)
        return rows

    def _write_live(self, rows: DataFrame, batch_id: int, column: Column) -> None:
        from pyspark.sql import functions as F

        latest = rows.agg(F.max(column)).collect()[0][0]
        self._append(rows, self.target.path, batch_id)
        if latest is not None:
            self.gate.max_written = max(int(latest), self.gate.max_written or int(latest))

    def _publish(self, batch: DataFrame, batch_id: int, column: Column, t: int) -> None:
        """Green's cutover, one Delta commit: the windows after T that it staged, and those of this batch."""
        self.gate.role, self.gate.after, self.gate.until = GREEN, t, None
        rows = batch
        if is_table(open_storage(str(self.gate.staging))):  # it staged at least one batch
            staged = self.spark.read.format("delta").load(str(self.gate.staging))
            rows = staged.unionByName(batch, allowMissingColumns=True)
        self._write_live(self._within(rows, column), batch_id, column)
        self.gate.published_batch, self.gate.staging = batch_id, None
        log.info("published at batch %d: windows ending after %s come from this deployment", batch_id, iso(t))

    def _append(self, rows: DataFrame, path: str, batch_id: int) -> None:
        """Append with Delta's idempotent batch write; a commit that lost a race with the other version's is
        tried again (Delta skips it if it got in after all)."""
        writer = rows.write.format("delta").mode("append").options(**self.target.options)
        writer = writer.option("txnAppId", self.query_id).option("txnVersion", batch_id)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                writer.save(path)
                return
            except Exception as exc:  # Delta's concurrent-modification errors come through py4j
                if not LOST_RACE.search(str(exc)[:2000]) or attempt == WRITE_ATTEMPTS:
                    raise
                log.warning("batch %d: the Delta commit lost a race (%s); trying again", batch_id, str(exc)[:200])
                time.sleep(0.2 * attempt)

    @property
    def query_id(self) -> str:
        """The query's id as its checkpoint records it: what Spark's own Delta sink uses as the txn appId."""
        if self._query_id is None:
            self._query_id = str(json.loads(open_storage(self.checkpoint).read("metadata"))["id"])
        return self._query_id
