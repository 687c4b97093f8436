"""Feed a RocksDB (changelog checkpointing) stateful query one input file per batch, in its own process.

    python -m bench.spark_feed --checkpoint DIR --input DIR --first 0 --count 117 [--partitions 8] [--query agg]

writes input files `first .. first+count-1` into the input directory and runs the query with an
available-now trigger and `maxFilesPerTrigger=1`, so that every file becomes exactly one batch. Queries, into
the `noop` sink: `agg`, a `groupBy(key).count()` (one stateful operator); `dedup-agg`, `dropDuplicates(id)`
then `groupBy(key).count()` (two). Keys are drawn from a large space so that the state keeps growing and
RocksDB writes SSTs, zips and changelogs the way a real job does.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SHUFFLE_PARTITIONS = 8
RETAINED_BATCHES = 100
ROWS_PER_BATCH = 10_000
KEY_SPACE = 1_000_000

QUERIES = ("agg", "dedup-agg")

SPARK_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.minBatchesToRetain": str(RETAINED_BATCHES),
    # maintenance (zips of changelogs, cleanup of old files) every second instead of every minute
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
}


def spark_conf(partitions: int = SHUFFLE_PARTITIONS) -> dict[str, str]:
    return {**SPARK_CONF, "spark.sql.shuffle.partitions": str(partitions)}


def input_name(batch: int) -> str:
    return f"batch-{batch:05d}.csv"


def write_inputs(input_dir: Path, first: int, count: int) -> None:
    """One CSV file per batch, deterministic per batch number, written atomically (hidden temp + rename).
    Input files numbered `first` or higher left by an earlier run are removed first: the query must see
    exactly `count` new files."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for old in input_dir.glob("batch-*.csv"):
        if int(old.stem.removeprefix("batch-")) >= first:
            old.unlink()
    for batch in range(first, first + count):
        rng = random.Random(batch)
        rows = "".join(
            f"k{rng.randrange(KEY_SPACE):07d},{batch},{rng.randrange(4 * KEY_SPACE)}\n" for _ in range(ROWS_PER_BATCH)
        )
        path = input_dir / input_name(batch)
        tmp = input_dir / f".{path.name}.tmp"
        tmp.write_text(rows)
        os.replace(tmp, path)


def run_query(checkpoint: Path, input_dir: Path, partitions: int = SHUFFLE_PARTITIONS, kind: str = "agg") -> int:
    """Process every unseen input file, one batch each; returns the id of the last batch (-1: none ran)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("bench-spark-feed")
    for key, value in spark_conf(partitions).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        schema = "key STRING, batch LONG, id LONG"
        events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).csv(str(input_dir))
        if kind == "dedup-agg":
            events = events.dropDuplicates(["id"])
        query = (
            events.groupBy("key")
            .count()
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        last = query.lastProgress
        # let state maintenance catch up once more (zips, cleanup) as it would in a long-running job
        time.sleep(3)
        return -1 if last is None else int(last["batchId"])
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=SHUFFLE_PARTITIONS)
    parser.add_argument("--query", choices=QUERIES, default="agg")
    args = parser.parse_args()
    write_inputs(args.input, args.first, args.count)
    started = time.monotonic()
    last = run_query(args.checkpoint, args.input, args.partitions, args.query)
    print(f"spark_feed: {args.count} files, last batch {last}, {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
