"""Real Structured Streaming queries of every checkpoint kind, shared by the tests.

Each `Kind` is a small, deterministic query: `feed(input_dir, round_no)` writes the JSON input files of
one round (distinct file names per round), `start(...)` starts the query with the kind's SQL confs set
on the session, and `final_output(...)` gives a canonical, sorted view of everything the query wrote
that does not depend on where batch boundaries fell. Sinks are exactly-once: the file sink (append) or
a `foreachBatch` that overwrites `<output>/batch_id=<id>/` (idempotent on the batch id).

The confs of a kind are session-wide: `apply_confs` sets them (every kind sets every key of BASE_CONFS, so the
last call wins whole) and they stay on the shared session after the test; the same call must be made before a
restart from a copy, and a test that needs Spark's defaults calls `unset_confs` first.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

# Python workers do not have tests/ on their path: ship this module's classes (RunningCount) by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
FORMAT_VERSION = "spark.sql.streaming.stateStore.checkpointFormatVersion"

# Small intervals so that snapshots, zips and cleanup happen within a few batches of a test. (Maintenance runs
# every 100 ms: the session's own conf, tests/conftest.py, since Spark starts it once, with the first query's.)
BASE_CONFS: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass": HDFS_PROVIDER,
    CHANGELOG: "false",
    FORMAT_VERSION: "1",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.sql.streaming.minBatchesToRetain": "2",
}

EVENT_SCHEMA = StructType(
    [
        StructField("event_id", StringType()),
        StructField("user", StringType()),
        StructField("n", LongType()),
    ]
)
JOIN_SCHEMA = StructType([StructField("k", StringType()), StructField("v", LongType())])

ROWS_PER_ROUND = 12
USERS = 9  # spread over all 3 shuffle partitions


def _event(round_no: int, i: int) -> dict[str, Any]:
    return {"event_id": f"e{round_no}-{i}", "user": f"u{(round_no * 5 + i) % USERS}", "n": round_no * 100 + i}


def events(round_no: int) -> list[dict[str, Any]]:
    """The events of one round. Every round also repeats the first two events of the previous one, so
    that dropDuplicates has something to drop across batches."""
    repeated = [_event(round_no - 1, i) for i in range(2)] if round_no > 0 else []
    return [_event(round_no, i) for i in range(ROWS_PER_ROUND)] + repeated


def _write_json_lines(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write atomically (temp name hidden from the file source, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    os.replace(tmp, path)


def feed_events(input_dir: str, round_no: int) -> None:
    _write_json_lines(Path(input_dir) / f"round-{round_no:04d}.json", events(round_no))


def feed_join(input_dir: str, round_no: int) -> None:
    """Left and right sides of the join; a key of round r meets rows from rounds r-1, r and r+1."""
    left = [{"k": f"k{(round_no + i) % 7}", "v": round_no * 10 + i} for i in range(4)]
    right = [{"k": f"k{(round_no * 3 + i) % 7}", "v": -(round_no * 10 + i)} for i in range(4)]
    _write_json_lines(Path(input_dir) / "left" / f"round-{round_no:04d}.json", left)
    _write_json_lines(Path(input_dir) / "right" / f"round-{round_no:04d}.json", right)


# ---------------------------------------------------------------- sinks and canonical outputs


def _foreach_batch_sink(output_dir: str) -> Callable[[DataFrame, int], None]:
    def write(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").json(f"{output_dir}/batch_id={batch_id}")

    return write


def _read_batches(spark: SparkSession, output_dir: str) -> list[tuple[int, dict[str, Any]]]:
    """(batch_id, row) for every row a foreachBatch sink wrote, ordered by batch id."""
    out = Path(output_dir)
    rows: list[tuple[int, dict[str, Any]]] = []
    batch_dirs = sorted(out.glob("batch_id=*"), key=lambda p: int(p.name.split("=", 1)[1]))
    for batch_dir in batch_dirs:
        batch_id = int(batch_dir.name.split("=", 1)[1])
        for part in sorted(batch_dir.glob("part-*")):
            rows += [(batch_id, json.loads(line)) for line in part.read_text().splitlines() if line]
    return rows


def last_value_per_key(key: str) -> Callable[[SparkSession, str], list[tuple[Any, ...]]]:
    """Canonical view of an update-mode output: the last row per key, by batch order."""

    def final(spark: SparkSession, output_dir: str) -> list[tuple[Any, ...]]:
        last: dict[Any, dict[str, Any]] = {}
        for _, row in _read_batches(spark, output_dir):
            last[row[key]] = row
        return sorted(tuple(sorted(r.items())) for r in last.values())

    return final


def all_rows_foreach_batch(spark: SparkSession, output_dir: str) -> list[tuple[Any, ...]]:
    """Canonical view of an append-mode foreachBatch output: the sorted multiset of rows."""
    return sorted(tuple(sorted(r.items())) for _, r in _read_batches(spark, output_dir))


def all_rows_file_sink(spark: SparkSession, output_dir: str) -> list[tuple[Any, ...]]:
    """Canonical view of a file sink output, read through its `_spark_metadata` log."""
    if not (Path(output_dir) / "_spark_metadata").is_dir():
        return []
    rows = spark.read.json(output_dir).collect()
    return sorted(tuple(sorted(r.asDict().items())) for r in rows)


# ---------------------------------------------------------------- the queries


def _events(spark: SparkSession, input_dir: str) -> DataFrame:
    return spark.readStream.schema(EVENT_SCHEMA).json(input_dir)


def _aggregate(spark: SparkSession, input_dir: str) -> DataFrame:
    return _events(spark, input_dir).groupBy("user").agg(F.count("*").alias("cnt"), F.sum("n").alias("total"))


def _dedup_then_aggregate(spark: SparkSession, input_dir: str) -> DataFrame:
    deduped = _events(spark, input_dir).dropDuplicates(["event_id"])
    return deduped.groupBy("user").agg(F.count("*").alias("cnt"), F.sum("n").alias("total"))


def _join(spark: SparkSession, input_dir: str) -> DataFrame:
    left = spark.readStream.schema(JOIN_SCHEMA).json(f"{input_dir}/left").withColumnRenamed("v", "lv")
    right = spark.readStream.schema(JOIN_SCHEMA).json(f"{input_dir}/right").withColumnRenamed("v", "rv")
    return left.join(right, "k")


def _projection(spark: SparkSession, input_dir: str) -> DataFrame:
    return _events(spark, input_dir).where(F.col("n") % 3 != 0).select("event_id", "user", "n")


class RunningCount(StatefulProcessor):
    """transformWithState: a running count and total per user in two value states."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", StructType([StructField("c", LongType())]))
        self.total = handle.getValueState("total", StructType([StructField("t", LongType())]))

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        count = self.count.get()[0] if self.count.exists() else 0
        total = self.total.get()[0] if self.total.exists() else 0
        for row in rows:
            count += 1
            total += row["n"]
        self.count.update((count,))
        self.total.update((total,))
        yield Row(user=key[0], cnt=count, total=total)

    def close(self) -> None:
        pass


def _transform_with_state(spark: SparkSession, input_dir: str) -> DataFrame:
    return (
        _events(spark, input_dir)
        .groupBy("user")
        .transformWithState(
            statefulProcessor=RunningCount(),
            outputStructType="user string, cnt long, total long",
            outputMode="Update",
            timeMode="None",
        )
    )


@dataclass(frozen=True)
class Kind:
    name: str
    build: Callable[[SparkSession, str], DataFrame]
    output_mode: str
    sink: str  # "foreach_batch" or "file"
    final_output: Callable[[SparkSession, str], list[tuple[Any, ...]]]
    feed: Callable[[str, int], None] = feed_events
    confs: Mapping[str, str] = field(default_factory=dict)
    stateful: bool = True
    input_subdirs: tuple[str, ...] = ("",)

    def all_confs(self) -> dict[str, str]:
        return {**BASE_CONFS, **self.confs}

    def start(
        self,
        spark: SparkSession,
        checkpoint: str,
        input_dir: str,
        output_dir: str,
        trigger: Mapping[str, Any] | None = None,
    ) -> StreamingQuery:
        apply_confs(spark, self)
        for sub in self.input_subdirs:
            (Path(input_dir) / sub).mkdir(parents=True, exist_ok=True)
        writer = (
            self.build(spark, input_dir)
            .writeStream.queryName(f"kind_{self.name}")
            .outputMode(self.output_mode)
            .option("checkpointLocation", checkpoint)
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if self.sink == "file":
            return writer.format("json").start(output_dir)
        return writer.foreachBatch(_foreach_batch_sink(output_dir)).start()


def apply_confs(spark: SparkSession, kind: Kind) -> None:
    for key, value in kind.all_confs().items():
        spark.conf.set(key, value)


def unset_confs(spark: SparkSession) -> None:
    """Spark's defaults again for every key a kind sets (each kind's keys are BASE_CONFS')."""
    for key in BASE_CONFS:
        spark.conf.unset(key)


ROCKSDB = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER}
FORMAT_V2 = {**ROCKSDB, CHANGELOG: "true", FORMAT_VERSION: "2"}
_last_per_user = last_value_per_key("user")

KINDS: dict[str, Kind] = {
    k.name: k
    for k in [
        Kind("hdfs", _aggregate, "update", "foreach_batch", _last_per_user),
        Kind("rocksdb", _aggregate, "update", "foreach_batch", _last_per_user, confs=ROCKSDB),
        Kind(
            "rocksdb_changelog",
            _aggregate,
            "update",
            "foreach_batch",
            _last_per_user,
            confs={**ROCKSDB, CHANGELOG: "true"},
        ),
        Kind(
            "format_v2",
            _aggregate,
            "update",
            "foreach_batch",
            _last_per_user,
            confs=FORMAT_V2,
        ),
        Kind("join", _join, "append", "file", all_rows_file_sink, feed=feed_join, input_subdirs=("left", "right")),
        Kind(
            "join_v2",  # format v2 with named stores: commits/N holds one unique id per store
            _join,
            "append",
            "file",
            all_rows_file_sink,
            feed=feed_join,
            input_subdirs=("left", "right"),
            confs=FORMAT_V2,
        ),
        Kind("multi_op", _dedup_then_aggregate, "update", "foreach_batch", _last_per_user),
        Kind(
            "transform_with_state",
            _transform_with_state,
            "update",
            "foreach_batch",
            _last_per_user,
            confs={**ROCKSDB, CHANGELOG: "true"},
        ),
        Kind("file_source", _projection, "append", "file", all_rows_file_sink, stateful=False),
        Kind("stateless", _projection, "append", "foreach_batch", all_rows_foreach_batch, stateful=False),
    ]
}


# ---------------------------------------------------------------- running and inspecting


def run_rounds(query: StreamingQuery, kind: Kind, input_dir: str, rounds: Iterable[int]) -> None:
    """Feed each round and wait until the query has processed it (raises if the query failed)."""
    for round_no in rounds:
        kind.feed(input_dir, round_no)
        query.processAllAvailable()


def run_and_stop(
    spark: SparkSession, kind: Kind, checkpoint: str, input_dir: str, output_dir: str, rounds: Iterable[int]
) -> None:
    """Start the query, run the rounds and stop it at a batch boundary."""
    query = kind.start(spark, checkpoint, input_dir, output_dir)
    try:
        run_rounds(query, kind, input_dir, rounds)
        query.processAllAvailable()
    finally:
        query.stop()


def run_until(
    query: StreamingQuery,
    kind: Kind,
    input_dir: str,
    first_round: int,
    condition: Callable[[], bool],
    max_rounds: int = 20,
    settle: float = 1.0,
) -> int:
    """Feed rounds from `first_round` until `condition()` holds. State maintenance is asynchronous and
    some of it (RocksDB cleanup) only follows new commits, so each round gets `settle` seconds to
    satisfy it before the next is fed. Returns the next unfed round number."""
    for round_no in range(first_round, first_round + max_rounds):
        run_rounds(query, kind, input_dir, [round_no])
        if poll(condition, settle):
            return round_no + 1
    raise AssertionError(f"{kind.name}: condition not met after {max_rounds} rounds")


def poll(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether `condition()` holds within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def remove_stopped_checkpoint(checkpoint: str | Path, timeout: float = 30.0) -> None:
    """Delete the checkpoint of a query that stopped. The session's state store maintenance (every 100 ms, see
    tests/conftest.py) may still be writing a snapshot of one of its stores: a task begun before the stop ends
    after it, and a file it renames in makes the directory not empty again. Delete until it stays deleted."""

    def removed() -> bool:
        try:
            shutil.rmtree(checkpoint)
        except FileNotFoundError:  # a temporary file renamed away between the listing and its deletion
            return False
        except OSError as error:
            if error.errno != errno.ENOTEMPTY:
                raise
            return False
        return True

    if not poll(removed, timeout):
        raise AssertionError(f"{checkpoint}: still written to {timeout:g} s after its query stopped")


def batch_ids(log_dir: Path) -> list[int]:
    """Batch ids of a metadata log dir (`offsets/`, `commits/`): only plain-integer names count."""
    return sorted(int(p.name) for p in log_dir.iterdir() if p.name.isdigit()) if log_dir.is_dir() else []


def last_commit(checkpoint: str) -> int:
    ids = batch_ids(Path(checkpoint) / "commits")
    if not ids:
        raise AssertionError(f"no committed batch in {checkpoint}")
    return ids[-1]


def read_state(spark: SparkSession, checkpoint: str, batch_id: int) -> dict[tuple[int, str], list[str]]:
    """Per (operator id, store name): the sorted rows (JSON, with partition_id) of the state after
    `batch_id`, read with the `statestore` source; operators and stores come from `state-metadata`.
    transformWithState gets one entry per state variable, named `<store>/<stateVarName>`."""
    result: dict[tuple[int, str], list[str]] = {}
    meta = spark.read.format("state-metadata").load(checkpoint).collect()
    for op in meta:
        reader = (
            spark.read.format("statestore")
            .option("batchId", batch_id)
            .option("operatorId", op.operatorId)
            .option("storeName", op.stateStoreName)
        )
        names: list[str | None] = [None]
        if op.operatorName.startswith("transformWithState"):
            props = json.loads(op.operatorProperties or "{}")
            names = [v["stateName"] for v in props.get("stateVariables", [])]
        for state_var in names:
            df = reader.option("stateVarName", state_var).load(checkpoint) if state_var else reader.load(checkpoint)
            rows = sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in df.collect())
            result[(op.operatorId, f"{op.stateStoreName}/{state_var}" if state_var else op.stateStoreName)] = rows
    return result
