"""Rescale from a snapshot: repartition the state of a restored copy with Spark's offline repartition
(its own Spark application), never the original; HDFS-backed state is refused before anything happens."""

from __future__ import annotations

from pathlib import Path

import pytest
from spark_kinds import KINDS, run_rounds
from synthetic import tree

from airflow_plugin.core.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.errors import Refused
from airflow_plugin.core.rescale import check_rescalable, current_partitions, repartition
from airflow_plugin.core.restore import execute_restore, plan_restore
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.store import SnapshotStore

pytestmark = pytest.mark.spark


def test_counts_after_rescaling_from_3_to_6_partitions_are_exactly_those_without(spark, tmp_path: Path) -> None:
    kind = KINDS["rocksdb_changelog"]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs = str(tmp_path / "ckpt"), str(tmp_path / "in")
    query = kind.start(spark, ckpt, inputs, str(tmp_path / "out"))
    try:
        run_rounds(query, kind, inputs, range(3))
    finally:
        query.stop()
    manifest = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="counts"))
    assert current_partitions(manifest) == 3
    check_rescalable(manifest, 6)
    original = tree(Path(ckpt))

    restored = open_storage(str(tmp_path / "rescaled"))
    plan = plan_restore(store, "counts", manifest.id, restored)
    execute_restore(store, plan)
    assert repartition(restored, plan.spark_conf, 6) == manifest.batch_id + 1
    assert tree(Path(ckpt)) == original  # the original checkpoint was never touched

    # the restored query continues with 6 state partitions; its output matches a run that never rescaled
    resumed_output = tmp_path / "out-rescaled"
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
    merged = tmp_path / "merged"
    for source in (tmp_path / "out", resumed_output):
        for batch in source.glob("batch_id=*"):
            if source == resumed_output or int(batch.name.split("=")[1]) <= manifest.batch_id:
                batch.rename(merged / batch.name) if merged.exists() else (
                    merged.mkdir(),
                    batch.rename(merged / batch.name),
                )
    assert kind.final_output(spark, str(merged)) == kind.final_output(spark, str(tmp_path / "ref-out"))


def test_hdfs_state_cannot_be_rescaled(spark, tmp_path: Path) -> None:
    kind = KINDS["hdfs"]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs = str(tmp_path / "ckpt"), str(tmp_path / "in")
    query = kind.start(spark, ckpt, inputs, str(tmp_path / "out"))
    try:
        run_rounds(query, kind, inputs, range(2))
    finally:
        query.stop()
    manifest = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="counts"))
    with pytest.raises(Refused, match="HDFSBackedStateStoreProvider provider, which Spark's offline repartition"):
        check_rescalable(manifest, 6)


def test_a_snapshot_that_ends_inside_a_batch_is_not_rescaled(spark, tmp_path: Path) -> None:
    kind = KINDS["rocksdb_changelog"]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs = tmp_path / "ckpt", str(tmp_path / "in")
    query = kind.start(spark, str(ckpt), inputs, str(tmp_path / "out"))
    try:
        run_rounds(query, kind, inputs, range(2))
    finally:
        query.stop()
    last = max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / f"offsets/{last + 1}").write_bytes((ckpt / f"offsets/{last}").read_bytes())  # a batch in flight
    manifest = create_snapshot(store, open_storage(str(ckpt)), SnapshotRequest(job="counts"))
    assert manifest.pending_batch_id == last + 1
    with pytest.raises(Refused, match="Spark repartitions only at a batch boundary"):
        check_rescalable(manifest, 6)
