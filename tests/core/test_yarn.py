"""What the engine asks YARN and how it reads the answer: the Hadoop client configuration (where the
ResourceManager and the NameNodes answer), a deployment whose driver YARN ended (FAILED with YARN's
diagnostics, decided by a pure function), `savepoints kill` through the ResourceManager, and a driver whose
container dies. The cluster tests use applications that only sleep (tests/support/yarn_apps.py): the engine sees
nothing but the application id, as for a Spark driver (tests/e2e/test_yarn_e2e.py runs real ones)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core import hadoop_conf, layout
from airflow_plugin.core.errors import InvalidInput
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deployments import Deployments, ended_by_cluster
from airflow_plugin.core.jobs.health import Verdict, check_health
from airflow_plugin.core.jobs.launcher import SubmitSpec, default_command
from airflow_plugin.core.jobs.yarn import AppReport
from airflow_plugin.core.records.deployment import JVM_GONE, Deployment, DeploymentStatus, State, read_status
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.timestamps import utc_stamp
from devtools.hadoop import MiniHadoop
from devtools.windowed import wait_for
from tests.support.yarn_apps import container_processes, submit_queued, submit_sleeper


def write_conf(directory: Path, name: str, values: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    entries = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in values.items())
    (directory / name).write_text(f"<configuration>{entries}</configuration>")


def test_hadoop_conf_names_namenodes_and_resource_managers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "conf"
    write_conf(conf_dir, "core-site.xml", {"fs.defaultFS": "hdfs://nn1.example:8020"})
    write_conf(
        conf_dir,
        "hdfs-site.xml",
        {
            "dfs.namenode.http-address": "0.0.0.0:50070",
            "dfs.nameservices": "lake",
            "dfs.ha.namenodes.lake": "a,b",
            "dfs.namenode.http-address.lake.a": "nn-a.example:9870",
            "dfs.namenode.http-address.lake.b": "nn-b.example:9870",
        },
    )
    write_conf(
        conf_dir,
        "yarn-site.xml",
        {
            "yarn.resourcemanager.ha.enabled": "true",
            "yarn.resourcemanager.ha.rm-ids": "rm1,rm2",
            "yarn.resourcemanager.webapp.address.rm1": "rm1.example:8088",
            "yarn.resourcemanager.hostname.rm2": "rm2.example",
        },
    )
    monkeypatch.setenv("HADOOP_CONF_DIR", str(conf_dir))
    monkeypatch.setenv("HADOOP_USER_NAME", "etl")
    conf = hadoop_conf.load()
    assert conf.namenode_http_addresses("lake") == ["nn-a.example:9870", "nn-b.example:9870"]
    assert conf.namenode_http_addresses("nn1.example:8020") == ["nn1.example:50070"]  # the default FS's NameNode
    assert conf.namenode_http_addresses("other.example:8020") == ["other.example:9870"]  # Hadoop's default port
    assert conf.resource_manager_urls() == ["http://rm1.example:8088", "http://rm2.example:8088"]
    assert conf.user == "etl"

    write_conf(conf_dir / "secure", "core-site.xml", {"hadoop.security.authentication": "kerberos"})
    monkeypatch.setenv("HADOOP_CONF_DIR", str(conf_dir / "secure"))
    with pytest.raises(InvalidInput, match="uses Kerberos"):
        open_storage("hdfs://lake/checkpoints")


def test_a_driver_yarn_ended_while_its_heartbeat_says_running_is_failed_with_yarns_diagnostics() -> None:
    running = DeploymentStatus(State.RUNNING, time.time(), last_batch_id=7, handled_requests=["rq-1"])
    killed = AppReport("application_1_0001", "KILLED", "KILLED", "Application killed by user root", "http://nm/logs")
    ended = ended_by_cluster(running, killed)
    assert ended is not None and ended.state is State.FAILED and ended.error_class == "YARN_KILLED"
    assert "killed by user root" in (ended.error_message or "") and "http://nm/logs" in (ended.error_message or "")
    assert ended.last_batch_id == 7 and ended.handled_requests == ["rq-1"]
    assert ended_by_cluster(None, killed) is not None, "a driver that never wrote a heartbeat"
    assert ended_by_cluster(running, AppReport("application_1_0001", "RUNNING", "UNDEFINED")) is None
    stopped = DeploymentStatus(State.STOPPED, time.time())  # a clean stop: the driver's last word stands
    assert ended_by_cluster(stopped, AppReport("application_1_0001", "FINISHED", "SUCCEEDED")) is None
    assert ended_by_cluster(running, None) is None
    # a driver whose JVM the kill took first wrote only that: YARN's word replaces it
    gone = DeploymentStatus(State.FAILED, time.time(), last_batch_id=7, error_class=JVM_GONE, error_message="gone")
    ended = ended_by_cluster(gone, killed)
    assert ended is not None and ended.error_class == "YARN_KILLED" and ended.last_batch_id == 7
    failed = DeploymentStatus(State.FAILED, time.time(), error_class="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE")
    assert ended_by_cluster(failed, AppReport("application_1_0001", "FAILED", "FAILED")) is None, "its own word"
    gated = DeploymentStatus(State.RUNNING, time.time(), gate={"role": "green"}, answers={"rq-2": "accepted"})
    ended = ended_by_cluster(gated, killed)
    assert ended is not None and ended.gate == {"role": "green"} and ended.answers == {"rq-2": "accepted"}


def test_yarn_cluster_mode_gets_one_attempt_unless_the_job_asks_for_more() -> None:
    def command(conf: dict[str, str]) -> list[str]:
        return default_command(SubmitSpec("app.py", [], master="yarn", deploy_mode="cluster", conf=conf))

    assert "spark.yarn.maxAppAttempts=1" in command({})
    assert "spark.yarn.submit.waitAppCompletion=false" in command({})
    assert "spark.yarn.maxAppAttempts=2" in command({"spark.yarn.maxAppAttempts": "2"})
    assert not any("maxAppAttempts" in part for part in default_command(SubmitSpec("app.py", [], master="yarn")))


def managed(tmp_path: Path, hadoop: MiniHadoop, app_id: str) -> tuple[Path, Deployment, Deployments]:
    """A jobs file and a deployment of it whose driver is YARN application `app_id`, heartbeat RUNNING."""
    jobs = tmp_path / "jobs.toml"
    (tmp_path / "app.py").write_text("")
    jobs.write_text(
        f"""
[jobs.streaming]
store = "{tmp_path / "store"}"
checkpoint_root = "{hadoop.hdfs_uri}/checkpoints"
spark_master = "yarn"
deploy_mode = "cluster"
versions.v1 = {{ application = "app.py" }}
"""
    )
    deployment = Deployment(
        f"dp-{app_id[-4:]}",
        "streaming",
        "v1",
        f"{hadoop.hdfs_uri}/checkpoints/streaming/dp",
        launcher={"mode": "cluster", "master": "yarn", "deploy_mode": "cluster", "app_id": app_id},
    )
    records = Deployments(open_storage(str(tmp_path / "store")))
    records.put(deployment)
    records.write_status("streaming", deployment.id, DeploymentStatus(State.RUNNING, time.time(), app_id=app_id))
    return jobs, deployment, records


def running_sleeper(
    tmp_path: Path, hadoop: MiniHadoop, seconds: int
) -> tuple[str, tuple[Path, Deployment, Deployments]]:
    """A sleeping application whose container runs (`sleep <seconds>`: a number unique to the test), managed."""
    app_id = submit_sleeper(hadoop, seconds)
    wait_for(lambda: container_processes(hadoop, ["sleep", str(seconds)]) != [], "the container to run", timeout=60)
    return app_id, managed(tmp_path, hadoop, app_id)


def status_row(capsys: pytest.CaptureFixture[str], jobs: Path, deployment: Deployment) -> dict[str, object]:
    assert main(["status", "streaming", "--jobs", str(jobs), "--json"]) == 0
    return next(row for row in json.loads(capsys.readouterr().out) if row["deployment"] == deployment.id)


def test_kill_goes_through_the_resource_manager(
    tmp_path: Path, hadoop_client: MiniHadoop, capsys: pytest.CaptureFixture[str]
) -> None:
    app_id, (jobs, deployment, records) = running_sleeper(tmp_path, hadoop_client, 611)

    assert main(["kill", "streaming", "--jobs", str(jobs)]) == 0
    capsys.readouterr()
    assert hadoop_client.application(app_id)["state"] == "KILLED"
    wait_for(lambda: container_processes(hadoop_client, ["sleep", "611"]) == [], "YARN to end the container")
    status = records.status("streaming", deployment.id)
    assert status is not None and status.state is State.FAILED and status.error_class == "KILLED"
    assert status_row(capsys, jobs, deployment)["state"] == "FAILED"


def test_a_driver_whose_container_dies_is_seen_failed_with_yarns_diagnostics(
    tmp_path: Path, hadoop_client: MiniHadoop, capsys: pytest.CaptureFixture[str]
) -> None:
    app_id, (jobs, deployment, records) = running_sleeper(tmp_path, hadoop_client, 612)
    assert status_row(capsys, jobs, deployment)["state"] == "RUNNING"  # YARN runs it: the heartbeat stands

    [sleeper] = container_processes(hadoop_client, ["sleep", "612"])
    os.kill(sleeper, signal.SIGKILL)
    wait_for(lambda: hadoop_client.application(app_id)["state"] == "FAILED", "YARN to fail the application")
    # the heartbeat is still fresh: only YARN knows (asked at most every 2 s, so a status may lag that much)
    wait_for(lambda: status_row(capsys, jobs, deployment)["state"] == "FAILED", "status to show FAILED", timeout=30)
    row = status_row(capsys, jobs, deployment)
    assert "YARN_FAILED" in str(row["error"]) and "exitCode: 137" in str(row["error"]), row
    recorded = records.status("streaming", deployment.id)
    assert recorded is not None and recorded.error_class == "YARN_FAILED", "recorded once, for every later reader"


def test_a_driver_that_saw_its_jvm_go_is_recorded_with_yarns_word_unless_it_was_retired(
    tmp_path: Path, hadoop_client: MiniHadoop, capsys: pytest.CaptureFixture[str]
) -> None:
    """A YARN kill signals the driver's JVM and its Python process at once: Python may still write FAILED with
    DRIVER_JVM_GONE, which says nothing of why. YARN's word replaces it, the rest of the status kept (a green's
    gate: a restart from its state reads it). A retired deployment's final word stands: nobody asks YARN again."""
    app_id, (jobs, deployment, records) = running_sleeper(tmp_path, hadoop_client, 613)
    gate = {"column": "window_end", "role": "green", "after": "2025-01-01T04:58:00Z"}
    gone = DeploymentStatus(
        State.FAILED, time.time(), last_batch_id=9, gate=gate, error_class=JVM_GONE, error_message="gone"
    )
    records.write_status("streaming", deployment.id, gone)
    [sleeper] = container_processes(hadoop_client, ["sleep", "613"])
    os.kill(sleeper, signal.SIGKILL)
    wait_for(lambda: hadoop_client.application(app_id)["state"] == "FAILED", "YARN to fail the application")
    wait_for(lambda: "YARN_FAILED" in str(status_row(capsys, jobs, deployment)["error"]), "YARN's word", timeout=30)
    recorded = records.status("streaming", deployment.id)
    assert recorded is not None and recorded.state is State.FAILED and recorded.error_class == "YARN_FAILED"
    assert recorded.gate == gate and recorded.last_batch_id == 9, "the rest of the driver's last status is kept"

    records.write_status("streaming", deployment.id, gone)
    deployment.retired_at = utc_stamp(time.time())
    records.put(deployment)
    status_row(capsys, jobs, deployment)
    again = read_status(records.storage, "streaming", deployment.id)
    assert again is not None and again.error_class == JVM_GONE, "a retired deployment's final word stands"


def test_a_driver_yarn_has_not_started_yet_reads_starting_however_long_it_waits(
    tmp_path: Path, hadoop_client: MiniHadoop, capsys: pytest.CaptureFixture[str]
) -> None:
    """No heartbeat a minute after its launch reads LOST, unless YARN says the application is still queued (no
    container for its driver yet): then it is STARTING. LOST had a retried pre-start launch a second driver."""
    app_id = submit_queued(hadoop_client)
    wait_for(lambda: hadoop_client.application(app_id)["state"] == "ACCEPTED", "YARN to accept the application")
    jobs, deployment, records = managed(tmp_path, hadoop_client, app_id)
    records.storage.delete([layout.status_key("streaming", deployment.id)])  # its driver never ran
    deployment.created_at = utc_stamp(time.time() - 120)  # launched two minutes ago, never heard of since
    records.put(deployment)
    assert records.status("streaming", deployment.id) is None
    assert status_row(capsys, jobs, deployment)["state"] == "STARTING"
    ctx = Settings(jobs_file=str(jobs)).resolve().job("streaming")
    assert check_health(ctx, deployment.id, min_batches=1).verdict is Verdict.WAITING  # an upgrade's gate waits

    assert main(["kill", "streaming", "--jobs", str(jobs)]) == 0  # through the ResourceManager
    capsys.readouterr()
    assert hadoop_client.application(app_id)["state"] == "KILLED"
    assert status_row(capsys, jobs, deployment)["state"] == "FAILED"
