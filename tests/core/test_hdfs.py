"""hdfs:// behind the engine's Storage (storage/hdfs.py) on the mini HDFS, over WebHDFS: the storage contract the
snapshot engine relies on, the refusal of an hdfs:// store, and a stateful query whose checkpoint is on HDFS:
live savepoints while it commits batches, a restore into HDFS that Spark restarts from, a deep verify and a
rescale of a restored copy (both Spark tools reading hdfs:// themselves; tests/core/test_rescale.py shows that a
rescaled query's results are those of one never rescaled)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_plugin.core.errors import Conflict, InvalidInput, Refused
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.rescale import repartition
from airflow_plugin.core.snapshots.checkpoint import read_restart_point
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import HdfsStorage, Storage, open_storage, spark_uri
from devtools.hadoop import MiniHadoop
from tests.support.hadoop_fixtures import hdfs_root
from tests.support.spark_kinds import KINDS, run_rounds


def test_the_storage_contract_on_hdfs(tmp_path: Path, hadoop_client: MiniHadoop) -> None:
    root = hdfs_root(hadoop_client, tmp_path)
    storage = open_storage(root)
    assert isinstance(storage, HdfsStorage) and spark_uri(storage) == root
    assert not storage.exists() and list(storage.list()) == []

    storage.write("commits/0", b"v1\n{}")
    storage.write("commits/0", b'v1\n{"x":1}')  # replaced: the new content, nothing beside it
    assert storage.read("commits/0") == b'v1\n{"x":1}' and storage.read_range("commits/0", 3, 3) == b'{"x'
    assert [info.key for info in storage.list()] == ["commits/0"], "no temporary file left behind"
    storage.create("lease", b"mine")
    with pytest.raises(Conflict):
        storage.create("lease", b"theirs")
    assert storage.read("lease") == b"mine"
    assert [info.key for info in storage.list("", start_after="commits/0")] == ["lease"]
    with pytest.raises(Refused, match="compare-and-swap"):
        storage.replace("lease", b"x", storage.read_with_token("lease")[1])

    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 20_000)
    storage.upload(big, "state/0/0/1.zip")
    storage.download("state/0/0/1.zip", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == big.read_bytes()
    stat = storage.stat("state/0/0/1.zip")
    assert stat is not None and stat.size == big.stat().st_size and storage.stat("state") is None
    assert [i.key for i in storage.list("state/")] == ["state/0/0/1.zip"]
    assert storage.child("state/0").stat("0/1.zip") is not None
    assert storage.children("") == ["commits", "state"] and storage.children("state/") == ["0"]
    assert storage.children("missing/") == []
    storage.delete(["lease", "state/0/0/1.zip", "missing"])
    assert [info.key for info in storage.list()] == ["commits/0"]


def test_an_hdfs_store_is_refused_with_the_reason(tmp_path: Path, hadoop_client: MiniHadoop) -> None:
    with pytest.raises(InvalidInput, match="compare-and-swap"):
        Settings(store=f"{hadoop_client.hdfs_uri}/store").resolve().store_uri()


@pytest.mark.spark
def test_live_savepoints_restore_verify_and_rescale_of_a_checkpoint_on_hdfs(
    spark, tmp_path: Path, hadoop_client: MiniHadoop
) -> None:
    kind = KINDS["rocksdb_changelog"]
    root = hdfs_root(hadoop_client, tmp_path)
    checkpoint, inputs = f"{root}/checkpoint", str(tmp_path / "in")
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    query = kind.start(spark, checkpoint, inputs, str(tmp_path / "out"), trigger={"processingTime": "100 milliseconds"})
    try:
        run_rounds(query, kind, inputs, range(2))
        feeding = threading.Thread(target=run_rounds, args=(query, kind, inputs, range(2, 6)))
        feeding.start()  # the query commits a batch per round while the savepoints copy its checkpoint
        savepoints = []
        while feeding.is_alive() or not savepoints:
            savepoints.append(create_snapshot(store, open_storage(checkpoint), SnapshotRequest(job="counts")))
        feeding.join()
    finally:
        query.stop()
    batches = [manifest.batch_id for manifest in savepoints]
    assert len(savepoints) >= 2 and batches == sorted(batches) and batches[-1] > batches[0], batches
    stopped = create_snapshot(store, open_storage(checkpoint), SnapshotRequest(job="counts"))  # a quiet one

    # the newest live one restored into HDFS: Spark restarts from it and runs on
    live = open_storage(f"{root}/restored-live")
    execute_restore(store, plan_restore(store, "counts", savepoints[-1].id, live))
    assert read_restart_point(live).batch_id == savepoints[-1].batch_id
    resumed = kind.start(spark, live.uri, inputs, str(tmp_path / "out-live"))
    try:
        kind.feed(inputs, 6)
        resumed.processAllAvailable()
        assert resumed.exception() is None and batches_of(live) and batches_of(live)[-1] > savepoints[-1].batch_id
    finally:
        resumed.stop()

    # the stopped one: deep verify (Spark reads the original on HDFS), rescaled from 3 to 6 partitions in HDFS
    report = verify_snapshot(store, "counts", stopped.id, deep=True)
    assert report.ok and report.deep, report
    rescaled = open_storage(f"{root}/rescaled")
    plan = plan_restore(store, "counts", stopped.id, rescaled)
    execute_restore(store, plan)
    # its new batch holds the state in 6 partitions (repartition checks the batch's pinned partition count)
    assert repartition(rescaled, plan.spark_conf, 6) == stopped.batch_id + 1


def batches_of(checkpoint: Storage) -> list[int]:
    return sorted(int(info.key.split("/")[1]) for info in checkpoint.list("commits/") if info.key[8:].isdigit())
