"""The job lifecycle end to end, through real spark-submit processes and the moto server as store:
deploy v1, feed rounds, upgrade to v2 with `savepoints upgrade` (stop/restore: the file sink's mode), SIGKILL
the v2 driver in the middle of
a batch, deploy again from the latest state, feed more, stop. Every event is counted exactly once, batch
ids keep increasing across deployments, and v3 (state-incompatible) fails with Spark's error class. Then
fresh starts onto that output: refused (exit 4, nothing written) before launching, or by the driver of a
version that never ran; with --rewind-sink every event once again; and a deployment whose sink skips its
batches reads UNHEALTHY with the reason."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.errors import LaunchFailed
from airflow_plugin.core.guards.sink import SINK_AHEAD
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.health import Verdict, check_health
from airflow_plugin.core.jobs.launcher import process_seen
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.process import Liveness
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.sinks.file import LOG_DIR, QUARANTINE
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.upgrades.record import Phase, Upgrades
from devtools.feeding import BackgroundFeeder
from devtools.windowed import Feeder, batches, processed, wait_for, wait_output_complete, write_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize
from tests.support.synthetic import tree

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def status_state(store: SnapshotStore, deployment: Deployment) -> State | None:
    status = Deployments(store.storage).status(deployment.job, deployment.id)
    return status.state if status else None


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()  # what earlier commands printed
    assert main([*argv, "--json"]) == 0
    return capsys.readouterr().out


def test_upgrade_crash_and_restore_count_every_event_exactly_once(
    tmp_path: Path, s3_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = Settings(jobs_file=str(write_jobs_file(tmp_path, s3_store))).resolve().job("windowed")
    store = job.store
    feed = Feeder(tmp_path / "input")

    v1 = deploy(job, DeployRequest("v1"))
    for _ in range(3):
        feed.round()
    wait_for(lambda: processed(v1.checkpoint, feed.rounds), "v1 to process 3 rounds")

    # the upgrade from the command line: a file sink takes one writer, so the pre-flight picks stop/restore
    jobs = str(tmp_path / "jobs.toml")
    with BackgroundFeeder(feed, interval=1.0):  # the health gate after the cutover needs new batches
        assert main(["upgrade", "windowed", "--version", "v2", "--jobs", jobs]) == 0
    [upgrade] = Upgrades(store.storage).list("windowed")
    assert upgrade.phase is Phase.DONE and upgrade.mode == "stop_restore", upgrade
    assert "its sink is FileSink" in upgrade.modes["blue_green"], upgrade.modes
    savepoint = store.get(job.name, str(upgrade.stop_savepoint))
    assert savepoint.deployment == v1.id
    v2 = Deployments(store.storage).get(job.name, str(upgrade.new_deployment))
    assert v2.restored_from == savepoint.id and v2.version == "v2"
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
    wait_for(lambda: process_seen(v2.launcher) is Liveness.GONE, "the killed driver to be gone", timeout=30)
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

    # A fresh start onto the output those deployments wrote would skip every batch it holds (every record lost):
    # refused before anything is launched for the build that wrote it, by the driver for one that never ran
    output = tmp_path / "output"
    records, before = Deployments(store.storage), tree(tmp_path / "output")
    deployed = len(records.list(job.name))
    assert main(["deploy", "windowed", "--version", "v2", "--restore", "none", "--jobs", jobs]) == 4
    assert "has committed batches up to" in capsys.readouterr().err
    assert len(records.list(job.name)) == deployed and tree(output) == before
    assert main(["deploy", "windowed", "--version", "regrouped", "--restore", "none", "--jobs", jobs]) == 4
    assert "refused by its sink guard" in capsys.readouterr().err and tree(output) == before
    refused = records.list(job.name)[-1]
    assert records.status(job.name, refused.id).error_class == SINK_AHEAD
    assert not job.open(refused.checkpoint).exists(), "its query never started: nothing written"

    # with --rewind-sink the output moves aside whole and the fresh deployment writes every event once again;
    # v3's round, after the flush marker, now counts too: its file follows the marker's in the very next batch,
    # where Spark still takes it (the watermark for late rows is the previous batch's)
    assert main(["deploy", "windowed", "--version", "v2", "--restore", "none", "--rewind-sink", "--jobs", jobs]) == 0
    again = records.list(job.name)[-1]
    wait_output_complete(output, feed.events)
    summary = summarize(read_output(output))
    assert summary.events == feed.events and summary.duplicates == [] and set(summary.versions) == {"v2"}
    assert len(list((output / QUARANTINE).glob("*-fresh-*/rewind.json"))) == 1

    # a deployment whose sink skips its batches (someone wrote them meanwhile) is unhealthy, with the reason
    last = batches(again.checkpoint, "commits")[-1]
    for batch in range(last + 1, last + 8):
        (output / LOG_DIR / str(batch)).write_text("v1\n")
    for _ in range(3):
        feed.round()
    wait_for(
        lambda: (records.status(job.name, again.id) or DeploymentStatus(State.STARTING, 0)).skipping() is not None,
        "the skipped batches to show",
        timeout=60,
    )
    health = check_health(job, again.id, min_batches=1)
    assert health.verdict is Verdict.UNHEALTHY and "commits batches it does not run" in health.reason
    [row] = [
        r for r in json.loads(cli_json(capsys, "status", "windowed", "--jobs", jobs)) if r["deployment"] == again.id
    ]
    assert "skipped them as already written" in row["unhealthy"]
    stop(job)
