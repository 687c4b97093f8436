"""A DAG a user writes, one task: `UpgradeJobOperator` upgrades the example Kafka job from v1 to v2 blue/green, run
with `dag.test()` (real task, real deferrable trigger, real spark-submit drivers, the session's Kafka broker, a Delta
table on local disk), events produced all along. Its process is SIGKILLed while the upgrade waits for green to catch
up (the task deferred), and again right after the gate was sent to the old version; each time the DAG run is run
again (the same run: the task retried), and continues the same upgrade. At the end: one upgrade, one new deployment,
and every (user, window) counted once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.records.deployment import DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrades
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import JOB, PARTITIONS, processed, table_of, write_jobs_file
from devtools.windowed import wait_for
from spark_jobs.jobs.windowed.output import read_table, summarize
from tests.support.jobs import kill_every_deployment
from tests.support.windows import RecordingFeeder, counted, differences

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=240)]

DAG = """
import sys
from datetime import datetime

from airflow.sdk import DAG

from airflow_plugin.operators import UpgradeJobOperator

with DAG("upgrade_my_job", schedule=None, catchup=False) as dag:
    UpgradeJobOperator(
        task_id="upgrade",
        job="{job}",
        version="v2",
        jobs_file="{jobs}",
        aws_conn_id=None,
        spark_conn_id=None,
        min_batches=2,
        poll_interval=1.0,
    )

if __name__ == "__main__":
    at = datetime.fromisoformat(sys.argv[1])
    run = dag.test(logical_date=at, run_after=at)  # the same run each time: its task is retried
    print("STATE", run.state)
"""
RUN = "2026-01-01T00:00:00+00:00"  # one DAG run: run again, its task is retried under the same request id


@pytest.mark.timeout(1200)
def test_a_user_dag_upgrades_with_one_deferrable_task_killed_and_retried(
    tmp_path: Path, kafka: EmbeddedKafka, airflow_db: Path
) -> None:
    topic = f"op-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    lake = tmp_path / "lake"
    jobs = write_jobs_file(tmp_path, str(tmp_path / "store"), kafka.bootstrap, topic, lake=str(lake))
    job = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    upgrades, records = Upgrades(job.store.storage), job.deployments
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_file = dags / "upgrade_my_job.py"
    dag_file.write_text(DAG.format(job=JOB, jobs=jobs))
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    feeder = RecordingFeeder(kafka, topic)

    def status(deployment_id: str) -> DeploymentStatus:
        return records.status(JOB, deployment_id) or DeploymentStatus(State.STARTING, 0)

    def run_dag() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(dag_file), RUN], env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    def killed_when(condition: Callable[[], bool], what: str) -> None:
        process = run_dag()
        try:
            wait_for(condition, what, timeout=400)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()

    try:
        with BackgroundFeeder(feeder, interval=1.0):
            blue = deploy(job, DeployRequest("v1"))
            wait_for(lambda: (status(blue.id).last_batch_id or 0) >= 3, "v1's batches", 240)

            def catching_up() -> bool:
                upgrade = upgrades.newest(JOB)
                return upgrade is not None and upgrade.phase is Phase.CATCHING_UP and bool(upgrade.new_deployment)

            killed_when(catching_up, "green to catch up")
            first = upgrades.newest(JOB)
            assert first is not None and first.request_id and first.request_id.startswith("airflow:upgrade_my_job/")

            def gate_sent() -> bool:
                return any(r.id == f"rq-gate-{first.id}" for r in records.requests(JOB, blue.id))

            killed_when(gate_sent, "the gate at v1")
            finished = run_dag()
            output, _ = finished.communicate(timeout=600)
            assert "STATE success" in output, output[-4000:]
        done = upgrades.newest(JOB)
        assert done is not None and done.id == first.id and done.phase is Phase.DONE, "one upgrade, continued"
        assert [d.version for d in records.list(JOB)] == ["v1", "v2"], "one new deployment, however often retried"
        assert len(upgrades.ids(JOB)) == 1

        green = records.get(JOB, str(done.new_deployment))
        feeder.flush()
        wait_for(lambda: processed(green.checkpoint, dict(feeder.ends)), "green to read every record", 240)
        table = open_storage(table_of(str(lake)))
        with contextlib.suppress(TimeoutError):  # what is missing then, the comparison per window says
            wait_for(lambda: summarize(read_table(table)).events >= feeder.events, "the last windows", 180)
        stop(job)
        rows = read_table(table)
        assert not (wrong := differences(feeder.expected(), counted(rows))), f"per (user, window): {wrong}"
        assert summarize(rows).duplicates == []
    finally:
        kill_every_deployment(job)
