"""Round trip for every checkpoint kind, with real Spark queries: a LIVE snapshot while the query keeps
running, stop, restore into a new location, restart the same query there. It resumes at N+1, its state
at N equals the original's, and the final output equals an uninterrupted run's (deterministic file
source, exactly-once sinks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_plugin.core.errors import Refused
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import open_storage
from tests.support.spark_kinds import KINDS, Kind, last_commit, read_state, run_rounds

pytestmark = pytest.mark.spark
TRIGGER = {"processingTime": "200 milliseconds"}


def uninterrupted_output(spark, kind: Kind, input_dir: Path, tmp_path: Path) -> list:
    """The same query over all the input, never interrupted."""
    query = kind.start(spark, str(tmp_path / "u-ckpt"), str(input_dir), str(tmp_path / "u-out"))
    query.processAllAvailable()
    query.stop()
    return kind.final_output(spark, str(tmp_path / "u-out"))


@pytest.mark.parametrize("name", list(KINDS))
def test_live_snapshot_restore_resume(spark, tmp_path: Path, s3_store: str, name: str) -> None:
    kind = KINDS[name]
    store = SnapshotStore(open_storage(s3_store))
    ckpt, restored, inputs, output = (str(tmp_path / d) for d in ("ckpt", "restored", "in", "out"))
    file_sink = kind.sink == "file"

    query = kind.start(spark, ckpt, inputs, output, trigger=TRIGGER)
    run_rounds(query, kind, inputs, range(3))
    if not file_sink:
        kind.feed(inputs, 3)  # batches keep running while the snapshot copies
    manifest = create_snapshot(
        store, open_storage(ckpt), SnapshotRequest(job=name, sinks=(output,) if file_sink else ())
    )
    assert query.isActive, "the snapshot was taken while the query ran"
    n = manifest.batch_id
    assert n is not None and n <= last_commit(ckpt)
    query.processAllAvailable()
    original_state = read_state(spark, ckpt, n) if kind.stateful else {}
    query.stop()

    execute_restore(store, plan_restore(store, name, manifest.id, open_storage(restored)))
    shutil.rmtree(ckpt)  # the restored copy must stand on its own (absolute paths rewritten)
    if kind.stateful:
        assert read_state(spark, restored, n) == original_state
        assert original_state, "the query had state"

    if file_sink:
        resumed_output = output  # the file sink must keep its path; it committed nothing beyond N
    else:  # the exactly-once foreachBatch output up to N comes from the original run
        resumed_output = str(tmp_path / "out-resumed")
        for batch_dir in Path(output).glob("batch_id=*"):
            if int(batch_dir.name.split("=")[1]) <= n:
                shutil.copytree(batch_dir, Path(resumed_output) / batch_dir.name)
    resumed = kind.start(spark, restored, inputs, resumed_output, trigger=TRIGGER)
    try:
        run_rounds(resumed, kind, inputs, range(4, 6))
        first_batch = resumed.recentProgress[0]["batchId"]
    finally:
        resumed.stop()
    assert first_batch == n + 1

    assert kind.final_output(spark, resumed_output) == uninterrupted_output(spark, kind, Path(inputs), tmp_path)


def test_restore_refuses_when_the_file_sink_is_ahead(spark, tmp_path: Path) -> None:
    kind = KINDS["file_source"]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs, output = (str(tmp_path / d) for d in ("ckpt", "in", "out"))
    query = kind.start(spark, ckpt, inputs, output)
    try:
        run_rounds(query, kind, inputs, range(2))
        manifest = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="files", sinks=(output,)))
        run_rounds(query, kind, inputs, range(2, 4))
    finally:
        query.stop()
    target = tmp_path / "restored"
    with pytest.raises(Refused, match=rf"beyond batch {manifest.batch_id}.*--allow-sink-ahead"):
        plan_restore(store, "files", manifest.id, open_storage(str(target)))
    assert not target.exists()
    plan = plan_restore(store, "files", manifest.id, open_storage(str(target)), allow_sink_ahead=True)
    assert any("would be lost" in w for w in plan.warnings)


def test_deep_verify_reads_every_operator_through_spark(spark, tmp_path: Path) -> None:
    kind = KINDS["multi_op"]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs, output = (str(tmp_path / d) for d in ("ckpt", "in", "out"))
    query = kind.start(spark, ckpt, inputs, output)
    try:
        run_rounds(query, kind, inputs, range(3))
    finally:
        query.stop()
    manifest = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job="multi"))

    report = verify_snapshot(store, "multi", manifest.id, deep=True)
    assert report.ok, report.problems
    operators = report.deep["operators"]
    assert {op["operator"] for op in operators} == {0, 1}
    assert all(op["rows"] > 0 and op["matches_original"] is True for op in operators)

    # a snapshot that lacks a state file passes the checksum check but not the deep one
    damaged = store.get("multi", manifest.id)
    victim = next(f for f in damaged.files if f.path.startswith("state/1/0/") and "_metadata" not in f.path)
    damaged.files.remove(victim)
    store.put(damaged)
    report = verify_snapshot(store, "multi", manifest.id, deep=True)
    assert not report.ok
    assert any("operator 1" in problem and "unreadable" in problem for problem in report.problems)
