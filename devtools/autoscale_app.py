"""The autoscaler's test and benchmark job: the windowed job's query over a Kafka topic (spark_jobs/jobs/windowed/
common.py: events per user and one-minute window, appended exactly once to the file sink; no deduplication: its
feeder sends each event once, and one stateful operator keeps a batch's own cost small) with a per-row sleep in its
first stage, before the shuffle. The sleep holds a task slot without using a CPU, so the job's capacity is its task
slots (the topic's partitions read in parallel) even on a busy 2-core machine: local[1] reads the partitions one
after another, local[4] four at a time.

Arguments: the windowed job's (`--topic`, `--output`, `--max-offsets-per-trigger`, ...) and `--row-ms MS` (the
sleep per row, JVM-side: `reflect` of Thread.sleep, no Python worker)."""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.jobs.windowed.common import (
    EVENT_SCHEMA,
    WATERMARK_DELAY,
    KafkaInput,
    apply_job_conf,
    output_columns,
    parse_job_args,
    sink,
    window_counts,
)
from spark_jobs.runtime import StreamingJob, run

KEYS = ["user"]
FETCH_WAIT_MS = 20
STATE_HORIZON = "2 minutes"


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    parser = argparse.ArgumentParser(prog="autoscale job", allow_abbrev=False)
    parser.add_argument("--row-ms", type=int, default=10, help="the sleep per row read, in milliseconds")
    own, rest = parser.parse_known_args(job_args)
    args = parse_job_args(rest)
    assert args.kafka is not None, "the autoscale job reads a topic (--topic)"
    apply_job_conf(spark)
    slept = F.expr(f"reflect('java.lang.Thread', 'sleep', cast({own.row_ms} as bigint))")
    read = events(spark, args.kafka).where(slept.isNotNull())  # per row, in the reading stage: a slot a row
    counts = output_columns(window_counts(read.withWatermark("event_time", WATERMARK_DELAY), KEYS), KEYS, "v1")
    return sink(counts, args, state_horizon=STATE_HORIZON)


def events(spark: SparkSession, kafka: KafkaInput) -> DataFrame:
    """The windowed job's Kafka reader (common.py raw_events), its consumers' fetches held at most FETCH_WAIT_MS:
    a task's cached consumer has a fetch in flight at the partition's end from the batch before, which the broker
    holds until data comes or fetch.max.wait.ms (500 ms) passes, and the task's own fetch waits behind it. With a
    few records a partition a batch, that wait, not the rows, was most of a batch (12 tasks: 6 s at one core)."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", kafka.topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        .option("kafka.fetch.max.wait.ms", str(FETCH_WAIT_MS))
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", kafka.max_offsets_per_trigger)
    value = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event")
    return reader.load().select(value).select("event.*")


if __name__ == "__main__":
    run(build)
