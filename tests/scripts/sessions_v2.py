"""Sessionization over a Kafka topic, version 2: the same sessions, records without a user (no key) dropped
first, appended by a foreachBatch that writes by batch id: Delta's idempotent writes (an application id and the
batch id as its version) skip a batch the table already took, so a batch replayed after a failure is written
once. Its version in the jobs file declares it (`foreach_batch = "idempotent"`), and exactly-once takes it.

Usage: sessions_v2.py <bootstrap-servers> <topic> <table-path>

For the test of a replay: while a file <table-path>.crash exists and is empty, the driver dies (its whole process
group, SIGKILL) right after it wrote a batch that holds sessions, before Spark records that batch done; the file
then holds the batch's id.
"""

import os
import signal
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, count, session_window

APPLICATION = "sessions_v2"  # the writer Delta knows the batch ids of

if __name__ == "__main__":
    bootstrap_servers, topic, table = sys.argv[1:4]
    crash = Path(f"{table}.crash")

    spark = SparkSession.builder.appName("StructuredSessionization").getOrCreate()

    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .where(col("key").isNotNull())
        .select(
            col("key").cast("string").alias("user"),
            col("value").cast("string").cast("timestamp").alias("event_time"),
        )
    )
    sessions = (
        events.withWatermark("event_time", "10 seconds")
        .groupBy(session_window("event_time", "10 seconds"), "user")
        .agg(count("*").alias("events"))
        .select(
            "user",
            col("session_window.start").alias("session_start"),
            col("session_window.end").alias("session_end"),
            "events",
        )
    )

    def write(batch: DataFrame, batch_id: int) -> None:
        # The batch is computed whole first, and once: a stateful query's batch must run even where Delta skips its
        # write (a replay of a batch the table took), or Spark finds its state not committed and fails the query.
        batch.persist()
        try:
            closed = batch.count()
            writer = batch.write.format("delta").mode("append")
            writer.option("txnAppId", APPLICATION).option("txnVersion", batch_id).save(table)
            if closed and crash.is_file() and not crash.read_text():
                crash.write_text(str(batch_id))
                os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            batch.unpersist()

    query = sessions.writeStream.outputMode("append").foreachBatch(write).start()
    query.awaitTermination()
