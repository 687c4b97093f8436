"""Every way a blue/green upgrade can end, from the command line, with real processes: the session's Kafka broker,
spark-submit drivers, the job's Delta table on local disk, events produced all along. One job, one topic and one
table serve every scenario, one after the other:

1. the upgrade's process SIGKILLed right after it sent the gate to the old version, then `--abort`;
2. input idle across the gate: the new version has no batch to publish in, the upgrade gives up and aborts;
3. the old driver paused (SIGSTOP) past its heartbeat timeout during the cutover, then continued (SIGCONT);
4. the process SIGKILLed at every step (green started, the gate sent, the cutover, the old version stopping) and
   resumed each time, to the end;
5. the new driver stopped by a failpoint right after its publish commit, while the old one keeps committing.

At the end every (key, window)'s count in the table is compared with the events produced: each window was written
by exactly one version, once, whatever happened."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployments, observed_state
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.jobs.stop import running_deployment, stop
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import JOB, PARTITIONS, processed, table_of, write_jobs_file
from devtools.windowed import wait_for
from spark_jobs.generate import FLUSH_USER
from spark_jobs.jobs.windowed.output import read_table, summarize
from spark_jobs.runtime.failpoints import ENV as FAILPOINTS
from tests.support.jobs import kill_every_deployment
from tests.support.windows import RecordingFeeder, counted, differences

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=600)]

REPO = Path(__file__).resolve().parents[2]
STARTING = DeploymentStatus(State.STARTING, 0)
ENDED = 11  # the command's exit code for an upgrade that did not go through (ABORTED, ROLLED_BACK)


@pytest.mark.timeout(1500)
def test_every_way_out_of_a_blue_green_upgrade_leaves_one_writer_per_window(
    tmp_path: Path, kafka: EmbeddedKafka
) -> None:
    topic = f"bg-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    lake = tmp_path / "lake"
    # a paused driver reads LOST after 20 s (heartbeats every 2 s)
    jobs = write_jobs_file(
        tmp_path, str(tmp_path / "store"), kafka.bootstrap, topic, lake=str(lake), heartbeat_timeout="20s"
    )
    job = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    upgrades, records = Upgrades(job.store.storage), Deployments(job.store.storage)
    feeder = RecordingFeeder(kafka, topic)
    command = [sys.executable, "-m", "airflow_plugin", "upgrade", JOB, "--jobs", str(jobs)]
    fast = ["--min-batches", "2"]

    def newest() -> Upgrade | None:
        return upgrades.newest(JOB)

    def status(deployment: Deployment) -> DeploymentStatus:
        return records.status(JOB, deployment.id) or STARTING

    def gate_sent(deployment: Deployment) -> bool:
        """The running upgrade's gate request is in the deployment's control channel (not yet answered, or just)."""
        upgrade = newest()
        return upgrade is not None and any(
            r.id == f"rq-gate-{upgrade.id}" for r in records.requests(JOB, deployment.id)
        )

    def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        environment = {**os.environ, **(env or {})}
        return subprocess.Popen([*command, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=environment)  # fmt: skip

    def finished(process: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output

    def killed_when(argv: list[str], condition: Callable[[], bool], what: str) -> Upgrade:
        """Run the command, SIGKILL it once `condition()` holds, return the upgrade's record then."""
        process = start(argv)
        try:
            wait_for(condition, what, timeout=300)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        record = newest()
        assert record is not None and not record.phase.terminal, record
        return record

    def running() -> Deployment:
        return running_deployment(job)

    def quiet(*deployments: Deployment) -> None:
        """Wait until the deployments ran no batch for 8 s (their input idle, the last no-data batch done)."""
        seen: dict[str, tuple[int, float]] = {}

        def still() -> bool:
            now = time.monotonic()
            for deployment in deployments:
                batch = status(deployment).last_batch_id or 0
                if seen.get(deployment.id, (None,))[0] != batch:
                    seen[deployment.id] = (batch, now)
            return all(now - since >= 8 for _, since in seen.values())

        wait_for(still, "the drivers to run no batch", 120)

    def batches_on(deployment: Deployment, more: int) -> None:
        """Wait for `more` batches of the deployment after now."""
        now = status(deployment).last_batch_id or 0
        wait_for(lambda: (status(deployment).last_batch_id or 0) >= now + more, f"{more} batches of {deployment.id}")

    try:
        with BackgroundFeeder(feeder, interval=1.0) as feeding:
            blue = deploy(job, DeployRequest("v1"))
            wait_for(lambda: (status(blue).last_batch_id or 0) >= 3, "v1's batches", 240)

            # 1. killed right after sending the gate, then aborted: the gate is taken back whether or not blue took it
            # (it decides at once between batches: had it left rows to green meanwhile, the abort rolls back)
            first = killed_when(["--version", "v2", *fast], lambda: gate_sent(blue), "the gate request at v1")
            code, output = finished(start(["--abort"]))
            ended = upgrades.get(JOB, first.id)
            assert code == ENDED and ended.phase in (Phase.ABORTED, Phase.ROLLED_BACK), output
            green = records.get(JOB, str(ended.new_deployment))
            assert observed_state(green, records.status(JOB, green.id)) in (State.STOPPED, State.FAILED)
            if ended.phase is Phase.ABORTED:
                assert "runs on" in ended.history[-1]["note"], ended.history
                assert first.id in (status(blue).gate or {}).get("withdrawn", [])
            blue = running()
            assert blue.version == "v1"
            batches_on(blue, 2)  # a gate blue kept would apply from its next batch on
            gate = status(blue).gate or {}
            assert gate.get("role") == "sole" and gate.get("until") is None and not gate.get("dropped"), gate

            # 2. input idle across the gate: blue answers between batches, green has no batch to publish in; the
            # upgrade gives up, and the abort is answered by both at once, still idle. (Begun with input flowing, so
            # that green catches up, then stopped and resumed once both drivers are quiet.)
            second = killed_when(
                ["--version", "v2", *fast, "--answer-timeout", "20s"],
                lambda: bool((u := newest()) and u.id != first.id and u.phase is Phase.CATCHING_UP),
                "green to be started",
            )
            green = records.get(JOB, str(second.new_deployment))
            wait_for(lambda: status(green).state is State.RUNNING, "green to run", 300)
            batches_on(green, 2)
            with feeding.idle():
                quiet(blue, green)
                code, output = finished(start(["--resume"]))
                assert code == ENDED, output
                record = upgrades.get(JOB, second.id)
                assert record.phase is Phase.ABORTED, record.history
                assert "did not answer the publish" in str(record.history), record.history
                assert (status(blue).gate or {}).get("role") == "sole", "ungated while idle"
            batches_on(blue, 2)
            assert (status(blue).gate or {}).get("role") == "sole"

            # 3. the old driver paused past its heartbeat timeout during the cutover, then continued: whichever way
            # the upgrade ends (aborted, or rolled back if blue had taken the gate), one version writes each window
            paused = start(["--version", "v2", *fast, "--answer-timeout", "90s"])
            wait_for(lambda: gate_sent(blue), "the gate request at v1", 400)
            os.killpg(blue.launcher["pid"], signal.SIGSTOP)
            try:
                wait_for(lambda: state_of(job, blue) is State.LOST, "v1 to be LOST", 120)
                wait_for(
                    lambda: (u := newest()) is not None and u.phase in (Phase.ABORTING, Phase.ROLLING_BACK),
                    "the upgrade's recovery",
                    300,
                )
            finally:
                with contextlib.suppress(ProcessLookupError):  # a rollback kills it
                    os.killpg(blue.launcher["pid"], signal.SIGCONT)
            code, output = finished(paused)
            third = newest()
            assert third is not None and code == ENDED, output
            assert third.phase in (Phase.ABORTED, Phase.ROLLED_BACK), third.history
            blue = running()
            assert blue.version == "v1" and (status(blue).gate or {}).get("role") == "sole"
            batches_on(blue, 2)

            # 4. killed at every step and resumed each time, to the end
            resumed = killed_when(["--version", "v2", *fast], lambda: bool((u := newest()) and u.new_deployment
                                  and u.phase is Phase.CATCHING_UP), "green to be started")  # fmt: skip
            killed_when(["--resume"], lambda: gate_sent(blue), "the gate request at v1")
            killed_when(["--resume"], lambda: bool((u := newest()) and u.cut_over), "the cutover")
            stopping = (State.STOPPING, State.STOPPED)
            killed_when(["--resume"], lambda: status(blue).state in stopping, "v1 to be stopping")
            code, output = finished(start(["--resume"]))
            assert code == 0, output
            done = upgrades.get(JOB, resumed.id)
            assert done.phase is Phase.DONE and done.cutover_ms is not None
            assert [d.version for d in records.list(JOB) if d.restored_from == done.savepoint] == ["v2"], "one green"
            assert not open_storage(str(done.staging)).exists(), "green's staging table is removed"
            blue = records.get(JOB, str(done.new_deployment))

            # 5. green stopped right after its publish commit (a failpoint), while blue keeps committing: the table
            # says green published, so the upgrade rolls back (an abort would let blue write those windows again)
            code, output = finished(start(["--version", "v1", *fast], env={FAILPOINTS: "after-publish-commit=stop"}))
            fifth = newest()
            assert fifth is not None and code == ENDED, output
            assert fifth.phase is Phase.ROLLED_BACK, fifth.history
            assert "had published" in str(fifth.history) or "failed while it published" in str(fifth.history)
            blue = running()
            assert blue.version == "v2"
            batches_on(blue, 2)

        feeder.flush()
        wait_for(lambda: processed(blue.checkpoint, dict(feeder.ends)), "the job to read every record", 240)
        table = open_storage(table_of(str(lake)))
        expected = feeder.expected()
        wait_for(lambda: summarize(read_table(table)).events >= feeder.events, "the last windows", 180)
        stop(job)
        rows = [row for row in read_table(table) if row["user"] != FLUSH_USER]
        assert not (wrong := differences(expected, counted(rows))), f"per (user, window): {wrong}"
        summary = summarize(rows)
        assert summary.duplicates == [] and summary.shared_windows == [], "every window from one version, once"
    finally:
        for deployment in records.list(JOB):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(deployment.launcher.get("pid", -1), signal.SIGCONT)
        kill_every_deployment(job)
