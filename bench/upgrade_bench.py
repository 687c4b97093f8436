"""Upgrade downtime against a cold start, measured in the same run (`make bench-upgrade`).

    upgrade downtime   the old version's last committed batch -> the new version's first committed batch:
      pre-started      (what the upgrade DAG does) a live savepoint; the new driver is launched and waits
                       in STANDBY with that savepoint restored into its location; stop-with-savepoint ->
                       restore of what changed since into it -> start
      cold             stop-with-savepoint -> restore -> launch of the new driver (the CLI's way)
    cold start         the deploy call of a fresh deployment -> its first committed batch

Both use the windowed example job, at the example jobs file's 3 state partitions and at Spark's default
200 (UPGRADE_BENCH_PARTITIONS="3 200"), real spark-submit drivers in local mode, the store on the embedded
S3 server, and events fed continuously. Times are commit files' mtimes (written by the drivers). The
runs alternate (cold start, pre-started upgrade, cold upgrade, ...) so that machine load affects all
alike. Targets: median upgrade downtime (pre-started, the DAG's way) <= 0.2x the median cold start at 3
partitions, <= 0.5x at 200."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

from airflow_plugin.core.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, activate, deploy, prestart
from airflow_plugin.core.jobs.deployments import Deployment
from airflow_plugin.core.jobs.savepoint import take_savepoint
from airflow_plugin.core.jobs.stop import stop
from bench.report import Results, Target, log, report
from devtools.embedded_s3 import EmbeddedS3
from devtools.feeding import BackgroundFeeder
from devtools.java import require_java
from devtools.windowed import Feeder, batches, wait_for, write_jobs_file

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "upgrade-run"
RESULTS = ROOT / ".bench" / "upgrade.json"
PAIRS = int(os.environ.get("UPGRADE_BENCH_PAIRS", "3"))
PARTITIONS = [int(n) for n in os.environ.get("UPGRADE_BENCH_PARTITIONS", "3 200").split()]
WARM_BATCHES = 3  # batches the old version commits before the upgrade
RATIO_LIMITS = {3: 0.2, 200: 0.5}


def commit_time(checkpoint: str, batch: int) -> float:
    return (Path(checkpoint) / "commits" / str(batch)).stat().st_mtime


def first_commit(deployment: Deployment, timeout: float = 180) -> float:
    """When the deployment committed its first own batch (a restored checkpoint holds the snapshot's)."""
    after = deployment.restored_batch_id if deployment.restored_batch_id is not None else -1

    def own() -> list[int]:
        return [b for b in batches(deployment.checkpoint, "commits") if b > after]

    wait_for(lambda: bool(own()), f"the first commit of {deployment.id}", timeout)
    return commit_time(deployment.checkpoint, own()[0])


def setup(run: str, partitions: int) -> tuple[JobContext, Feeder]:
    """A fresh directory, input, output and store prefix per measurement: no run sees another's state."""
    directory = WORK / run
    directory.mkdir(parents=True)
    jobs_file = write_jobs_file(directory, f"s3://bench-upgrade/{run}", partitions=partitions)
    job = Settings(jobs_file=str(jobs_file)).resolve().job("windowed")
    feeder = Feeder(directory / "input", events_per_round=200)
    feeder.round()
    return job, feeder


def cold_start(run: str, partitions: int) -> float:
    job, feeder = setup(run, partitions)
    with BackgroundFeeder(feeder, interval=1.0):
        started = time.time()
        deployment = deploy(job, DeployRequest("v1"))
        seconds = first_commit(deployment) - started
        stop(job)
    return seconds


def upgrade(run: str, partitions: int, *, prestarted: bool) -> tuple[float, dict[str, float]]:
    job, feeder = setup(run, partitions)
    with BackgroundFeeder(feeder, interval=1.0):
        old = deploy(job, DeployRequest("v1"))
        wait_for(lambda: len(batches(old.checkpoint, "commits")) >= WARM_BATCHES, "the old version to warm up")
        standby = None
        if prestarted:  # the upgrade DAG: a live savepoint, then the new driver with it restored
            live = take_savepoint(job, labels={"upgrade_to": "v2"})
            standby = prestart(job, "v2", prerestore=live.id, wait_seconds=900)  # STANDBY before the stop
        stopping = time.time()
        savepoint = stop(job, savepoint=True).snapshot
        assert savepoint is not None
        stopped = time.time()
        if standby is not None:
            new = activate(job, standby.id, savepoint.id)
        else:
            new = deploy(job, DeployRequest("v2", restore=savepoint.id))
        started = time.time()
        first_new = first_commit(new)
        last_old = commit_time(old.checkpoint, batches(old.checkpoint, "commits")[-1])
        stop(job)
    phases = {
        "last commit -> stop": stopping - last_old,
        "stop + savepoint": stopped - stopping,
        "restore + start": started - stopped,
        "-> first commit": first_new - started,
    }
    return first_new - last_old, phases


def main() -> int:
    require_java()
    shutil.rmtree(WORK, ignore_errors=True)
    results = Results()
    try:
        with EmbeddedS3() as s3:
            s3.apply_env()
            s3.create_bucket("bench-upgrade")
            for partitions in PARTITIONS:
                measure(partitions, results)
    finally:  # interrupted part-way: what was measured by then
        report(results, RESULTS)
    return 0 if all(t.passed for t in results.targets) else 1


def measure(partitions: int, results: Results) -> None:
    samples: dict[str, list[float]] = {"cold start": [], "upgrade, pre-started": [], "upgrade, cold driver": []}
    phase_samples: dict[str, dict[str, list[float]]] = {}
    for pair in range(PAIRS):
        samples["cold start"].append(cold_start(f"p{partitions}-cold-{pair}", partitions))
        log(f"{partitions} partitions, cold start {pair + 1}/{PAIRS}: {samples['cold start'][-1]:.2f} s")
        for kind, prestarted in (("upgrade, pre-started", True), ("upgrade, cold driver", False)):
            run = f"p{partitions}-{kind.split()[-1]}-{pair}"
            downtime, phases = upgrade(run, partitions, prestarted=prestarted)
            samples[kind].append(downtime)
            for name, value in phases.items():
                phase_samples.setdefault(kind, {}).setdefault(name, []).append(value)
            detail = ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
            log(f"{partitions} partitions, {kind} {pair + 1}/{PAIRS}: {downtime:.2f} s downtime ({detail})")
    medians = {kind: statistics.median(values) for kind, values in samples.items()}
    cold = medians["cold start"]
    section = f"{partitions} partitions"
    results.row(
        f"{section}: cold start",
        "fresh deploy -> first committed batch (median)",
        f"{cold:.2f} s  ({_list(samples['cold start'])})",
    )
    for kind in ("upgrade, pre-started", "upgrade, cold driver"):
        row = f"{section}: {kind}"
        median = f"{medians[kind]:.2f} s  ({_list(samples[kind])})"
        results.row(row, "old's last commit -> new's first commit (median)", median)
        results.row(row, "  ratio to the cold start", f"{medians[kind] / cold:.2f}x")
        for name, values in phase_samples[kind].items():
            results.row(row, f"  {name} (median)", f"{statistics.median(values):.2f} s")
    down = medians["upgrade, pre-started"]
    limit = RATIO_LIMITS.get(partitions, 0.5)
    results.targets.append(
        Target(f"{section}: upgrade downtime / cold start", down / cold, limit, "x", f"{down:.2f} s vs {cold:.2f} s")
    )
    results.data[section] = {"samples_s": samples, "phases_s": phase_samples}


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
