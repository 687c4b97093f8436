"""Round trip for every checkpoint kind, with real Spark queries: a LIVE snapshot while the query keeps
running, stop, restore into a new location, restart the same query there. It resumes at N+1, its state
at N equals the original's, and the final output equals an uninterrupted run's (deterministic file
source, exactly-once sinks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_plugin.core.errors import Refused
from airflow_plugin.core.sinks import FILE, SinkRef
from airflow_plugin.core.sinks import file as file_sink
from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot
from airflow_plugin.core.snapshots.restore import execute_restore, plan_restore
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.snapshots.verify import verify_snapshot
from airflow_plugin.core.storage import open_storage
from tests.support.spark_kinds import KINDS, Kind, last_commit, read_state, remove_stopped_checkpoint, run_rounds
from tests.support.synthetic import tree

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
        store, open_storage(ckpt), SnapshotRequest(job=name, sinks=(SinkRef(FILE, output),) if file_sink else ())
    )
    assert query.isActive, "the snapshot was taken while the query ran"
    n = manifest.batch_id
    assert n is not None and n <= last_commit(ckpt)
    query.processAllAvailable()
    original_state = read_state(spark, ckpt, n) if kind.stateful else {}
    query.stop()

    execute_restore(store, plan_restore(store, name, manifest.id, open_storage(restored)))
    remove_stopped_checkpoint(ckpt)  # the restored copy must stand on its own (absolute paths rewritten)
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


@pytest.mark.parametrize("name", ["join", "file_source"])
def test_a_sink_ahead_is_refused_then_rewound_and_every_record_lands_once(spark, tmp_path: Path, name: str) -> None:
    """A restore behind its file sink: refused untouched; with the rewind, the batches after N run again
    (for the stateful join: its state is written again too) and the output equals an uninterrupted run."""
    kind = KINDS[name]
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    ckpt, inputs, output = (str(tmp_path / d) for d in ("ckpt", "in", "out"))
    query = kind.start(spark, ckpt, inputs, output)
    try:
        run_rounds(query, kind, inputs, range(2))
        manifest = create_snapshot(store, open_storage(ckpt), SnapshotRequest(job=name, sinks=(SinkRef(FILE, output),)))
        for round_no in range(2, 14):  # past the sink log's compaction (every 10 batches)
            run_rounds(query, kind, inputs, [round_no])
    finally:
        query.stop()
    ahead = file_sink.position(open_storage(output))
    assert ahead is not None and ahead >= 10 > manifest.batch_id
    target = tmp_path / "restored"
    before = tree(Path(output))
    with pytest.raises(Refused, match=rf"beyond batch {manifest.batch_id}.*--rewind-sink"):
        plan_restore(store, name, manifest.id, open_storage(str(target)))
    assert not target.exists() and tree(Path(output)) == before

    plan = plan_restore(store, name, manifest.id, open_storage(str(target)), rewind_sink=True)
    assert tree(Path(output)) == before  # a plan writes nothing
    execute_restore(store, plan)
    assert file_sink.position(open_storage(output)) == manifest.batch_id
    [(_, rewind)] = plan.rewinds
    quarantined = Path(output) / rewind.quarantine
    assert json.loads((quarantined / "rewind.json").read_text())["state"] == "done"
    assert len(list((quarantined / "data").rglob("part-*"))) == len(rewind.data) > 0
    remove_stopped_checkpoint(ckpt)

    resumed = kind.start(spark, str(target), inputs, output)
    try:
        resumed.processAllAvailable()
    finally:
        resumed.stop()
    assert kind.final_output(spark, output) == uninterrupted_output(spark, kind, Path(inputs), tmp_path)


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
    store.update("multi", manifest.id, lambda current: current.files.remove(victim))
    report = verify_snapshot(store, "multi", manifest.id, deep=True)
    assert not report.ok
    assert any("operator 1" in problem and "unreadable" in problem for problem in report.problems)
