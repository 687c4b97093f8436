"""A test application under the runtime: each Kafka record as read (partition, offset, event time) into a JSON
file sink, with a watermark on the event time (so that Spark reports the batches' event times)."""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.jobs.windowed.common import EVENT_SCHEMA, WATERMARK_DELAY
from spark_jobs.runtime import SinkKind, SourceKind, StreamingJob, run


def build(spark: SparkSession, job_args: list[str]) -> StreamingJob:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--kafka-bootstrap-servers", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(job_args)
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.kafka_bootstrap_servers)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")  # what a fresh start would read: the seed must override it
        .option("failOnDataLoss", "true")
        .load()
    )
    event = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
    rows = records.select("partition", "offset", event.event_time.alias("event_time"))
    writer = rows.withWatermark("event_time", WATERMARK_DELAY).writeStream.format("json").option("path", args.output)
    return StreamingJob(writer.outputMode("append"), SinkKind.FILE, SourceKind.KAFKA)


if __name__ == "__main__":
    run(build)
