"""A real distributed engine: a Spark standalone master and worker on 127.0.0.1, the example job
submitted to spark://127.0.0.1:<port> in client mode (standalone has no cluster mode for Python) with
its executors on the worker; stop-with-savepoint and restore work the same as in local mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.stop import stop
from devtools.standalone import StandaloneCluster
from devtools.windowed import Feeder, processed, wait_for, wait_output_complete
from spark_jobs.jobs.windowed.output import read_output, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_savepoint_and_restore_on_a_standalone_cluster(tmp_path: Path, s3_store: str) -> None:
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        apps = REPO / "spark_jobs/jobs/windowed"
        (tmp_path / "jobs.toml").write_text(
            f"""
[jobs.windowed]
store = "{s3_store}"
checkpoint_root = "checkpoints"
log_dir = "logs"
spark_master = "{cluster.master_url}"
deploy_mode = "client"
trigger_interval = "1 second"
args = ["--input", "input", "--output", "output"]
versions.v1 = {{ application = "{apps}/v1.py" }}

[jobs.windowed.conf]
"spark.sql.shuffle.partitions" = "2"
"spark.ui.enabled" = "false"
"spark.driver.host" = "127.0.0.1"
"spark.cores.max" = "1"
"spark.executor.memory" = "512m"
"spark.pyspark.python" = "{sys.executable}"
"""
        )
        job = Settings(jobs_file=str(tmp_path / "jobs.toml")).resolve().job("windowed")
        feed = Feeder(tmp_path / "input")

        first = deploy(job, DeployRequest("v1"))
        assert first.launcher["master"] == cluster.master_url
        feed.round()
        feed.round()
        wait_for(lambda: processed(first.checkpoint, feed.rounds), "the first deployment to process 2 rounds")
        savepoint = stop(job, savepoint=True).snapshot

        second = deploy(job, DeployRequest("v1", restore="latest-savepoint"))
        assert second.restored_from == savepoint.id
        feed.round()
        feed.flush()
        wait_for(lambda: processed(second.checkpoint, feed.rounds), "the restored deployment to catch up")
        wait_output_complete(tmp_path / "output", feed.events)
        stop(job)

        summary = summarize(read_output(tmp_path / "output"))
        assert summary.events == feed.events and summary.duplicates == []
        # both applications ran their executors on the worker
        state = cluster.state()
        apps_run = [app["id"] for app in state.get("completedapps", []) + state.get("activeapps", [])]
        assert len(apps_run) >= 2
        assert all((tmp_path / "cluster/work" / app).is_dir() for app in apps_run)
