"""Cluster mode on a real YARN with checkpoints on HDFS (issue 29), through real processes: Hadoop's mini cluster
(one NodeManager, tests/support/hadoop_fixtures.py) and the moto server as store. The example job is deployed to
YARN in cluster mode with `checkpoint_root` on the mini HDFS and its Python environment shipped as an archive:

- deploy v1: spark-submit returns once YARN accepted the application, the deployment records its id, and the
  driver runs in a YARN container (a process of the NodeManager, not of spark-submit) with the shipped Python;
  its heartbeat and control channel reach the store from there;
- a live savepoint while the query commits batches, and a retained checkpoint;
- the driver's container killed: YARN's second attempt (spark.yarn.maxAppAttempts=2 in this job's conf; the
  engine's default is 1) restarts the query from the deployment's own checkpoint, under the same deployment;
- the upgrade to v2 through the upgrade DAG (`dag.test()`, mode stop_restore: the pre-flight as a YARN application
  on a throwaway copy on HDFS, the new driver pre-started, stop-with-savepoint, the restore into HDFS, the health
  gate);
- every event counted exactly once across the retry and the upgrade;
- someone kills the v2 application with YARN (as `yarn application -kill` does): `savepoints status` shows the
  deployment FAILED with YARN's diagnostics, not a RUNNING heartbeat that goes stale.

The autoscaler on the same cluster (issue 54), executors as its knob: a declared Kafka job (devtools/autoscale_app.py)
on YARN in cluster mode, its checkpoints on HDFS, sized by `savepoints apply` processes run as the reconcile DAG runs
them. Its state has 1 partition, `partitions = "follow"`: the scale-up from 1 executor to 2 repartitions the state
to 2 (an upgrade through stop/restore); after a quiet window the job is scaled down to 1 executor, keeping its 2
partitions. YARN's own record shows each application's containers; every (user, window) is written once."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.autoscale.decide import Rescale
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.jobs.yarn import resource_manager
from airflow_plugin.core.records.deployment import State
from airflow_plugin.core.records.manifest import Kind, SnapshotStatus
from airflow_plugin.core.upgrades.record import Upgrade, Upgrades
from devtools.autoscale_job import (
    JOB,
    TOPIC_PARTITIONS,
    ApplyLoop,
    RateFeeder,
    caught_up,
    check_every_window_once,
    pinned_partitions,
    reconciled,
    rescale_ended,
    running_batches,
    status_of,
)
from devtools.autoscale_job import write_jobs_file as write_autoscaled_jobs_file
from devtools.dag_runs import load_dags, run_dag
from devtools.embedded_s3 import EmbeddedS3
from devtools.hadoop import MiniHadoop
from devtools.kafka import EmbeddedKafka
from devtools.windowed import Feeder, batches, feeding_version, processed, wait_for, wait_output_complete
from devtools.yarn_job import job_conf, write_yarn_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize
from tests.support.jobs import kill_every_deployment

pytestmark = [pytest.mark.spark, pytest.mark.slow]
JVM = os.environ.get("JDK_JAVA_OPTIONS")  # the tests' JVM flags (tests/conftest.py), for the YARN containers' JVMs too


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        chain.append(pid)
    return chain


def job_upgrades(job: JobContext) -> list[Upgrade]:
    return Upgrades(job.store.storage).list(job.name)


def status_rows(capsys: pytest.CaptureFixture[str], jobs: Path) -> dict[str, dict[str, object]]:
    assert main(["status", "windowed", "--jobs", str(jobs), "--json"]) == 0
    return {row["deployment"]: row for row in json.loads(capsys.readouterr().out)}


def test_cluster_mode_on_yarn_with_checkpoints_on_hdfs(
    tmp_path: Path,
    hadoop_client: MiniHadoop,
    driver_env: str,
    s3_server: EmbeddedS3,
    s3_store: str,
    airflow_db: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hadoop = hadoop_client
    # YARN may restart the driver once here: the retry this test watches (the engine's default is one attempt)
    jobs = write_yarn_jobs_file(tmp_path, s3_store, hadoop, driver_env, s3_server.env(), attempts=2, java_options=JVM)
    job = Settings(jobs_file=str(jobs)).resolve().job("windowed")
    feed, output = Feeder(tmp_path / "input"), tmp_path / "output"

    # deploy: accepted by YARN, the application id recorded, the driver a process of the NodeManager's JVM
    v1 = deploy(job, DeployRequest("v1"))
    app_id = v1.launcher["app_id"]
    assert v1.checkpoint.startswith(f"{hadoop.hdfs_uri}/checkpoints/windowed/")
    assert hadoop.application(app_id)["state"] == "RUNNING"
    status = job.deployments.status("windowed", v1.id)
    assert status is not None and status.app_id == app_id and status.state is State.RUNNING
    driver = status.pid
    assert driver is not None and hadoop.pid in ancestors(driver)
    assert v1.launcher["pid"] not in ancestors(driver), "the driver is no child of spark-submit"
    container = Path(f"/proc/{driver}/cwd").resolve()
    assert Path(f"/proc/{driver}/cmdline").read_bytes().split(b"\0")[0] == b"./environment/bin/python"
    assert list((container / "environment/lib").glob("python3.*/site-packages/airflow_plugin/core/jobs/context.py"))

    # a live savepoint while the query commits batches (its checkpoint on HDFS, read over WebHDFS)
    feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to process its first round")
    for _ in range(3):
        feed.round()
    live = take_savepoint(job)
    assert live.status is SnapshotStatus.COMPLETED and live.deployment == v1.id and live.source == v1.checkpoint
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to process 3 more rounds")
    assert batches(v1.checkpoint, "commits")[-1] > live.batch_id, "the query committed on past the savepoint"
    assert main(["retain", "windowed", "--jobs", str(jobs)]) == 0  # a retained checkpoint of it too
    capsys.readouterr()
    [retained] = [m for m in job.store.list("windowed") if m.kind is Kind.CHECKPOINT]
    assert retained.status is SnapshotStatus.COMPLETED and retained.source == v1.checkpoint

    # the driver's container dies (SIGKILL of its process group, while a batch is in flight before its sink
    # commit): YARN's second attempt resumes the query from the deployment's checkpoint
    feed.round()
    sink_log = output / "_spark_metadata"

    def in_flight() -> bool:  # a batch planned whose sink commit has not happened
        planned, committed = batches(v1.checkpoint, "offsets"), batches(v1.checkpoint, "commits")
        written = sorted(int(p.name) for p in sink_log.iterdir() if p.name.isdigit())
        return bool(planned) and planned[-1] > committed[-1] and written[-1] < planned[-1]

    # Frozen first and looked at again: on a busy machine the sink could commit between a look and a kill, and a
    # second attempt would then find batch N in the sink's log (Spark's file sink skips it: its state is never
    # written). SIGSTOP holds the driver where it was seen.
    group, deadline = os.getpgid(driver), time.monotonic() + 60
    while time.monotonic() < deadline:
        if in_flight():
            os.killpg(group, signal.SIGSTOP)
            if in_flight():
                break
            os.killpg(group, signal.SIGCONT)
        time.sleep(0.02)
    os.killpg(group, signal.SIGKILL)
    wait_for(lambda: len(hadoop.attempts(app_id)) == 2, "YARN to start the driver's second attempt")
    for _ in range(2):
        feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "the second attempt to process the rounds")
    assert state_of(job, v1) is State.RUNNING
    assert job.deployments.status("windowed", v1.id).pid != driver

    # the upgrade to v2 through the upgrade DAG: stop/restore with its pre-flight, all on YARN and HDFS; once v2
    # runs, rounds keep coming whenever it has caught up (its health gate counts new batches)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection())
    # in Airflow the spark_default connection gives the master (docs/clusters.md): YARN, cluster mode
    spark_default = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(spark_default))
    monkeypatch.setenv(JOBS_ENV, str(jobs))  # the DAGs read this jobs file
    load_dags()  # before the feeding thread: Airflow's lazy imports
    with feeding_version(job, feed, "v2"):
        upgraded = run_dag("savepoints_upgrade", {"job": "windowed", "version": "v2", "mode": "stop_restore"})
    record = job_upgrades(job)[-1]
    assert upgraded.succeeded, f"{upgraded.tasks}: {record.phase} {record.error}"
    assert record.mode == "stop_restore" and record.to_version == "v2" and record.stop_savepoint is not None
    capsys.readouterr()  # what the DAG run logged
    rows = status_rows(capsys, jobs)
    v2 = job.deployments.list("windowed")[-1]
    assert rows[v1.id]["state"] == "STOPPED" and rows[v2.id]["state"] == "RUNNING" and v2.version == "v2"
    assert hadoop.application(app_id)["finalStatus"] == "SUCCEEDED"
    assert v2.checkpoint.startswith(f"{hadoop.hdfs_uri}/") and v2.launcher["app_id"] != app_id

    feed.round()
    feed.flush()
    wait_output_complete(output, feed.events)
    summary = summarize(read_output(output))
    assert summary.events == feed.events, "every event counted exactly once"
    assert summary.duplicates == [] and {"v1", "v2"} <= set(summary.versions)

    # someone kills the v2 application with YARN: the deployment is FAILED with YARN's word for it
    resource_manager().kill(v2.launcher["app_id"])
    row = status_rows(capsys, jobs)[v2.id]
    assert row["state"] == "FAILED"
    assert "YARN_KILLED" in str(row["error"]) and "killed by user" in str(row["error"])


AUTOSCALE = {
    "min": 1,
    "max": 2,  # the mini cluster's NodeManager holds two applications of a driver and two executors
    "window": 100,  # batches of 20 s and more (below): a window holds several
    "scale_down_window": 100,
    "cooldown": 10,
    "catch_up": 10,
    "restart_time": 30,
    "max_rescales_per_hour": 6,
}
LIGHT, HEAVY = 4.0, 80.0  # events a second: under what one executor's slot does (20 ms a row), and past it


@pytest.mark.slow(seconds=600)
@pytest.mark.timeout(1800)
def test_on_yarn_the_autoscaler_turns_executors_and_repartitions_the_state_once(
    tmp_path: Path,
    hadoop_client: MiniHadoop,
    driver_env: str,
    s3_server: EmbeddedS3,
    s3_store: str,
    kafka: EmbeddedKafka,
    new_topic: Callable[..., str],
) -> None:
    hadoop = hadoop_client
    topic = new_topic(partitions=TOPIC_PARTITIONS)
    jobs = write_autoscaled_jobs_file(
        tmp_path,
        s3_store,
        kafka.bootstrap,
        topic,
        master="yarn",
        table='deploy_mode = "cluster"',
        checkpoint_root=f"{hadoop.hdfs_uri}/checkpoints",
        conf=job_conf(driver_env, s3_server.env(), java_options=JVM),
        autoscale=AUTOSCALE,
        shuffle_partitions=1,
        # A batch on YARN costs 2 to 4 s here whatever its rows (12 tasks sent to the executors), which the
        # autoscaler counts as work that halves with twice the executors: judged against a 5 or 10 s trigger, one
        # executor looks too busy to scale down to (docs/operations.md, "The autoscaler", its limits). Against
        # 20 s it does; batches of up to 1,200 records keep the reads above the heavy feed's pace.
        trigger="20 seconds",
        max_offsets_per_trigger=1200,
    )
    ctx = Settings(jobs_file=str(jobs)).resolve().job(JOB)

    def story(rescale: Rescale) -> str:
        """What a failed assertion on a rescale shows: the rescale, its upgrade's history, and each deployment's
        last status with its YARN application's attempts."""
        upgrade = Upgrades(ctx.store.storage).get(JOB, str(rescale.upgrade))
        lines = [repr(rescale), f"{upgrade.phase} {upgrade.error}", *map(str, upgrade.history)]
        for deployment in ctx.deployments.list(JOB):
            status, app = ctx.deployments.status(JOB, deployment.id), deployment.launcher.get("app_id")
            attempts = [(a.get("id"), a.get("appAttemptState"), a.get("diagnostics")) for a in hadoop.attempts(app)]
            lines.append(f"{deployment.id} {deployment.created_at} {app} attempts {attempts}: {status}")
        return "\n".join(lines)

    def containers(deployment_id: str) -> int:
        """The containers YARN runs for the deployment's application: its driver and its executors."""
        return int(hadoop.application(ctx.deployments.get(JOB, deployment_id).launcher["app_id"])["runningContainers"])

    try:
        with RateFeeder(kafka, topic, rate=LIGHT) as feeder, ApplyLoop(jobs, log=tmp_path / "apply.log") as loop:
            wait_for(lambda: running_batches(ctx, 1), "the loop's first deployment to run on YARN", timeout=400)
            first, _ = status_of(ctx)
            assert first is not None and first.spark_conf["spark.executor.instances"] == "1", first
            assert first.checkpoint.startswith(f"{hadoop.hdfs_uri}/checkpoints/")
            assert containers(first.id) == 2, "a driver and one executor"

            # up: the feed rises past one executor; the loop rescales to 2 executors through stop/restore, the
            # state repartitioned from its 1 partition to 2; the feed falls back and the backlog is worked off
            feeder.rate = HEAVY
            wait_for(rescale_ended(ctx, 1), "a scale-up to end", timeout=900)
            feeder.rate = LIGHT
            [up] = reconciled(ctx).rescales
            assert (up.from_size, up.to_size, up.partitions, up.outcome) == (1, 2, 2, "DONE"), story(up)
            assert up.figures["utilization"] > 0.7 and up.figures["backlog_growth"] > 0, up.figures
            wait_for(lambda: caught_up(ctx), "the backlog back at its floor at 2 executors", timeout=600)
            scaled, _ = status_of(ctx)
            assert scaled is not None and scaled.id != first.id, scaled
            assert scaled.spark_conf["spark.executor.instances"] == "2", scaled.spark_conf
            assert containers(scaled.id) == 3, "a driver and two executors"
            assert pinned_partitions(ctx, scaled.checkpoint) == 2
            assert hadoop.application(first.launcher["app_id"])["finalStatus"] == "SUCCEEDED", "stopped, not killed"

            # down: after the quiet window, back to 1 executor, the state's 2 partitions kept
            wait_for(rescale_ended(ctx, 2), "a scale-down to end", timeout=900)
            feeder.check()
            down = reconciled(ctx).rescales[1]
            assert (down.from_size, down.to_size, down.partitions, down.outcome) == (2, 1, None, "DONE"), story(down)
            smaller, _ = status_of(ctx)
            assert smaller is not None and smaller.spark_conf["spark.executor.instances"] == "1", smaller
            wait_for(lambda: running_batches(ctx, 1), "the smaller size's batches", timeout=120)
            assert containers(smaller.id) == 2
            assert pinned_partitions(ctx, smaller.checkpoint) == 2
            # the apply that carried the scale-down out writes its outcome before it ends: its run is kept once it has
            wait_for(lambda: loop.carried_out("RESCALE") >= 2, "the scale-down's apply to end", timeout=120)
        assert all(run.returncode == 0 for run in loop.runs), [run.output for run in loop.runs if run.returncode]
        assert loop.carried_out("RESCALE") == 2, loop.actions()

        # every (user, window) once, with the events fed for it
        check_every_window_once(feeder, tmp_path / "output", timeout=300)
    finally:
        kill_every_deployment(ctx)
