"""status.json: the one thing the engine reads about a running job. The board holds the current DeploymentStatus
and writes it whole (the store replaces objects atomically) after every change: on each committed batch
(from a StreamingQueryListener), on each state change, and from a heartbeat thread at least every few
seconds so that liveness is a fresh `updated_at`. Writes are serialised under one lock, so a stale
heartbeat can never overwrite a newer state, and nothing overwrites a terminal one.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StreamingQueryListener

from airflow_plugin.core.autoscale.load import add_batch, add_idle
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.fence import FENCED
from airflow_plugin.core.records.deployment import DeploymentStatus, State
from airflow_plugin.core.sinks import DELTA, delta, from_description
from airflow_plugin.core.storage import Storage, open_storage

if TYPE_CHECKING:
    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
    )

    from .fence import DriverFence

log = logging.getLogger(__name__)

TERMINAL = frozenset({State.STOPPED, State.FAILED})
RATE_WINDOW_S = 60.0  # the rows-per-second figure covers the batches of the last minute
FINAL_WRITE_ATTEMPTS = 5  # a lost STOPPED/FAILED leaves the engine waiting for a heartbeat timeout


def kafka_lag(sources: list[dict[str, Any]]) -> int | None:
    """The most records any partition of the Kafka sources is behind (Spark's maxOffsetsBehindLatest metric);
    None without a Kafka source."""
    lags = [
        int(float(source["metrics"]["maxOffsetsBehindLatest"]))
        for source in sources
        if str(source.get("description", "")).startswith("KafkaV2")
        and (source.get("metrics") or {}).get("maxOffsetsBehindLatest") not in (None, "")
    ]
    return max(lags) if lags else None


def kafka_backlog(sources: list[dict[str, Any]]) -> int | None:
    """The records of every partition of the Kafka sources behind their latest offsets once the batch is read
    (latestOffset less endOffset): what is left to read; None without a Kafka source that reports them."""
    behind = [
        _kafka_records(_offsets(source.get("endOffset")), _offsets(source.get("latestOffset")))
        for source in sources
        if str(source.get("description", "")).startswith("KafkaV2")
        and isinstance(_offsets(source.get("latestOffset")), dict)
    ]
    return sum(behind) if behind else None


def _offsets(value: Any) -> Any:
    """A source's start or end offset as JSON data (Spark's progress JSON nests it; pyspark gives a string)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _kafka_records(start: Any, end: Any) -> int:
    """Records between two Kafka offsets ({topic: {partition: offset}}). A transactional producer's commit
    marker takes one offset and carries no record, so a partition that moved by one is not counted."""
    records = 0
    for topic, partitions in (end or {}).items():
        for partition, offset in partitions.items():
            moved = int(offset) - int(((start or {}).get(topic) or {}).get(partition, offset))
            records += moved if moved > 1 else 0
    return records


def records_read(sources: list[dict[str, Any]]) -> int | None:
    """How much a batch read by its sources' offsets: Kafka records, or 1 for another source whose offset
    changed (a file source's new files, a rate source's seconds); None when it cannot be told (a run's first
    batch has no start offset)."""
    total = 0
    for source in sources:
        start, end = _offsets(source.get("startOffset")), _offsets(source.get("endOffset"))
        if start is None:
            return None
        if str(source.get("description", "")).startswith("KafkaV2") and isinstance(end, dict):
            total += _kafka_records(start, end)
        elif start != end:
            total += 1
    return total


def tally_unprocessed(seen: dict[str, int] | None, batch: int, rows: int, read: int | None) -> dict[str, int] | None:
    """The run's count of batches that read input by their offsets but processed no row (DeploymentStatus
    .unprocessed), after batch `batch` processed `rows` input rows having read `read` by its offsets. A batch
    that processed rows ends the streak; one that read nothing (a no-data batch moving the watermark) leaves it.
    `rows` is Spark's numInputRows, or -1 where the sink's own log shows that the batch wrote (`sink_wrote`)."""
    if rows != 0 and seen:
        return {**seen, "streak": 0}
    if rows != 0 or not read:
        return seen
    if not seen:
        return {"first": batch, "last": batch, "batches": 1, "streak": 1, "records": read}
    first = seen["first"] if seen.get("streak") else batch
    records = (seen.get("records", 0) if seen.get("streak") else 0) + read
    return {
        "first": first,
        "last": batch,
        "batches": seen["batches"] + 1,
        "streak": seen.get("streak", 0) + 1,
        "records": records,
    }


def sink_wrote(sink: str | None, progress: dict[str, Any]) -> bool:
    """Whether the batch of `progress` wrote to a Delta sink (`sink`: Spark's description of it), by the table's
    own log: the query's commit of the batch made since it began (delta.LogWatch: told by the log's versions
    against what this driver saw before the batch, not by other hosts' clocks). Spark's numInputRows is not proof
    that a batch ran nothing: it counts 0 for batches whose plan it cannot match to their sources, which a Delta
    sink may still have written. Only a Delta sink is asked."""
    ref = from_description(sink)
    started = progress.get("timestamp")
    if ref is None or ref.kind != DELTA or not started:
        return False
    since_ms = int(datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp() * 1000)
    try:
        return _watch(ref.location, str(progress.get("id"))).wrote(int(progress["batchId"]), since_ms)
    except (SavepointsError, OSError, ValueError) as exc:  # unreadable now: Spark's count stands
        log.warning("could not read the Delta log of %s for batch %s: %s", ref.location, progress.get("batchId"), exc)
        return False


@functools.lru_cache(maxsize=4)
def _table(location: str) -> Storage:
    """The sink table's storage, opened once per driver (an S3 client is not made for every batch)."""
    return open_storage(location)


@functools.lru_cache(maxsize=4)
def _watch(location: str, query_id: str) -> delta.LogWatch:
    """What this driver saw of the sink table's log for its query, kept between batches: each batch's look lists
    only what is new, and this run's commits are told from earlier runs' by their versions."""
    return delta.LogWatch(_table(location), query_id)


def _finite(value: Any) -> float | None:
    """Spark reports NaN/Infinity rates for empty batches; JSON readers other than Python's reject them."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def state_operators(progress: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each stateful operator's state as Spark's progress reports it after the batch: rows and memory used."""
    operators = progress.get("stateOperators")
    if not operators:
        return None
    return [
        {
            "name": op.get("operatorName"),
            "rows": op.get("numRowsTotal"),
            "memory_bytes": op.get("memoryUsedBytes"),
            "partitions": op.get("numShufflePartitions"),
            "batch_id": progress.get("batchId"),
        }
        for op in operators
    ]


class RowRate:
    """Input rows per second over the last RATE_WINDOW_S seconds. Spark's own processedRowsPerSecond is of the
    last batch alone, and a query with a watermark follows each batch of data with a no-data batch (0 rows)
    that moves the watermark: read from the last batch, a job busy all the time shows 0 half the time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._started = clock()
        self._batches: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, rows: int) -> None:
        self._batches.append((self._clock(), rows))
        self.total += rows

    def per_second(self) -> float:
        now = self._clock()
        while self._batches and self._batches[0][0] < now - RATE_WINDOW_S:
            self._batches.popleft()
        span = min(RATE_WINDOW_S, max(now - self._started, 1.0))
        return round(sum(rows for _, rows in self._batches) / span, 3)


class StatusBoard:
    """The current DeploymentStatus of one deployment and the only writer of its status.json."""

    def __init__(self, deployments: Deployments, job: str, deployment_id: str, initial: DeploymentStatus) -> None:
        self._deployments = deployments
        self._job = job
        self._deployment_id = deployment_id
        self._status = initial
        self._lock = threading.Lock()

    @property
    def current(self) -> DeploymentStatus:
        with self._lock:
            return replace(self._status, handled_requests=list(self._status.handled_requests))

    @property
    def terminal(self) -> bool:
        with self._lock:
            return self._status.state in TERMINAL

    def update(self, **fields: Any) -> bool:
        """Change fields and write; ignored (False) once the status is terminal."""
        with self._lock:
            if self._status.state in TERMINAL:
                return False
            self._status = replace(self._status, **fields, updated_at=time.time())
            self._write()
            return True

    def promote(self, from_state: State, to_state: State) -> bool:
        """Change the state only if it is still `from_state` (STARTING -> RUNNING happens once)."""
        with self._lock:
            if self._status.state is not from_state:
                return False
            self._status = replace(self._status, state=to_state, updated_at=time.time())
            self._write()
            return True

    def answer(self, request_id: str, answer: str) -> None:
        """Record a request that may be declined (a gate's) as handled, with its answer."""
        with self._lock:
            if self._status.state in TERMINAL:
                return
            handled = [*self._status.handled_requests, request_id]
            answers = {**self._status.answers, request_id: answer}
            self._status = replace(self._status, handled_requests=handled, answers=answers, updated_at=time.time())
            self._write()

    def acknowledge(self, request_id: str, state: State) -> None:
        """Record a control request as honoured (the engine matches on its id) and enter `state`."""
        with self._lock:
            if self._status.state in TERMINAL:
                return
            handled = [*self._status.handled_requests, request_id]
            self._status = replace(self._status, state=state, handled_requests=handled, updated_at=time.time())
            self._write()

    def finish(self, state: State, **fields: Any) -> None:
        """Write the terminal state, retrying: the engine waits for exactly this write."""
        if state not in TERMINAL:
            raise ValueError(f"{state} is not a final state")
        with self._lock:
            if self._status.state in TERMINAL:
                return
            self._status = replace(self._status, state=state, **fields, updated_at=time.time())
            for attempt in range(1, FINAL_WRITE_ATTEMPTS + 1):
                if self._write():
                    return
                time.sleep(min(2.0, 0.2 * 2**attempt))  # backoff between retries of a failed store write
            log.error("could not write the final state %s to the store", state)

    def beat(self) -> None:
        """Refresh `updated_at` (liveness) unless terminal."""
        self.update()

    def _write(self) -> bool:
        """Write under the lock held by the caller; a store hiccup must not kill the job, only be logged."""
        try:
            self._deployments.write_status(self._job, self._deployment_id, self._status)
            return True
        except (SavepointsError, OSError) as exc:
            log.warning("status write to the store failed (will retry with the next update): %s", exc)
            return False


class ProgressListener(StreamingQueryListener):
    """Feeds the board from Spark's listener bus. A progress event for batch N means commits/N is durable
    (docs/spark-checkpoints.md section 8), so last_batch_id is always a committed batch. Events of other
    queries in the same session (a benchmark's bare runs) are ignored by query id.

    Registered with the public `spark.streams.addListener`, but the JVM side gets a lighter adapter than
    pyspark's own (see `_jlistener`): pyspark converts every progress event field by field, about a
    hundred py4j round trips and ~40 ms of Python CPU per batch (plus as much in the JVM), which the
    benchmark measured as the runtime's largest cost. This one reads the progress as ONE JSON string."""

    def __init__(self, board: StatusBoard, clock: Callable[[], float] = time.time) -> None:
        self._board = board
        self._query_id: str | None = None
        self._ignored: set[str] = set()  # the standby's warm-up query (runner.py): its batches are not the job's
        self._jvm_listener: Any = None
        self.sink: str | None = None  # the sink as the runtime knows it, where Spark names only ForeachBatchSink
        self.batch_done = threading.Event()  # set on every committed batch: the stop logic waits for it
        self._rate = RowRate(clock)
        self._clock = clock

    def follow(self, query_id: str) -> None:
        self._query_id = query_id

    def ignore(self, query_id: str) -> None:
        self._ignored.add(query_id)

    def _ours(self, query_id: object) -> bool:
        if str(query_id) in self._ignored:
            return False
        return self._query_id is None or str(query_id) == self._query_id

    def progress(self, progress: dict[str, Any]) -> None:
        """A committed batch, as Spark's progress JSON."""
        if not self._ours(progress.get("id")):
            return
        self.batch_done.set()
        sources = progress.get("sources") or []
        lag, backlog = kafka_lag(sources), kafka_backlog(sources)
        current = self._board.current
        first = current.kafka_lag_first
        rows = int(progress.get("numInputRows") or 0)
        self._rate.add(rows)
        read = records_read(sources)
        sink = self.sink or (progress.get("sink") or {}).get("description")
        wrote = rows == 0 and bool(read) and sink_wrote(sink, progress)
        unprocessed = tally_unprocessed(current.unprocessed, progress.get("batchId", -1), -1 if wrote else rows, read)
        event_time = progress.get("eventTime") or {}  # min/max exist where the query defines a watermark
        first_rows = current.first_rows  # the first batch that read rows: where they began, and their newest
        if first_rows is None and rows > 0:
            first_rows = {"batch": progress.get("batchId"), "min": event_time.get("min"), "max": event_time.get("max")}
        self._board.update(
            first_rows=first_rows,
            unprocessed=unprocessed,
            last_batch_id=progress.get("batchId"),
            sources=[str(source.get("description")) for source in sources],
            kafka_lag=lag,
            kafka_lag_first=lag if first is None else first,
            input_rows_per_second=_finite(progress.get("inputRowsPerSecond")),
            processed_rows_per_second=_finite(progress.get("processedRowsPerSecond")),
            rows_per_second=self._rate.per_second(),
            input_rows_total=self._rate.total,
            state_operators=state_operators(progress) or current.state_operators,
            batch_duration_ms=progress.get("batchDuration"),
            watermark=event_time.get("watermark"),
            sink=sink,
            load=add_batch(current.load, self._clock(), rows, int(progress.get("batchDuration") or 0), backlog),
        )
        self._board.promote(State.STARTING, State.RUNNING)

    def idle(self, query_id: str) -> None:
        """A trigger found no data: the query is up and waiting."""
        if self._ours(query_id):
            self._board.promote(State.STARTING, State.RUNNING)
            load = add_idle(self._board.current.load, self._clock())  # measured as idle, not unmeasured
            self._board.update(rows_per_second=self._rate.per_second(), load=load)  # nothing arrives: the rate falls

    # the StreamingQueryListener interface, for callers that hand in pyspark's event objects
    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        """Nothing to do: the runner records ids when start() returns."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        self.progress(json.loads(event.progress.json))

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        self.idle(str(event.id))

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        """Nothing to do: the runner sees the end through awaitTermination and writes the final state."""

    @property
    def _jlistener(self) -> Any:
        """The JVM-side listener pyspark's addListener registers: Spark's own wrapper class around our
        light adapter instead of pyspark's converting one."""
        if self._jvm_listener is None:
            from pyspark import SparkContext

            jvm: Any = SparkContext._jvm
            self._jvm_listener = jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))
        return self._jvm_listener


class _JsonEvents:
    """Implements the JVM interface PythonStreamingQueryListener through py4j (as pyspark's own adapter
    does), passing progress on as parsed JSON."""

    def __init__(self, listener: ProgressListener) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        """Not needed (see ProgressListener.onQueryStarted)."""

    def onQueryProgress(self, jevent: Any) -> None:
        self._listener.progress(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        self._listener.idle(jevent.id().toString())

    def onQueryTerminated(self, jevent: Any) -> None:
        """Not needed (see ProgressListener.onQueryTerminated)."""

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class Heartbeat:
    """A daemon thread that rewrites the status every `interval` seconds until stopped. With a fence (fence.py) it
    renews the fence first, at least three times a fence interval, and a driver left out of its job's writers
    writes FAILED (FENCED) instead of another live heartbeat."""

    def __init__(self, board: StatusBoard, interval: float, fence: DriverFence | None = None) -> None:
        self._board = board
        self._fence = fence
        self._interval = min(interval, fence.interval / 3) if fence is not None else interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="savepoints-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            if self._board.terminal:
                return
            if self._fence is not None:
                self._fence.renew()
                if self._fence.superseded:
                    self._board.finish(State.FAILED, error_class=FENCED, error_message=self._fence.superseded)
                    return
            self._board.beat()
