"""The job lifecycle end to end, through real spark-submit processes and the moto server as store:
deploy v1, feed rounds, stop-with-savepoint, deploy v2 from it, SIGKILL the v2 driver in the middle of
a batch, deploy again from the latest state, feed more, stop. Every event is counted exactly once, batch
ids keep increasing across deployments, and v3 (state-incompatible) fails with Spark's error class."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_plugin.core.deploy import DeployRequest, deploy
from airflow_plugin.core.deployments import Deployment, Deployments, State
from airflow_plugin.core.jobs import JobSpec, get_job
from airflow_plugin.core.launcher import LaunchFailed, alive
from airflow_plugin.core.stop import stop
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.store import SnapshotStore
from spark_jobs.generate import write_flush, write_round
from spark_jobs.jobs.windowed.output import read_output, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
EVENTS_PER_ROUND = 300


def jobs_file(tmp_path: Path, store: str) -> Path:
    apps = REPO / "spark_jobs/jobs/windowed"
    path = tmp_path / "jobs.toml"
    path.write_text(
        f"""
[defaults]
store = "{store}"
checkpoint_root = "checkpoints"
log_dir = "logs"
heartbeat_timeout = 30

[jobs.windowed]
trigger_interval = "1 second"
args = ["--input", "input", "--output", "output"]
conf = {{ "spark.sql.shuffle.partitions" = "3", "spark.ui.enabled" = "false", "spark.driver.host" = "127.0.0.1" }}
versions.v1 = {{ application = "{apps}/v1.py" }}
versions.v2 = {{ application = "{apps}/v2.py" }}
versions.v3 = {{ application = "{apps}/v3.py" }}
"""
    )
    return path


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def batches(checkpoint: str, log: str) -> list[int]:
    directory = Path(checkpoint) / log
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def processed(checkpoint: str, files_fed: int) -> bool:
    """The latest committed batch has read the `files_fed`-th input file (file source logOffset)."""
    commits = batches(checkpoint, "commits")
    if not commits:
        return False
    lines = (Path(checkpoint) / "offsets" / str(commits[-1])).read_text().splitlines()
    return json.loads(lines[2]).get("logOffset", -1) >= files_fed - 1


class Feeder:
    def __init__(self, input_dir: Path) -> None:
        self.input_dir, self.rounds, self.events = input_dir, 0, 0
        input_dir.mkdir(parents=True, exist_ok=True)

    def round(self) -> None:
        self.events += write_round(self.input_dir, self.rounds, EVENTS_PER_ROUND).events
        self.rounds += 1

    def flush(self) -> None:
        write_flush(self.input_dir, self.rounds)
        self.rounds += 1


def wait_output_complete(output: Path, events: int) -> None:
    """After the flush marker, the windows close in the no-data batch that follows its batch."""
    wait_for(lambda: summarize(read_output(output)).events >= events, "the last windows to be emitted")


def status_state(store: SnapshotStore, deployment: Deployment) -> State | None:
    status = Deployments(store.storage).status(deployment.job, deployment.id)
    return status.state if status else None


def test_upgrade_crash_and_restore_count_every_event_exactly_once(tmp_path: Path, s3_store: str) -> None:
    job: JobSpec = get_job("windowed", str(jobs_file(tmp_path, s3_store)))
    store = SnapshotStore(open_storage(job.store))
    feed = Feeder(tmp_path / "input")

    v1 = deploy(DeployRequest(job, "v1"), store)
    for _ in range(3):
        feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to process 3 rounds")
    savepoint = stop(job, store, savepoint=True).snapshot
    assert savepoint is not None and savepoint.deployment == v1.id

    v2 = deploy(DeployRequest(job, "v2", restore=savepoint.id), store)
    assert v2.restored_from == savepoint.id
    for _ in range(2):
        feed.round()
    wait_for(lambda: processed(v2.checkpoint, feed.rounds), "v2 to process 2 more rounds")

    # SIGKILL the v2 driver while a batch is in flight (offsets written, commit not yet)
    for _ in range(10):
        feed.round()
        caught = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not processed(v2.checkpoint, feed.rounds):
            if batches(v2.checkpoint, "offsets")[-1:] > batches(v2.checkpoint, "commits")[-1:]:
                os.killpg(v2.launcher["pid"], signal.SIGKILL)
                caught = True
                break
            time.sleep(0.005)
        if caught:
            break
    else:
        pytest.fail("never caught v2 in the middle of a batch")
    wait_for(lambda: not alive(v2.launcher), "the killed driver to be gone", timeout=30)
    assert batches(v2.checkpoint, "offsets")[-1] > batches(v2.checkpoint, "commits")[-1]

    v2b = deploy(DeployRequest(job, "v2", restore="latest-state"), store)
    restored_from = store.get(job.name, v2b.restored_from)
    assert restored_from.deployment == v2.id and restored_from.pending_batch_id is not None
    feed.round()
    feed.flush()
    wait_for(lambda: processed(v2b.checkpoint, feed.rounds), "the last deployment to process everything")
    wait_output_complete(tmp_path / "output", feed.events)
    final = stop(job, store, savepoint=True)

    summary = summarize(read_output(tmp_path / "output"))
    assert summary.events == feed.events, "every event counted exactly once"
    assert summary.duplicates == []
    maxima = [batches(d.checkpoint, "commits")[-1] for d in (v1, v2, v2b)]
    firsts = [
        min(set(batches(d.checkpoint, "commits")) - set(batches(p.checkpoint, "commits")))
        for p, d in ((v1, v2), (v2, v2b))
    ]
    assert maxima == sorted(maxima) and firsts[0] > maxima[0] and firsts[1] > savepoint.batch_id

    # v3 groups by country too: Spark refuses the old state on its first batch with new data
    feed.round()
    try:
        v3 = deploy(DeployRequest(job, "v3", restore=final.snapshot.id), store)
    except LaunchFailed as exc:
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in str(exc)
        v3 = Deployments(store.storage).list(job.name)[-1]
    wait_for(lambda: status_state(store, v3) is State.FAILED, "v3 to fail")
    status = Deployments(store.storage).status(job.name, v3.id)
    assert status.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", status
