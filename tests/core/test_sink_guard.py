"""The sink guard of every start (core/guards/sink.py): a query starting after batch N onto a sink that holds
later batches is refused (the file sink would skip them: records lost; a Delta table under a fresh query's
new id would take them twice), at the engine before anything is launched (core/jobs/fresh_start.py) and in
the job runtime just before the query starts (spark_jobs/runtime/sink.py). Logs are laid out as Spark and
Delta write them; the real drivers are in tests/e2e/test_lifecycle_e2e.py and tests/e2e/test_dags_e2e.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import Refused
from airflow_plugin.core.guards.sink import FRESH, SINK_AHEAD, ahead, plan_fresh_rewind, start_bound
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import build_of
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.startup import wait_for_state
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.sinks import DELTA, FILE, SinkRef
from airflow_plugin.core.sinks import file as file_sink
from airflow_plugin.core.snapshots.checkpoint import read_position
from airflow_plugin.core.storage import LocalStorage, open_storage
from spark_jobs.runtime.sink import SinkAhead, check_start
from tests.core.test_delta_sink import commit, write
from tests.support.jobs import write_jobs
from tests.support.synthetic import QUERY_ID, tree, write_checkpoint


def file_output(root: Path, batches: range) -> Path:
    """A file sink's output as Spark leaves it: a data file and a log entry per committed batch."""
    (root / file_sink.LOG_DIR).mkdir(parents=True, exist_ok=True)
    for batch in batches:
        data = root / f"part-{batch:05d}.json"
        data.write_text(json.dumps({"batch": batch}) + "\n")
        entry = {"path": f"file://{data}", "size": data.stat().st_size, "action": "add"}
        (root / file_sink.LOG_DIR / str(batch)).write_text("v1\n" + json.dumps(entry))
    return root


def test_the_bound_a_sink_may_hold() -> None:
    assert start_bound(None, None, stateful=True) == FRESH == -1  # a fresh start: nothing at all
    assert start_bound(7, None, stateful=False) == 7
    assert start_bound(7, 8, stateful=True) == 7  # a stateful query must run its pending batch itself
    assert start_bound(7, 8, stateful=False) == 8  # a stateless one replays it with the same offsets
    assert start_bound(None, 0, stateful=False) == 0


def test_a_file_sink_that_holds_batches_is_ahead_of_a_fresh_start(tmp_path: Path) -> None:
    output = file_output(tmp_path / "out", range(4))
    sink = SinkRef(FILE, f"file:{output}")
    found = ahead(sink, LocalStorage(output), FRESH)
    assert found is not None and found.skipped == "0..3" and not found.duplicates
    assert found.holds == f"file sink file:{output} has committed batches up to 3"
    message = found.refusal("at batch 0 (a fresh start)", True, "moved aside")
    assert "Spark would skip batches 0..3 as already written: every record they read is lost" in message
    assert "state they should write never exists" in message and "Nothing was started" in message
    assert "another output location" in message and "--rewind-sink" in message and "latest-state" in message
    assert ahead(sink, LocalStorage(output), 3) is None  # a restore of batch 3 resumes at 4
    assert ahead(sink, LocalStorage(tmp_path / "empty"), FRESH) is None


def test_a_delta_table_with_streaming_writes_is_ahead_of_a_fresh_start_by_duplicates(tmp_path: Path) -> None:
    table = tmp_path / "table"
    commit(table, 0, {"commitInfo": {"operation": "CREATE TABLE"}})  # made with DDL first
    for version, batch in ((1, 0), (2, 1), (3, 2)):
        write(table, version, "old-query", batch)
    sink = SinkRef(DELTA, str(table))
    found = ahead(sink, LocalStorage(table), FRESH)
    assert found is not None and found.duplicates and found.skipped == "0..2"
    assert "holds batches up to 2 of query old-query" in found.holds
    assert "written to the table twice" in found.refusal("at batch 0", False, "RESTORE")
    # the restored query of that id resumes after batch 2: nothing ahead; after batch 1 it would skip batch 2
    assert ahead(sink, LocalStorage(table), 2, "old-query") is None
    behind = ahead(sink, LocalStorage(table), 1, "old-query")
    assert behind is not None and not behind.duplicates and behind.skipped == "2"
    rewind = plan_fresh_rewind(sink, LocalStorage(table), "t", None)
    assert rewind.describe()["restored_to_version"] == 0  # before its first streaming write

    created_by_stream = tmp_path / "streamed"
    write(created_by_stream, 0, "old-query", 0)
    with pytest.raises(Refused, match="created by its first streaming write"):
        plan_fresh_rewind(SinkRef(DELTA, str(created_by_stream)), LocalStorage(created_by_stream), "t", None)
    plain = tmp_path / "plain"
    commit(plain, 0, {"commitInfo": {"operation": "WRITE"}}, {"add": {"path": "a.parquet"}})
    assert ahead(SinkRef(DELTA, str(plain)), LocalStorage(plain), FRESH) is None  # no query wrote it


def test_the_runtime_refuses_to_start_a_query_whose_sink_is_ahead(tmp_path: Path) -> None:
    output = file_output(tmp_path / "out", range(3))
    sink = SinkRef(FILE, f"file:{output}")
    with pytest.raises(SinkAhead, match=r"at batch 0 \(a fresh start.*moved aside into .*_savepoints_quarantine"):
        check_start(sink, str(tmp_path / "fresh-checkpoint"))
    assert not (tmp_path / "fresh-checkpoint").exists()

    restored = write_checkpoint(tmp_path / "restored", batches=3)  # committed 0..2: resumes at 3
    position = read_position(LocalStorage(restored))
    assert position is not None and (position.next_batch, position.sink_bound, position.stateful) == (3, 2, True)
    assert position.query_id == QUERY_ID
    check_start(sink, str(restored))  # the sink holds 0..2: nothing skipped
    file_output(output, range(3, 5))
    with pytest.raises(SinkAhead, match=r"starts at batch 3: Spark would skip batches 3\.\.4"):
        check_start(sink, str(restored))
    assert SinkAhead.error_class == SINK_AHEAD

    # a driver killed after the Delta table took its batch 3 and before Spark committed it: the latest state
    # still holds that batch pending; the way out is an earlier snapshot, rewound
    crashed = write_checkpoint(tmp_path / "crashed", batches=3, pending=True)
    table = tmp_path / "table"
    for version in range(4):
        write(table, version, QUERY_ID, version)
    with pytest.raises(
        SinkAhead, match=r"at batch 3 \(logged, never committed.*restore the newest snapshot from before"
    ):
        check_start(SinkRef(DELTA, str(table)), str(crashed))
    # a gated writer runs the batch's plan before Delta skips it: the pending batch is replayed, its state written
    check_start(SinkRef(DELTA, str(table)), str(crashed), runs_held_batches=True)
    write(table, 4, QUERY_ID, 4)  # but never a batch after the pending one: its offsets were never logged
    with pytest.raises(SinkAhead, match=r"starts at batch 3: Spark would skip batches 4"):
        check_start(SinkRef(DELTA, str(table)), str(crashed), runs_held_batches=True)


def test_a_refused_start_ends_the_wait_as_a_refusal(tmp_path: Path) -> None:
    job = Settings(jobs_file=str(write_jobs(tmp_path))).resolve().job("orders")
    deployment = Deployment(id="dp-20261124T000000000Z-0001", job="orders", version="v1", checkpoint="c")
    job.deployments.put(deployment)
    failed = DeploymentStatus(State.FAILED, time.time(), error_class=SINK_AHEAD, error_message="file sink x holds")
    job.deployments.write_status("orders", deployment.id, failed)
    with pytest.raises(Refused, match="refused by its sink guard: file sink x holds"):
        wait_for_state(job, deployment, (State.RUNNING,), 5, "RUNNING")


def test_a_fresh_deploy_onto_the_sink_of_an_earlier_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    output = file_output(tmp_path / "out", range(4))
    earlier = Deployment(
        id="dp-20261124T000000000Z-0001",
        job="orders",
        version="v1",
        checkpoint=str(tmp_path / "checkpoints/orders/dp-20261124T000000000Z-0001"),
        build=build_of(job, job.spec.version("v1")),
    )
    job.deployments.put(earlier)
    reported = DeploymentStatus(State.STOPPED, time.time(), sink=f"FileSink[file:{output}]")
    job.deployments.write_status("orders", earlier.id, reported)
    before_output, before_store = tree(output), tree(tmp_path / "store")

    # refused before anything is launched: no deployment record, no checkpoint, the output as it was
    assert main(["deploy", "orders", "--jobs", jobs, "--restore", "none"]) == 4
    err = capsys.readouterr().err
    assert f"file sink file:{output} has committed batches up to 3" in err
    assert "at batch 0 (a fresh start, with a new query id)" in err and "--rewind-sink" in err
    assert tree(output) == before_output and tree(tmp_path / "store") == before_store
    assert not (tmp_path / "checkpoints").exists()

    assert [d.id for d in job.deployments.list("orders")] == [earlier.id]
    # v2 is another build (its own arguments), whose sink no deployment reported: the runtime's to check
    assert build_of(job, job.spec.version("v2")) != earlier.build

    # with --rewind-sink the earlier output moves aside whole, then the deployment launches
    assert main(["deploy", "orders", "--jobs", jobs, "--restore", "none", "--rewind-sink", "--wait", "0"]) == 0
    assert file_sink.position(LocalStorage(output)) is None
    quarantined = next((output / file_sink.QUARANTINE).iterdir())
    record = json.loads((quarantined / "rewind.json").read_text())
    assert record["state"] == "done" and record["batch_id"] == FRESH and len(record["data"]) == 4
    assert sorted(p.name for p in (quarantined / "data").iterdir()) == [f"part-{b:05d}.json" for b in range(4)]
    newest = Deployments(open_storage(str(tmp_path / "store"))).list("orders")[-1]
    assert newest.id != earlier.id and newest.build == earlier.build and newest.restored_from is None


def test_latest_state_after_a_rollback_is_the_running_querys_not_the_rolled_back_ones(tmp_path: Path) -> None:
    """A rollback restores the old version under a new query id; the version it replaced left snapshots with
    higher batch ids (its stop savepoint), whose output the rollback undid. The latest state of the job is
    the deployment that ran last, even at a lower batch id."""
    from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
    from airflow_plugin.core.snapshots.create import SnapshotRequest, create_snapshot

    jobs = str(write_jobs(tmp_path))
    job = Settings(jobs_file=jobs).resolve().job("orders")
    replaced = write_checkpoint(tmp_path / "replaced", batches=10)  # the rolled-back version, at batch 9
    create_snapshot(job.store, LocalStorage(replaced), SnapshotRequest("orders", deployment="dp-old"))
    running = write_checkpoint(tmp_path / "running", batches=4)  # the rollback's deployment, at batch 3
    (running / "metadata").write_text(json.dumps({"id": "the-restored-query"}))
    last = Deployment(id="dp-20261124T000000000Z-0002", job="orders", version="v1", checkpoint=str(running))
    job.deployments.put(last)
    job.deployments.write_status("orders", last.id, DeploymentStatus(State.FAILED, time.time()))

    deployed = deploy(job, DeployRequest("v1", restore="latest-state", wait_seconds=0))
    source = job.store.get("orders", str(deployed.restored_from))
    assert (source.query_id, source.batch_id, source.deployment) == ("the-restored-query", 3, last.id)
