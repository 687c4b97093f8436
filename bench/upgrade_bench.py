"""Upgrade downtime against a cold start, measured in the same run (`make bench-upgrade`).

    upgrade downtime   the old version's last committed batch -> the new version's first committed batch,
                       through stop-with-savepoint -> restore -> launch of the new version (what the
                       upgrade DAG's stop_old and deploy_new tasks do)
    cold start         the deploy call of a fresh deployment -> its first committed batch

Both use the windowed example job, real spark-submit drivers in local mode, the store on the embedded
S3 server, and events fed continuously. Times are commit files' mtimes (written by the drivers). The
runs alternate (cold, upgrade, cold, upgrade, ...) so that machine load affects both alike.
Target: median upgrade downtime <= 1.3x the median cold start."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

from airflow_plugin.core.deploy import DeployRequest, deploy
from airflow_plugin.core.deployments import Deployment
from airflow_plugin.core.jobs import JobSpec, get_job
from airflow_plugin.core.stop import stop
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.store import SnapshotStore
from bench.report import Results, Target, log, report
from devtools.embedded_s3 import EmbeddedS3
from devtools.java import require_java
from devtools.scenario import BackgroundFeeder
from devtools.windowed import Feeder, batches, wait_for, write_jobs_file

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "upgrade-run"
RESULTS = ROOT / ".bench" / "upgrade.json"
PAIRS = int(os.environ.get("UPGRADE_BENCH_PAIRS", "3"))
WARM_BATCHES = 3  # batches the old version commits before the upgrade
RATIO_LIMIT = 1.3


def commit_time(checkpoint: str, batch: int) -> float:
    return (Path(checkpoint) / "commits" / str(batch)).stat().st_mtime


def first_commit(deployment: Deployment, timeout: float = 180) -> float:
    wait_for(lambda: bool(batches(deployment.checkpoint, "commits")), f"the first commit of {deployment.id}", timeout)
    return commit_time(deployment.checkpoint, batches(deployment.checkpoint, "commits")[0])


def setup(run: str, s3: EmbeddedS3) -> tuple[JobSpec, SnapshotStore, Feeder]:
    """A fresh directory, input, output and store prefix per measurement: no run sees another's state."""
    directory = WORK / run
    directory.mkdir(parents=True)
    store_uri = f"s3://bench-upgrade/{run}"
    job = get_job("windowed", str(write_jobs_file(directory, store_uri)))
    feeder = Feeder(directory / "input", events_per_round=200)
    feeder.round()
    return job, SnapshotStore(open_storage(store_uri)), feeder


def cold_start(run: str, s3: EmbeddedS3) -> float:
    job, store, feeder = setup(run, s3)
    with BackgroundFeeder(feeder, interval=1.0):
        started = time.time()
        deployment = deploy(DeployRequest(job, "v1"), store)
        seconds = first_commit(deployment) - started
        stop(job, store)
    return seconds


def upgrade(run: str, s3: EmbeddedS3) -> tuple[float, dict[str, float]]:
    job, store, feeder = setup(run, s3)
    with BackgroundFeeder(feeder, interval=1.0):
        old = deploy(DeployRequest(job, "v1"), store)
        wait_for(lambda: len(batches(old.checkpoint, "commits")) >= WARM_BATCHES, "the old version to warm up")
        stopping = time.time()
        savepoint = stop(job, store, savepoint=True).snapshot
        assert savepoint is not None
        stopped = time.time()
        new = deploy(DeployRequest(job, "v2", restore=savepoint.id), store)
        launched = time.time()
        first_new = first_commit(new)
        last_old = commit_time(old.checkpoint, batches(old.checkpoint, "commits")[-1])
        stop(job, store)
    phases = {"stop+savepoint": stopped - stopping, "restore+launch+start": launched - stopped}
    phases["first batch"] = first_new - launched
    return first_new - last_old, phases


def main() -> int:
    require_java()
    shutil.rmtree(WORK, ignore_errors=True)
    results = Results()
    colds: list[float] = []
    downtimes: list[float] = []
    phase_samples: dict[str, list[float]] = {}
    with EmbeddedS3() as s3:
        s3.apply_env()
        s3.create_bucket("bench-upgrade")
        for pair in range(PAIRS):
            colds.append(cold_start(f"cold-{pair}", s3))
            log(f"cold start {pair + 1}/{PAIRS}: {colds[-1]:.2f} s to the first committed batch")
            downtime, phases = upgrade(f"upgrade-{pair}", s3)
            downtimes.append(downtime)
            for name, value in phases.items():
                phase_samples.setdefault(name, []).append(value)
            detail = ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
            log(f"upgrade {pair + 1}/{PAIRS}: {downtime:.2f} s downtime ({detail})")
    cold, down = statistics.median(colds), statistics.median(downtimes)
    results.row("cold start", "fresh deploy -> first committed batch (median)", f"{cold:.2f} s  (runs: {_list(colds)})")
    results.row(
        "upgrade", "old's last commit -> new's first commit (median)", f"{down:.2f} s  (runs: {_list(downtimes)})"
    )
    for name, values in phase_samples.items():
        results.row("upgrade", f"  {name} (median)", f"{statistics.median(values):.2f} s")
    results.targets.append(
        Target("upgrade downtime / cold start", down / cold, RATIO_LIMIT, "x", f"{down:.2f} s vs {cold:.2f} s")
    )
    results.data = {"cold_start_s": colds, "upgrade_downtime_s": downtimes, "phases_s": phase_samples}
    report(results, RESULTS)
    return 0 if all(t.passed for t in results.targets) else 1


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
