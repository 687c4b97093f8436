"""`savepoints inspect` and `savepoints diff`: Spark's state data source reads a snapshot's state in an
application of its own, from a scratch restore, on a RocksDB checkpoint, an HDFS-backed one of windowed counts
(the oldest event-time window) and a stream-stream join (named stores). Rows, partitions, keys and changes are
checked against the state read here, in the test's own session, from the original checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.inspect import diff_snapshots, inspect_snapshot
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from tests.support.spark_kinds import EVENT_SCHEMA, KINDS, Kind, last_value_per_key, read_state, run_rounds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def _windowed(spark: SparkSession, input_dir: str) -> DataFrame:
    """Counts per user and 10-minute window of event time (event n at minute n), nothing evicted yet."""
    from pyspark.sql import functions as F

    events = spark.readStream.schema(EVENT_SCHEMA).json(input_dir)
    timed = events.withColumn("ts", F.timestamp_seconds(F.col("n") * 60)).withWatermark("ts", "1 day")
    return timed.groupBy(F.window("ts", "10 minutes"), "user").agg(F.count("*").alias("cnt"), F.sum("n").alias("total"))


# the HDFS-backed provider (no confs), its keys a window and a user
WINDOWED = Kind("windowed", _windowed, "update", "foreach_batch", last_value_per_key("user"))


@pytest.mark.parametrize("kind_name", ["rocksdb", "windowed", "join"])
def test_inspect_reads_every_store_and_diff_tells_what_changed(
    spark, tmp_path: Path, kind_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kind = WINDOWED if kind_name == "windowed" else KINDS[kind_name]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs, output = (str(tmp_path / d) for d in ("ckpt", "in", "out"))
    query = kind.start(spark, ckpt, inputs, output)
    try:
        run_rounds(query, kind, inputs, range(2))
        a = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="j"))
        truth_a = read_state(spark, ckpt, a.batch_id)
        run_rounds(query, kind, inputs, [2])
        b = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="j"))
        truth_b = read_state(spark, ckpt, b.batch_id)
    finally:
        query.stop()

    key = "u1" if kind_name != "join" else "k1"
    report = inspect_snapshot(store, "j", b.id, key=key, sample=3)
    assert report["problems"] == []
    found = {(op["operator"], op["store"]): op for op in report["operators"]}
    assert set(truth_b) == set(found)
    for (operator, name), rows in truth_b.items():
        op = found[(operator, name)]
        by_partition: dict[str, int] = {}
        for row in rows:
            partition = str(json.loads(row)["partition_id"])
            by_partition[partition] = by_partition.get(partition, 0) + 1
        assert op["rows"] == len(rows) > 0 and op["rows_per_partition"] == by_partition
        assert op["skew"]["largest"][0][1] == max(by_partition.values())
        assert len(op["sample"]) == min(3, len(rows))
        partition_files = [f for f in b.files if f.path.split("/")[:2] == ["state", str(operator)]]
        assert op["operator_bytes"] == sum(  # the partitions' files: not the operator's or a store's metadata
            f.size for f in partition_files if f.path.split("/")[2].isdigit() and "_metadata" not in f.path
        )
        wanted = [r for r in rows if key in json.dumps(json.loads(r)["key"])]
        assert len(op["matches"]) == len(wanted)
        if kind_name == "windowed":  # the oldest window of event time the state holds, and a key of it
            starts = [json.loads(r)["key"]["window"]["start"] for r in rows]
            assert op["oldest_window_start"] == min(starts) and len(set(starts)) > 1, (op, starts)
            assert json.loads(op["oldest_key"])["user"] in {
                json.loads(r)["key"]["user"] for r in rows if json.loads(r)["key"]["window"]["start"] == min(starts)
            }
        else:
            assert "oldest_window_start" not in op, "a key without a window has no oldest window"
    if kind_name == "join":
        return  # the rest is the same code for every kind

    diff = diff_snapshots(store, "j", a.id, b.id, top=3)
    [op] = diff["operators"]
    before = {json.dumps(json.loads(r)["key"]): json.loads(r)["value"] for r in truth_a[(0, "default")]}
    after = {json.dumps(json.loads(r)["key"]): json.loads(r)["value"] for r in truth_b[(0, "default")]}
    changed = [k for k in before.keys() & after.keys() if before[k] != after[k]]
    assert (op["added"], op["removed"], op["changed"]) == (
        len(after.keys() - before.keys()),
        len(before.keys() - after.keys()),
        len(changed),
    )
    assert changed and op["growth_by"] == "numeric value fields"
    growth = sorted((sum(after[k].values()) - sum(before.get(k, {}).values()) for k in after), reverse=True)
    assert [g["growth"] for g in op["grew_most"]] == [float(g) for g in growth[:3] if g > 0]

    # the command line prints the same, and exits 0
    assert main(["diff", "j", a.id, b.id, "--store", str(tmp_path / "store"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["operators"][0]["changed"] == len(changed)
