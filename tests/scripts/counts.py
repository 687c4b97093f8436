"""Events per user and minute, as someone writes it who never heard of spark-savepoints: JSON event files in a
directory, a one-minute event-time window with a one-minute watermark, appended as JSON lines (Spark's file sink,
exactly-once), RocksDB state. `--by user,country` groups by country too (a new state key); `--tag` names the
version in each row. tests/test_docs.py runs the README's steps with it as the example job's code.

Usage: counts.py --input DIR --output DIR [--by user[,country]] [--tag NAME]
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

EVENTS = StructType(
    [
        StructField("user", StringType()),
        StructField("country", StringType()),
        StructField("event_time", TimestampType()),
        StructField("seq", LongType()),
    ]
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="events per user and minute")
    parser.add_argument("--input", required=True, help="a directory of JSON event files")
    parser.add_argument("--output", required=True, help="where the counts go (JSON lines)")
    parser.add_argument("--by", default="user", help="the grouping keys, comma-separated")
    parser.add_argument("--tag", default="v1", help="the version named in each row")
    args = parser.parse_args()
    keys = args.by.split(",")

    spark = SparkSession.builder.appName("counts").getOrCreate()
    provider = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set("spark.sql.session.timeZone", "UTC")

    events = spark.readStream.schema(EVENTS).option("maxFilesPerTrigger", 1).json(args.input)
    counts = (
        events.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), *keys)
        .agg(F.count(F.lit(1)).alias("events"))
        .select(
            *keys,
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "events",
            F.lit(args.tag).alias("version"),
        )
    )
    query = counts.writeStream.format("json").outputMode("append").option("path", args.output).start()
    query.awaitTermination()
