"""The job lifecycle end to end, through real spark-submit processes and the moto server as store:
deploy v1, feed rounds, stop-with-savepoint, deploy v2 from it, SIGKILL the v2 driver in the middle of
a batch, deploy again from the latest state, feed more, stop. Every event is counted exactly once, batch
ids keep increasing across deployments, and v3 (state-incompatible) fails with Spark's error class."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from airflow_plugin.core.context import Settings
from airflow_plugin.core.errors import LaunchFailed
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployment, Deployments, State
from airflow_plugin.core.jobs.launcher import alive
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.snapshots.store import SnapshotStore
from devtools.windowed import Feeder, batches, processed, wait_for, wait_output_complete, write_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def status_state(store: SnapshotStore, deployment: Deployment) -> State | None:
    status = Deployments(store.storage).status(deployment.job, deployment.id)
    return status.state if status else None


def test_upgrade_crash_and_restore_count_every_event_exactly_once(tmp_path: Path, s3_store: str) -> None:
    job = Settings(jobs_file=str(write_jobs_file(tmp_path, s3_store))).resolve().job("windowed")
    store = job.store
    feed = Feeder(tmp_path / "input")

    v1 = deploy(job, DeployRequest("v1"))
    for _ in range(3):
        feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to process 3 rounds")
    savepoint = stop(job, savepoint=True).snapshot
    assert savepoint is not None and savepoint.deployment == v1.id

    v2 = deploy(job, DeployRequest("v2", restore=savepoint.id))
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

    v2b = deploy(job, DeployRequest("v2", restore="latest-state"))
    restored_from = store.get(job.name, v2b.restored_from)
    assert restored_from.deployment == v2.id and restored_from.pending_batch_id is not None
    feed.round()
    feed.flush()
    wait_for(lambda: processed(v2b.checkpoint, feed.rounds), "the last deployment to process everything")
    wait_output_complete(tmp_path / "output", feed.events)
    final = stop(job, savepoint=True)

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
        v3 = deploy(job, DeployRequest("v3", restore=final.snapshot.id))
    except LaunchFailed as exc:
        assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in str(exc)
        v3 = Deployments(store.storage).list(job.name)[-1]
    wait_for(lambda: status_state(store, v3) is State.FAILED, "v3 to fail")
    status = Deployments(store.storage).status(job.name, v3.id)
    assert status.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", status
