"""Upgrades on the production stack, against the job's own rhythm and a cold start, measured in the same run
(`make bench-upgrade`): the example Kafka job (dedup and windowed counts, RocksDB state), checkpoints and its
Delta table on the embedded S3 server through S3A, real spark-submit drivers in local mode, events produced
throughout, at the example's 3 state partitions and at Spark's default 200 (UPGRADE_BENCH_PARTITIONS).

    cold start    a fresh deployment's deploy call -> its first commit to the table
    stop_restore  `savepoints upgrade --mode stop_restore`: the old version's last commit -> the new version's
                  first (the downtime: its stop-with-savepoint lies between them), and the longest time the
                  table went without a commit during the whole upgrade (its pre-flight runs beside the old version)
    blue_green    `savepoints upgrade --mode blue_green`: the longest time the table went without a commit
                  during the upgrade, against the longest between commits before it (the job's own rhythm);
                  the time from the upgrade's start to its cutover; both drivers' peak memory (the sum of
                  each process group's VmHWM, sampled while both run)
    replay        `savepoints upgrade --mode replay` to v3 (a new grouping key: the state cannot be taken over):
                  the records replayed (from where the state v3 needs began up to the live savepoint) against the
                  time green took to catch up (launched -> caught up), at two feed rates (records per round of
                  event time); its gap as blue_green's

Times are the table's commit timestamps (Delta's commitInfo), so every figure is a sink commit. The runs of
one size alternate (cold start, stop_restore, blue_green, ...) so that machine load affects all alike.
Targets: blue_green's gap <= 1.5x the longest interval between commits before it, at both sizes;
stop_restore's downtime <= 0.2x the cold start at 3 partitions and <= 0.35x at 200."""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import uuid
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy, live_deployments
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.records.deployment import Deployment
from airflow_plugin.core.sinks import delta as delta_sink
from airflow_plugin.core.upgrades.record import Phase, Upgrade
from airflow_plugin.core.upgrades.run import begin, run_upgrade
from airflow_plugin.core.upgrades.steps import UpgradeSettings
from bench.report import Results, Target, log, report
from devtools.embedded_s3 import EmbeddedS3
from devtools.feeding import BackgroundFeeder
from devtools.java import require_java
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import JOB, KafkaFeeder, commit_gaps, table_of, write_jobs_file
from devtools.kafka_job import PARTITIONS as TOPIC_PARTITIONS
from devtools.windowed import wait_for

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "upgrade-run"
RESULTS = ROOT / ".bench" / "upgrade.json"
PAIRS = int(os.environ.get("UPGRADE_BENCH_PAIRS", "2"))
PARTITIONS = [int(n) for n in os.environ.get("UPGRADE_BENCH_PARTITIONS", "3 200").split()]
MODES = os.environ.get("UPGRADE_BENCH_MODES", "stop_restore blue_green replay").split()
# events per round (5 minutes of event time, a round a second): the amount a replay reads scales with it. Both
# rates stay under what a driver reads beside another on 2 cores (2,000 records a batch of about 5 s): at 2,000
# a round neither version ever catches up, and the upgrade waits out its catch-up limit
# (replay runs at the example's 3 partitions only: at 200 a driver beside another keeps up with 20 events a round,
# too few for a replay's records to tell a rate)
REPLAY_ROUNDS = {3: (100, 200)}
# events per round (a round a second; each round also sends up to 5 of its events again) for cold start,
# stop_restore and blue_green: what one driver keeps up with beside another on 2 cores. At 200 state partitions a
# batch on the embedded S3 takes some 40 s alone and 110-270 s beside another driver whatever it reads (it loads
# and commits 400 RocksDB stores), capped at the job's 2,000 records: green read about 10 records a second
# there. Measured: at 5 events a round (10 records a second) its Kafka lag never fell; 2 (4 records) is under it
FEED = {3: 200, 200: 2}
# the pre-flight runs the snapshot's batch on a copy of the state: at 200 partitions, beside the old version,
# more than the jobs file's default 600 s (measured: killed at it)
PREFLIGHT_TIMEOUT = {200: 3600.0}


def feed_rate(partitions: int) -> int:
    return FEED.get(partitions, min(FEED.values()))


WARM_COMMITS = 8  # commits of the old version before an upgrade: its rhythm is measured on these
STOP_RESTORE_LIMITS = {3: 0.2, 200: 0.35}
GAP_LIMIT = 1.5
# a bucket per measurement: the embedded S3 server lists a prefix by scanning its whole bucket, so runs that
# shared one slowed down as the earlier runs' checkpoints (tens of thousands of objects at 200 partitions) piled up
BUCKET_PREFIX = "bench-upgrade"
WAIT = 1800.0  # seconds for a deploy, a warm-up or the first commits: a batch at 200 partitions takes minutes


class Run:
    """One measurement's job: its own topic, store prefix and table, events produced from a thread."""

    def __init__(
        self, s3: EmbeddedS3, kafka: EmbeddedKafka, name: str, partitions: int, events_per_round: int | None = None
    ) -> None:
        directory = WORK / name
        bucket = f"{BUCKET_PREFIX}-{name}"
        s3.create_bucket(bucket)
        directory.mkdir(parents=True)
        topic = f"{name}-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(topic, TOPIC_PARTITIONS)
        lake = f"s3a://{bucket}/{name}"
        jobs_file = write_jobs_file(
            directory,
            f"s3://{bucket}/{name}/store",
            kafka.bootstrap,
            topic,
            shuffle_partitions=partitions,
            lake=lake,
            preflight_timeout=PREFLIGHT_TIMEOUT.get(partitions),
        )
        self.job: JobContext = Settings(jobs_file=str(jobs_file)).resolve().job(JOB)
        self.table = self.job.open(table_of(lake))
        self.feeder = KafkaFeeder(kafka, topic, events_per_round=events_per_round or feed_rate(partitions))
        self.records = Deployments(self.job.store.storage)

    def commits(self, deployment: Deployment | None = None) -> list[float]:
        """The table's commit times, of one deployment's query or of all."""
        query = None
        if deployment is not None:
            status = self.records.status(JOB, deployment.id)
            query = status.query_id if status else None
            if query is None:
                return []
        return delta_sink.commit_times(self.table, query)

    def warm(self, deployment: Deployment) -> None:
        wait_for(lambda: len(self.commits(deployment)) >= WARM_COMMITS, f"{deployment.id} to warm up", WAIT)


def cold_start(run: Run) -> float:
    with BackgroundFeeder(run.feeder, interval=1.0):
        started = time.time()
        deployment = deploy(run.job, DeployRequest("v1", wait_seconds=WAIT))
        wait_for(lambda: bool(run.commits(deployment)), "the first commit", WAIT)
        seconds = run.commits(deployment)[0] - started
        stop(run.job)
    return seconds


def upgraded(run: Run, mode: str, version: str = "v2") -> tuple[Upgrade, Deployment, dict[str, float]]:
    """Deploy v1, let it commit, upgrade it to `version` in `mode` with events flowing; the peak memory of the
    drivers sampled meanwhile."""
    peaks: dict[str, float] = {}
    with BackgroundFeeder(run.feeder, interval=1.0):
        old = deploy(run.job, DeployRequest("v1", wait_seconds=WAIT))
        run.warm(old)
        done = threading.Event()
        sampler = threading.Thread(target=_sample_peaks, args=(run.job, peaks, done), daemon=True)
        sampler.start()
        settings = UpgradeSettings(min_batches=3, catch_up_seconds=1800, confirm_seconds=900)
        upgrade = run_upgrade(run.job, begin(run.job, version, mode=mode, settings=settings))
        new = run.records.get(JOB, str(upgrade.new_deployment)) if upgrade.new_deployment else old
        if upgrade.phase is Phase.DONE:
            wait_for(lambda: len(run.commits(new)) >= 3, "the new version's commits", WAIT)
        done.set()
        sampler.join()
        stop(run.job)
    return upgrade, old, peaks


def _sample_peaks(job: JobContext, peaks: dict[str, float], done: threading.Event) -> None:
    """The high-water mark of every live driver's process group (JVM and Python), in MiB."""
    while not done.wait(1.0):
        for deployment, state in live_deployments(job):
            if state.live and deployment.launcher.get("pid"):
                mib = _group_hwm(int(deployment.launcher["pid"])) / 1024
                peaks[deployment.id] = max(peaks.get(deployment.id, 0.0), mib)


def _group_hwm(pgid: int) -> int:
    """kB: the summed VmHWM of the processes in one process group (a driver: spark-submit's JVM and Python)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def stop_restore(run: Run) -> tuple[float, float, float, dict[str, float]]:
    """The downtime, the longest time without a commit during the whole upgrade, the median time between the old
    version's commits before the upgrade (what a restart that cost nothing would show), and the drivers' peaks."""
    upgrade, _, peaks = upgraded(run, "stop_restore")
    if upgrade.phase is not Phase.DONE:
        raise RuntimeError(f"stop_restore upgrade {upgrade.id} ended {upgrade.phase}: {upgrade.error}")
    # both versions write under the one query id a restore keeps, so the stop-with-savepoint tells them apart:
    # the old version committed its last batch before it, the new one its first after it
    stopped = _seconds(run.job.store.get(JOB, str(upgrade.stop_savepoint)).created_at)
    times = run.commits()
    downtime = min(t for t in times if t > stopped) - max(t for t in times if t <= stopped)
    started = _seconds(upgrade.created_at)
    whole, _ = commit_gaps(run.table, started, _seconds(upgrade.updated_at))
    before = sorted(t for t in times if t < started)
    rhythm = statistics.median(b - a for a, b in pairwise(before))
    return downtime, whole, rhythm, peaks


def blue_green(run: Run) -> dict[str, Any]:
    upgrade, _, peaks = upgraded(run, "blue_green")
    if upgrade.phase is not Phase.DONE:
        raise RuntimeError(f"blue_green upgrade {upgrade.id} ended {upgrade.phase}: {upgrade.error}")
    start, end = _seconds(upgrade.created_at), _seconds(upgrade.updated_at)
    gap, rhythm = commit_gaps(run.table, start, end)
    return {
        "gap": gap,
        "rhythm": rhythm,
        "to_cutover": _seconds(str(upgrade.cutover_at)) - start,
        "upgrade": end - start,
        "memory_mib": sum(peaks.values()),
    }


def replay(run: Run) -> dict[str, Any]:
    upgrade, _, peaks = upgraded(run, "replay", version="v3")
    if upgrade.phase is not Phase.DONE:
        raise RuntimeError(f"replay upgrade {upgrade.id} ended {upgrade.phase}: {upgrade.error}")
    entered: dict[str, float] = {}
    for step in reversed(upgrade.history):  # the first time it entered each phase
        entered[step["phase"]] = _seconds(step["at"])
    start, end = _seconds(upgrade.created_at), _seconds(upgrade.updated_at)
    gap, rhythm = commit_gaps(run.table, start, end)
    catch_up = entered[str(Phase.CUTTING_OVER)] - entered[str(Phase.CATCHING_UP)]
    records = int((upgrade.replay or {}).get("records") or 0)
    return {
        "records": records,
        "catch_up": catch_up,
        "records_per_s": records / catch_up if catch_up else 0.0,
        "found": (upgrade.replay or {}).get("found"),
        "gap": gap,
        "rhythm": rhythm,
        "memory_mib": sum(peaks.values()),
    }


def main() -> int:
    require_java()
    shutil.rmtree(WORK, ignore_errors=True)
    results = Results()
    try:
        with EmbeddedS3() as s3, EmbeddedKafka() as kafka:
            s3.apply_env()
            for partitions in PARTITIONS:
                measure(s3, kafka, partitions, results)
    finally:  # interrupted part-way: what was measured by then
        report(results, RESULTS)
    return 0 if all(t.passed for t in results.targets) else 1


def measure(s3: EmbeddedS3, kafka: EmbeddedKafka, partitions: int, results: Results) -> None:
    cold, downtimes, wholes, rhythms, green = [], [], [], [], []
    memory: dict[str, list[float]] = {"stop_restore": [], "blue_green": []}
    replays: dict[int, list[dict[str, Any]]] = {rate: [] for rate in REPLAY_ROUNDS.get(partitions, ())}
    for pair in range(PAIRS):
        if "stop_restore" in MODES:
            cold.append(cold_start(Run(s3, kafka, f"p{partitions}-cold-{pair}", partitions)))
            log(f"{partitions} partitions, cold start {pair + 1}/{PAIRS}: {cold[-1]:.2f} s")
            downtime, whole, rhythm, peaks = stop_restore(Run(s3, kafka, f"p{partitions}-sr-{pair}", partitions))
            downtimes.append(downtime)
            wholes.append(whole)
            rhythms.append(rhythm)
            memory["stop_restore"].append(sum(peaks.values()))
            log(f"{partitions} partitions, stop_restore {pair + 1}/{PAIRS}: {downtime:.2f} s down ({whole:.2f} s)")
        if "blue_green" in MODES:
            green.append(blue_green(Run(s3, kafka, f"p{partitions}-bg-{pair}", partitions)))
            memory["blue_green"].append(green[-1]["memory_mib"])
            log(f"{partitions} partitions, blue_green {pair + 1}/{PAIRS}: {green[-1]}")
        if "replay" in MODES:
            for rate in replays:
                replays[rate].append(replay(Run(s3, kafka, f"p{partitions}-rp{rate}-{pair}", partitions, rate)))
                log(f"{partitions} partitions, replay at {rate} events a round {pair + 1}/{PAIRS}: {replays[rate][-1]}")
    section = f"{partitions} partitions"
    results.row(
        section,
        "events fed (cold start, stop_restore, blue_green)",
        f"{feed_rate(partitions)} a second",
    )
    if cold:
        _stop_restore_rows(section, partitions, cold, downtimes, rhythms, results)
        results.row(section, "  longest time without a commit during the whole upgrade", f"{max(wholes):.2f} s")
    if green:
        _blue_green_rows(section, green, results)
    for mode, values in memory.items():
        if values:
            results.row(section, f"peak memory of the drivers, {mode} (max)", f"{max(values):.0f} MiB")
    for rate, runs in replays.items():
        if runs:
            _replay_rows(section, rate, runs, results)
    results.data[section] = {
        "cold_s": cold,
        "stop_restore_s": downtimes,
        "stop_restore_whole_s": wholes,
        "stop_restore_rhythm_s": rhythms,
        "blue_green": green,
        "memory_mib": memory,
        "replay": {str(rate): runs for rate, runs in replays.items()},
    }


def _stop_restore_rows(
    section: str, partitions: int, cold: list[float], downtimes: list[float], rhythms: list[float], results: Results
) -> None:
    cold_s, down_s, rhythm_s = statistics.median(cold), statistics.median(downtimes), statistics.median(rhythms)
    limit = STOP_RESTORE_LIMITS.get(partitions, 0.35)
    results.row(section, "cold start: deploy -> first commit to the table (median)", f"{cold_s:.2f} s ({_list(cold)})")
    results.row(
        section, "stop_restore: old's last commit -> new's first (median)", f"{down_s:.2f} s ({_list(downtimes)})"
    )
    results.row(section, "  ratio to the cold start", f"{down_s / cold_s:.2f}x")
    # the downtime spans at least one of the new version's batches: no restart goes below the job's own rhythm
    results.row(
        section,
        "  the old version's own time between commits before it (median): a restart that cost nothing",
        f"{rhythm_s:.2f} s = {rhythm_s / cold_s:.2f}x the cold start ({_list(rhythms)}); "
        f"the target: {limit * cold_s:.2f} s",
    )
    results.targets.append(
        Target(
            f"{section}: stop_restore / cold start",
            down_s / cold_s,
            limit,
            "x",
            f"{down_s:.2f} s vs {cold_s:.2f} s",
        )
    )


def _blue_green_rows(section: str, green: list[dict[str, Any]], results: Results) -> None:
    gap, rhythm = statistics.median(g["gap"] for g in green), statistics.median(g["rhythm"] for g in green)
    gaps = [g["gap"] for g in green]
    to_cutover, whole = (statistics.median(g[k] for g in green) for k in ("to_cutover", "upgrade"))
    results.row(section, "blue_green: longest time without a commit during it", f"{gap:.2f} s ({_list(gaps)})")
    results.row(section, "  longest between commits before it (the job's rhythm)", f"{rhythm:.2f} s")
    results.row(section, "  ratio", f"{gap / rhythm:.2f}x" if rhythm else "-")
    results.row(section, "  upgrade start -> cutover (median)", f"{to_cutover:.1f} s")
    results.row(section, "  the whole upgrade (median)", f"{whole:.1f} s")
    results.targets.append(
        Target(
            f"{section}: blue_green gap / rhythm",
            gap / rhythm if rhythm else float("inf"),
            GAP_LIMIT,
            "x",
            f"{gap:.2f} s vs {rhythm:.2f} s",
        )
    )


def _replay_rows(section: str, rate: int, runs: list[dict[str, Any]], results: Results) -> None:
    records = statistics.median(r["records"] for r in runs)
    catch_up = statistics.median(r["catch_up"] for r in runs)
    gap, rhythm = statistics.median(r["gap"] for r in runs), statistics.median(r["rhythm"] for r in runs)
    found = ", ".join(sorted({str(r["found"]) for r in runs}))
    results.row(
        section,
        f"replay at {rate} events a round: records replayed -> time to catch up (median)",
        f"{records:,.0f} -> {catch_up:.1f} s = {records / catch_up if catch_up else 0:,.0f} records/s ({found})",
    )
    results.row(section, "  longest time without a commit during it / before it", f"{gap:.2f} s / {rhythm:.2f} s")
    results.row(section, "  peak memory of the drivers (max)", f"{max(r['memory_mib'] for r in runs):.0f} MiB")


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
