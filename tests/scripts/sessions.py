"""Sessionization over a Kafka topic, in the shape of Spark's structured_sessionization.py example: events
of a user (the record key) within 10 seconds of each other form a session; each closed session is appended
to a Delta table with its start, end and number of events.

Usage: sessions.py <bootstrap-servers> <topic> <table-path>
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
