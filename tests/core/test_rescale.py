"""Rescale from a snapshot: repartition the state of a restored copy with Spark's offline repartition
(its own Spark application), never the original; HDFS-backed state and snapshots that end inside a
batch are refused before anything happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugin.core.errors import Refused
from airflow_plugin.core.jobs.rescale import (
    SINK_COMPACT_CONF,
    check_rescalable,
    current_partitions,
    log_repartition_batch,
    repartition,
)
from airflow_plugin.core.records.manifest import Kind, Manifest, SnapshotStatus, Trigger
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from tests.support.spark_kinds import KINDS, run_rounds
from tests.support.synthetic import tree

pytestmark = pytest.mark.spark


def run_and_snapshot(spark, tmp_path: Path, kind_name: str, rounds: int, in_flight: bool = False):
    """Run a query of `kind_name` for `rounds` rounds, stop it, snapshot it; `in_flight` fakes a batch
    whose offsets are logged without a commit. Returns (store, manifest)."""
    kind = KINDS[kind_name]
    ckpt = tmp_path / "ckpt"
    query = kind.start(spark, str(ckpt), str(tmp_path / "in"), str(tmp_path / "out"))
    try:
        run_rounds(query, kind, str(tmp_path / "in"), range(rounds))
    finally:
        query.stop()
    if in_flight:
        last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
        (ckpt / f"offsets/{last + 1}").write_bytes((ckpt / f"offsets/{last}").read_bytes())
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    manifest: Manifest = create_snapshot(store, open_storage(str(ckpt)), SnapshotRequest(job="counts"))
    return store, manifest


def test_counts_after_rescaling_from_3_to_6_partitions_are_exactly_those_without(spark, tmp_path: Path) -> None:
    kind = KINDS["rocksdb_changelog"]
    store, manifest = run_and_snapshot(spark, tmp_path, "rocksdb_changelog", rounds=3)
    assert current_partitions(manifest) == 3
    check_rescalable(manifest, 6)
    original = tree(tmp_path / "ckpt")

    restored = open_storage(str(tmp_path / "rescaled"))
    plan = plan_restore(store, "counts", manifest.id, restored)
    execute_restore(store, plan)
    assert repartition(restored, plan.spark_conf, 6) == manifest.batch_id + 1
    assert tree(tmp_path / "ckpt") == original  # the original checkpoint was never touched

    # the restored query continues with 6 state partitions; its output matches a run that never rescaled
    inputs, resumed_output = str(tmp_path / "in"), tmp_path / "out-rescaled"
    resumed = kind.start(spark, str(tmp_path / "rescaled"), inputs, str(resumed_output))
    try:
        run_rounds(resumed, kind, inputs, range(3, 5))
        assert resumed.lastProgress["stateOperators"][0]["numShufflePartitions"] == 6
    finally:
        resumed.stop()
    reference = kind.start(spark, str(tmp_path / "ref-ckpt"), inputs, str(tmp_path / "ref-out"))
    try:
        reference.processAllAvailable()
    finally:
        reference.stop()
    merged = tmp_path / "merged"  # batches up to the snapshot from the original run, the rest after rescaling
    merged.mkdir()
    for source in (tmp_path / "out", resumed_output):
        for batch in source.glob("batch_id=*"):
            if source == resumed_output or int(batch.name.split("=")[1]) <= manifest.batch_id:
                batch.rename(merged / batch.name)
    assert kind.final_output(spark, str(merged)) == kind.final_output(spark, str(tmp_path / "ref-out"))


def test_hdfs_state_cannot_be_rescaled(spark, tmp_path: Path) -> None:
    _, manifest = run_and_snapshot(spark, tmp_path, "hdfs", rounds=2)
    with pytest.raises(Refused, match="HDFSBackedStateStoreProvider provider, which Spark's offline repartition"):
        check_rescalable(manifest, 6)


def test_a_snapshot_that_ends_inside_a_batch_is_not_rescaled(spark, tmp_path: Path) -> None:
    _, manifest = run_and_snapshot(spark, tmp_path, "rocksdb_changelog", rounds=2, in_flight=True)
    assert manifest.pending_batch_id == manifest.batch_id + 1
    with pytest.raises(Refused, match="Spark repartitions only at a batch boundary"):
        check_rescalable(manifest, 6)


def test_the_repartition_batch_is_logged_in_a_file_sinks_log_and_its_compaction_goes_on(spark, tmp_path: Path) -> None:
    """Spark's repartition commits a batch of its own in the checkpoint, which no sink ran: a file sink's log then
    lacks that id, and at its next compaction Spark reads every id since the last (BATCH_METADATA_NOT_FOUND). Here
    the repartition batch is a compaction's (interval 4: batches 3, 7, ...), so the log needs `3.compact`."""
    kind = KINDS["file_source"]
    checkpoint, inputs, output = tmp_path / "ckpt", tmp_path / "in", tmp_path / "out"
    spark.conf.set(SINK_COMPACT_CONF, "4")
    try:
        query = kind.start(spark, str(checkpoint), str(inputs), str(output))
        try:
            run_rounds(query, kind, str(inputs), range(3))  # batches 0, 1, 2
        finally:
            query.stop()
        # what the repartition leaves: batch 3 committed in the checkpoint with batch 2's offsets (it read nothing)
        for log in ("offsets", "commits"):
            (checkpoint / log / "3").write_bytes((checkpoint / log / "2").read_bytes())
        manifest = Manifest(
            "sp-1", "counts", Kind.SAVEPOINT, Trigger.MANUAL, SnapshotStatus.COMPLETED, str(checkpoint), "2026",
            sinks=[{"kind": "file", "location": f"file:{output}"}],
        )  # fmt: skip
        logged = log_repartition_batch(manifest, 3, open_storage, {SINK_COMPACT_CONF: "4"})
        assert logged == [f"file:{output}/_spark_metadata/3.compact"]
        assert log_repartition_batch(manifest, 3, open_storage, {}) == [], "once: the sink holds batch 3 now"

        resumed = kind.start(spark, str(checkpoint), str(inputs), str(output))
        try:
            run_rounds(resumed, kind, str(inputs), range(3, 8))  # batches 4..8: the compaction at 7 reads 3.compact
            assert resumed.lastProgress["batchId"] == 8 and resumed.exception() is None
        finally:
            resumed.stop()
        assert (output / "_spark_metadata" / "7.compact").exists()
    finally:
        spark.conf.unset(SINK_COMPACT_CONF)
    reference = kind.start(spark, str(tmp_path / "ref-ckpt"), str(inputs), str(tmp_path / "ref-out"))
    try:
        reference.processAllAvailable()
    finally:
        reference.stop()
    assert kind.final_output(spark, str(output)) == kind.final_output(spark, str(tmp_path / "ref-out"))
