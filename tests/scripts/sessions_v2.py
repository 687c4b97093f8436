"""Sessionization over a Kafka topic, version 2: the same sessions, records without a user (no key) dropped
first.

Usage: sessions_v2.py <bootstrap-servers> <topic> <table-path>
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, count, session_window

if __name__ == "__main__":
    bootstrap_servers, topic, table = sys.argv[1:4]

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

    query = sessions.writeStream.outputMode("append").format("delta").option("path", table).start()
    query.awaitTermination()
