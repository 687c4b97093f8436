"""End to end through Airflow: every DAG runs with `dag.test()` (real tasks and deferrable triggers) against the
moto server and the session's Kafka broker, with real spark-submit drivers. The store is reached through the
Airflow AWS connection; the job's checkpoints and its sink, a Delta table, are on the same S3 (S3A). The
scenario (devtools/scenario.py, also the demo) runs the Kafka job: deploys v1, takes a savepoint (with its
Kafka offsets), runs retention, upgrades to v2 blue/green (v2 beside v1, an exactly-once cutover; the health
gates wait for the lag to fall), upgrades to a version that fails after its cutover (the rollback RESTOREs the
table and puts v2 back from the live savepoint), upgrades to v3 (a new grouping key) by replay, is refused a
migration whose function returns a key twice, upgrades to by_country by migrating v3's state, kills the driver
mid-batch and redeploys from the latest state, stops with a savepoint, and compares the live output with
every record produced: each exactly once, every window once and by one version. Before that, a replay
upgrade is refused once Kafka deleted the records it needs. Then a fresh deploy onto the table is refused,
retention deletes the records, and a deploy from the first savepoint is refused before anything starts. (The
file-source job's lifecycle: test_lifecycle_e2e; a blue/green upgrade killed at every step and the aborts before
a cutover: test_blue_green; an upgrade DAG that aborts: tests/airflow/test_dags.py. `make tour` runs the abort
through Airflow too.)"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.jobs.stop import kill
from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.snapshots.verify import verify_snapshot
from devtools.kafka import EmbeddedKafka
from devtools.scenario import JOB, Lifecycle

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=1000)]  # the longest file: make test starts it first


# the longest scenario of the suite, its Spark applications one after another. A thread times it out, not SIGALRM:
# Airflow parses DAG files under an alarm of its own and clears it after, pytest-timeout's with it
@pytest.mark.timeout(2700, method="thread")
def test_the_lifecycle_through_airflow_loses_no_record_and_rolls_back_a_failed_upgrade(
    tmp_path: Path, s3_server: Any, kafka: EmbeddedKafka, airflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection())
    monkeypatch.setenv(JOBS_ENV, "")  # restored after the test; the scenario points it at its own jobs file
    store = s3_server.create_bucket(f"e2e-{int(time.time() * 1000)}") + "/store"
    lake = s3_server.create_bucket(f"lake-{int(time.time() * 1000)}").replace("s3://", "s3a://", 1)
    lifecycle = Lifecycle(tmp_path, store, kafka, lake=lake)
    try:
        lifecycle.run(rollback=True, crash=True, abort=False)  # the abort: see above
    finally:
        if lifecycle.running():
            with contextlib.suppress(SavepointsError):
                kill(lifecycle.job)
    assert lifecycle.failures == []

    deployed = next(r for r in lifecycle.runs if r.dag_id == "savepoints_deploy")
    ui = urlsplit(deployed.links["deploy"]["SparkUILink"])  # the driver's own Spark UI, on loopback
    assert ui.scheme == "http" and ui.hostname in ("127.0.0.1", "localhost") and ui.port, ui
    first_savepoint = next(r for r in lifecycle.runs if r.dag_id == "savepoints_savepoint")
    snapshot_id = first_savepoint.value("savepoint")["id"]
    assert first_savepoint.links["savepoint"]["SnapshotLink"] == f"/savepoints/?job={JOB}&snapshot={snapshot_id}"

    upgrades = [r for r in lifecycle.runs if r.dag_id == "savepoints_upgrade"]
    # v2 blue/green; poisoned rolled back; v3 by replay; a broken migration refused; by_country by migrate; a replay
    # to v2 refused (Kafka deleted its records)
    assert [r.state for r in upgrades] == ["success", "failed", "success", "failed", "success", "failed"]
    assert upgrades[1].tasks["confirm"] == "failed" and upgrades[1].returned["recover"]["phase"] == "ROLLED_BACK"
    for refused in (upgrades[3], upgrades[5]):
        assert refused.tasks["begin"] == "failed" and refused.tasks["launch"] == "upstream_failed"
    assert all(r.tasks["upgrade_failed"] == "failed" for r in upgrades if r.state == "failed")
    records = lifecycle.upgrades()
    assert [records[i].mode for i in (0, 2, 4)] == ["blue_green", "replay", "migrate"]
    versions = [d.version for d in lifecycle.deployments()]
    # v1; v2 beside it; poisoned; v2 back from the rollback; v3 beside it; by_country beside v3, and again after the
    # SIGKILL
    assert versions == ["v1", "v2", "poisoned", "v2", "v3", "by_country", "by_country"]

    manifests = lifecycle.store.list(JOB)
    assert manifests and all(m.status is SnapshotStatus.COMPLETED for m in manifests)
    for manifest in manifests:
        assert verify_snapshot(lifecycle.store, JOB, manifest.id).ok

    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        extras = [event.extra for event in session.scalars(select(AssetEvent))]
    announced = {extra.get("snapshot_id") for extra in extras}
    taken_by_dags = {r.value(t)["id"] for r in lifecycle.runs for t in ("savepoint",) if t in r.returned}
    assert taken_by_dags and taken_by_dags <= announced
    sample = next(extra for extra in extras if extra.get("snapshot_id") in taken_by_dags)
    assert sample["location"].startswith(store) and isinstance(sample["batch_id"], int)
