"""What the versions of the user_totals job share: the windowed job's events, input arguments, confs and
exactly-once file sink, with a transformWithState operator instead of a windowed aggregation.

State: per key one value state `totals` (events seen, highest seq), kept by RocksDB (transformWithState
requires it). Each batch emits the key's new totals in append mode. Its stored state schema has Spark's
format v3 (`state/<op>/_stateSchema/`), which the upgrade pre-flight compares by field name too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.jobs.windowed.common import apply_job_conf, parse_job_args, raw_events, sink
from spark_jobs.runtime import StreamingJob

TOTALS = StructType([StructField("events", LongType()), StructField("last_seq", LongType())])


class RunningTotals(StatefulProcessor):
    """Events and the highest seq per key, updated by every batch that has rows for the key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.totals = handle.getValueState("totals", TOTALS)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        events, last_seq = self.totals.get() if self.totals.exists() else (0, -1)
        for row in rows:
            events += 1
            last_seq = max(last_seq, row["seq"])
        self.totals.update((events, last_seq))
        yield Row(key=key[0], events=events, last_seq=last_seq)

    def close(self) -> None:
        pass


def totals_job(spark: SparkSession, job_args: list[str], key: str, version: str) -> StreamingJob:
    """One version: running totals per `key` (a column of the events), tagged with the version."""
    args = parse_job_args(job_args)
    apply_job_conf(spark)
    totals = (
        raw_events(spark, args)
        .groupBy(key)
        .transformWithState(
            statefulProcessor=RunningTotals(),
            outputStructType="key string, events long, last_seq long",
            outputMode="Append",
            timeMode="None",
        )
    )
    return sink(totals.withColumn("version", F.lit(version)), args)
