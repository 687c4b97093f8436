"""Example job: events per user, a stateful aggregation over a file source of JSON events, with RocksDB
state (changelog checkpointing on) and an exactly-once sink: foreachBatch writes each batch to
`<output>/batch=<id>/`, overwriting, so a replayed batch id replaces itself (idempotent on batch id).

The final result is read back with `final_counts`: per user, the count from the highest batch that
mentions the user (update output mode emits the running count of every user a batch touched)."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

EVENT_SCHEMA = StructType([StructField("user", StringType()), StructField("seq", LongType())])

STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def write_events(input_dir: Path, round_no: int, count: int, users: int = 7) -> list[dict[str, object]]:
    """Deterministic events of one round, one new file per round (the file source never re-reads a file)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    events = [{"user": f"u{(round_no * count + i) % users}", "seq": round_no * count + i} for i in range(count)]
    tmp = input_dir / f".round-{round_no:05d}.json.tmp"
    tmp.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    tmp.rename(input_dir / f"round-{round_no:05d}.json")  # atomic: the source never sees half a file
    return events


def start(
    spark: SparkSession, input_dir: Path, output_dir: Path, checkpoint: str, trigger_seconds: float = 1.0
) -> StreamingQuery:
    for key, value in STATE_CONF.items():
        spark.conf.set(key, value)
    input_dir.mkdir(parents=True, exist_ok=True)
    counts = (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("user")
        .agg(F.count("*").alias("events"))
    )

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("overwrite").json(str(output_dir / f"batch={batch_id}"))

    return (
        counts.writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


def final_counts(spark: SparkSession, *outputs: tuple[Path, int, int]) -> dict[str, int]:
    """Per user, the count of the highest batch; `outputs` are (dir, first_batch, last_batch) ranges."""
    latest: dict[str, tuple[int, int]] = {}
    for directory, first, last in outputs:
        for batch_dir in sorted(directory.glob("batch=*")):
            batch_id = int(batch_dir.name.split("=")[1])
            if not first <= batch_id <= last:
                continue
            for row in spark.read.schema("user string, events long").json(str(batch_dir)).collect():
                if row.user not in latest or latest[row.user][0] < batch_id:
                    latest[row.user] = (batch_id, row.events)
    return {user: count for user, (_, count) in sorted(latest.items())}
