"""A blue/green upgrade from the command line, whose process is killed (SIGKILL) at each step where it matters
and resumed: green started, the gate set at the old version, the cutover, the old version stopping. Real
processes: the session's Kafka broker, spark-submit drivers, the job's Delta table (on local disk here; the
same on the embedded S3 through Airflow in test_dags_e2e.py), events produced all along. Every record is
counted once and every (key, window) is written once, by exactly one version."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.context import Settings
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployments, DeploymentStatus, State, observed_state
from airflow_plugin.core.jobs.stop import kill, stop
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import JOB, PARTITIONS, KafkaFeeder, processed, table_of, write_jobs_file
from devtools.windowed import wait_for
from spark_jobs.jobs.windowed.output import read_table, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_a_blue_green_upgrade_killed_at_every_step_resumes_and_writes_every_window_once(
    tmp_path: Path, kafka: EmbeddedKafka
) -> None:
    topic = f"bg-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    lake = tmp_path / "lake"
    jobs = write_jobs_file(tmp_path, str(tmp_path / "store"), kafka.bootstrap, topic, lake=str(lake))
    job = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    upgrades, records = Upgrades(job.store.storage), Deployments(job.store.storage)
    feeder = KafkaFeeder(kafka, topic)
    command = [sys.executable, "-m", "airflow_plugin", "upgrade", JOB, "--jobs", str(jobs)]
    status0 = DeploymentStatus(State.STARTING, 0)

    def newest() -> Upgrade | None:
        found = upgrades.list(JOB)
        return found[-1] if found else None

    def killed_when(argv: list[str], condition: Callable[[Upgrade], bool], what: str) -> Upgrade:
        """Run the command, SIGKILL it once the upgrade's record shows `condition`, return that record."""
        process = subprocess.Popen([*command, *argv], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: (u := newest()) is not None and condition(u), what, timeout=300)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        record = newest()
        assert record is not None and not record.phase.terminal, record
        return record

    try:
        with BackgroundFeeder(feeder, interval=1.0):
            blue = deploy(job, DeployRequest("v1"))
            wait_for(lambda: ((records.status(JOB, blue.id) or status0).last_batch_id or 0) >= 3, "v1's batches", 240)

            started = killed_when(
                ["--version", "v2", "--min-batches", "3"], lambda u: u.phase is Phase.CATCHING_UP, "green to be started"
            )
            assert started.mode == "blue_green" and started.new_deployment
            gated = killed_when(["--resume"], lambda u: u.cutover_ms is not None, "the gate to be set at blue")
            assert observed_state(records.get(JOB, blue.id), records.status(JOB, blue.id)) is State.RUNNING
            killed_when(["--resume"], lambda u: u.cut_over, "the cutover")
            stopping = (State.STOPPING, State.STOPPED)
            killed_when(
                ["--resume"],
                lambda _: (records.status(JOB, blue.id) or status0).state in stopping,
                "blue to be stopping",
            )
            resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=400)
            assert resumed.returncode == 0, resumed.stderr
        done = newest()
        assert done is not None and done.phase is Phase.DONE and done.cutover_ms == gated.cutover_ms
        assert [d.version for d in records.list(JOB)] == ["v1", "v2"], "one green, however often it was resumed"
        assert records.status(JOB, blue.id).state is State.STOPPED  # type: ignore[union-attr]
        assert not open_storage(str(done.staging)).exists(), "green's staging table is removed"

        feeder.flush()
        green = records.get(JOB, str(done.new_deployment))
        wait_for(lambda: processed(green.checkpoint, dict(feeder.ends)), "green to read every record", 240)
        table = open_storage(table_of(str(lake)))
        wait_for(lambda: summarize(read_table(table)).events >= feeder.events, "the last windows", 120)
        stop(job)
        summary = summarize(read_table(table))
        assert summary.events == feeder.events, "every record counted once"
        assert summary.duplicates == [], "every (key, window) written once"
        assert set(summary.versions) == {"v1", "v2"}, summary.versions
    finally:
        for deployment in records.list(JOB):
            with contextlib.suppress(SavepointsError):
                kill(job, deployment.id)
