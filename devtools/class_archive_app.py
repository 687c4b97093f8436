"""The Spark application whose classes devtools/class_archive.py archives: what the tests' drivers do in their first
seconds (a session with Delta, a batch query, a windowed streaming aggregation on RocksDB with its changelog, a
Delta and a file sink, the state reader), on a few rows. Run by spark-submit, never imported:

    spark-submit ... devtools/class_archive_app.py WORK_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(work: Path) -> None:
    spark = SparkSession.builder.appName("class-archive").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")

    numbers = spark.range(200).withColumn("key", F.col("id") % 7)
    joined = numbers.groupBy("key").count().join(numbers.select("key", "id"), "key")
    joined.write.mode("overwrite").parquet(str(work / "parquet"))
    spark.read.parquet(str(work / "parquet")).agg(F.sum("count")).collect()

    source = work / "input"
    source.mkdir(parents=True, exist_ok=True)
    events = [{"key": f"k{i % 3}", "ts": f"2026-01-01T00:00:{i:02d}Z"} for i in range(30)]
    (source / "events.json").write_text("\n".join(json.dumps(e) for e in events))
    stream = (
        spark.readStream.schema("key string, ts timestamp")
        .json(str(source))
        .withWatermark("ts", "5 seconds")
        .groupBy(F.window("ts", "10 seconds"), "key")
        .count()
    )
    for sink in ("delta", "json"):
        checkpoint = work / f"checkpoint-{sink}"
        query = (
            stream.writeStream.format(sink)
            .outputMode("append")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(str(work / f"out-{sink}"))
        )
        query.awaitTermination()
        spark.read.format("statestore").load(str(checkpoint)).count()
    spark.read.format("delta").load(str(work / "out-delta")).count()
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
