"""Windowed job "by_country": events per (country, minute), coarser than v3's per (user, country), with a
transformWithState operator instead of v3's aggregation, so that an upgrade from v3 can MIGRATE the state
(migrations.py `per_country`) rather than rebuild it by replay.

State, per key (window_start, country): `events` (a value state: the count so far) and `seen` (a list state:
the Kafka `seq`s counted, the deduplication v3 does with dropDuplicatesWithinWatermark before its
aggregation, kept here so that a record retried across the savepoint is not counted again). An event-time
timer at the window's end emits the window once the watermark passes it and clears the key, as v3's append
mode does. Late records never reach it: in event-time mode Spark drops them before the processor, by the
same watermark (the previous batch's) that v3's deduplication drops them by. The watermark a processor sees
(`getCurrentWatermarkInMs`) is the newer one Spark evicts by: filtering by it would drop records v3 counts.

The initial state it takes (`INITIAL_STATE`) is one row per key: the key columns, then one column per state
variable named like it (the runtime compares them with the state read back, spark_jobs/runtime/migration.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType, TimestampType

from spark_jobs.jobs.windowed.common import (
    STATE_HORIZON,
    WATERMARK_DELAY,
    WINDOW,
    apply_job_conf,
    parse_job_args,
    raw_events,
    sink,
)
from spark_jobs.runtime import InitialState, StreamingJob, initial_state, run

VERSION = "by_country"
KEYS = ["window_start", "country"]
EVENTS = StructType([StructField("events", LongType())])
SEEN = StructType([StructField("seq", LongType())])
INITIAL_STATE = InitialState(
    StructType(
        [
            StructField("window_start", TimestampType()),
            StructField("country", StringType()),
            StructField("events", LongType()),
            StructField("seen", ArrayType(LongType())),
        ]
    ),
    keys=KEYS,
)
OUTPUT = "window_start timestamp, country string, window_end timestamp, events long, version string"
WINDOW_MS = 60_000  # WINDOW in milliseconds: the timer's offset from the window's start


class CountryWindows(StatefulProcessor):
    """Counts each (window_start, country)'s distinct seqs; emits and forgets the key when its timer fires."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.events = handle.getValueState("events", EVENTS)
        self.seen = handle.getListState("seen", SEEN)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        seen = {row[0] for row in self.seen.get()} if self.seen.exists() else set()
        new: list[int] = []
        for row in rows:
            if row["seq"] in seen:  # a retried record already counted
                continue
            seen.add(row["seq"])
            new.append(row["seq"])
        if new:
            count = (self.events.get()[0] if self.events.exists() else 0) + len(new)
            self._keep(key, count, new)
        return iter(())

    def handleInitialState(self, key: Any, initialState: Row, timerValues: Any) -> None:
        self._keep(key, int(initialState["events"] or 0), list(initialState["seen"] or []))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Row]:
        count = self.events.get()[0] if self.events.exists() else 0
        self.events.clear()
        self.seen.clear()
        end = key[0] + timedelta(milliseconds=WINDOW_MS)
        yield Row(window_start=key[0], country=key[1], window_end=end, events=count, version=VERSION)

    def _keep(self, key: Any, count: int, new_seqs: list[int]) -> None:
        if not self.events.exists():  # the key's first rows: emit it when the watermark passes the window
            self.handle.registerTimer(int(key[0].timestamp() * 1000) + WINDOW_MS)
        self.events.update((count,))
        if new_seqs:  # Spark refuses an empty list (a file source's initial state has no seqs)
            self.seen.appendList([(seq,) for seq in new_seqs])

    def close(self) -> None:
        pass


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    stream = raw_events(spark, args).where(F.col("event_time").isNotNull()).withWatermark("event_time", WATERMARK_DELAY)
    keyed = stream.withColumn("window_start", F.window("event_time", WINDOW).start)
    initial = initial_state(spark)
    counts = keyed.groupBy(*KEYS).transformWithState(
        statefulProcessor=CountryWindows(),
        outputStructType=OUTPUT,
        outputMode="Append",
        timeMode="EventTime",
        initialState=initial.groupBy(*KEYS) if initial is not None else None,
    )
    return sink(counts, args, state_horizon=STATE_HORIZON, initial_state=INITIAL_STATE)


if __name__ == "__main__":
    run(build)
