"""The autoscaler against fixed sizes (`make bench-autoscale`): the same job, the same input, in one run, three ways:

    autoscaled     declared with `autoscale = { min = 1, max = 4, ... }` on local[1], sized by `savepoints apply`
                   processes run every few seconds (as the reconcile DAG runs them)
    fixed at 1     local[1], its starting size, no autoscale
    fixed at 4     local[4], its max size, no autoscale (4 state partitions, what a person would give it)

The job is devtools/autoscale_app.py: a per-row sleep in its reading stage over a topic of 12 partitions, then a
windowed count into the file sink, so its capacity is its task slots even on a loaded 2-core machine. The input
(devtools/autoscale_job.py RateFeeder): LIGHT events a second until the job runs, then HEAVY (more than even four
cores do) for HEAVY_SECONDS, then LIGHT again until the job has caught up.

Measured: the time from the lag starting to grow to the lag back at its floor. The lag is the Kafka records behind
after each batch as the job's runtime reports it (the backlog the autoscaler reads: 0 when a batch read everything
there was); it starts to grow at the first sample after the step up where it is above 0, and is back at its floor
at the first sample after its last one above 0. Sampled every second from the running deployment's heartbeat.
Printed: each run's time, its peak lag, the sizes it ran at; the ratios of the autoscaled time to each fixed one."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow_plugin.core.errors import NotFound, SavepointsError
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.stop import kill
from airflow_plugin.core.lease import break_lease
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.records.deployment import State
from bench.report import Results, Target, log, report
from devtools.autoscale_job import JOB, TOPIC_PARTITIONS, ApplyLoop, RateFeeder, write_jobs_file
from devtools.java import require_java
from devtools.kafka import EmbeddedKafka
from devtools.windowed import wait_for

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "autoscale-run"
RESULTS = ROOT / ".bench" / "autoscale.json"
LIGHT = float(os.environ.get("AUTOSCALE_BENCH_LIGHT", "10"))  # events a second
HEAVY = float(os.environ.get("AUTOSCALE_BENCH_HEAVY", "130"))  # past what four cores do (about 110 here)
HEAVY_SECONDS = float(os.environ.get("AUTOSCALE_BENCH_HEAVY_SECONDS", "120"))
GIVE_UP_SECONDS = 1200.0  # a run whose lag is not back at its floor by then is reported as such
POLICY = {
    "min": 1,
    "max": 4,
    "window": 50,
    "scale_down_window": 60,
    "cooldown": 10,
    "catch_up": 10,
    "restart_time": 30,
    "max_rescales_per_hour": 6,
}


@dataclass
class Run:
    name: str
    seconds: float | None = None  # lag growing -> back at its floor (None: not back by GIVE_UP_SECONDS)
    peak: int = 0
    sizes: list[str] = field(default_factory=list)  # the masters it ran at, in order
    rescales: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since the step up, lag)


def running(ctx: JobContext) -> tuple[str, int | None, str | None] | None:
    """The newest RUNNING deployment: (its id, its lag after its last batch, its master); None while none runs."""
    for deployment in reversed(ctx.deployments.list(ctx.name)):
        status = ctx.deployments.status(ctx.name, deployment.id)
        if status is not None and status.state is State.RUNNING and status.last_batch_id is not None:
            lag = status.load[-1].get("backlog") if status.load else None
            return deployment.id, None if lag is None else int(lag), deployment.master
    return None


def measure(kafka: EmbeddedKafka, name: str, master: str, autoscale: dict[str, Any] | None, partitions: int) -> Run:
    directory = WORK / name
    topic = f"autoscale-{name}-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, TOPIC_PARTITIONS)
    jobs = write_jobs_file(
        directory,
        str(directory / "store"),
        kafka.bootstrap,
        topic,
        master=master,
        autoscale=autoscale,
        shuffle_partitions=partitions,
    )
    ctx = Settings(jobs_file=str(jobs)).resolve().job(JOB)
    run = Run(name)
    try:
        with RateFeeder(kafka, topic, rate=LIGHT) as feeder, ApplyLoop(jobs, every=3.0):
            wait_for(lambda: running(ctx) is not None, f"{name}: the job to run", timeout=900)
            log(f"{name}: running at {master}; the feed steps up to {HEAVY:g} events/s for {HEAVY_SECONDS:g} s")
            feeder.rate = HEAVY
            start = time.monotonic()
            grew = None
            while (elapsed := time.monotonic() - start) < GIVE_UP_SECONDS:
                feeder.check()
                if feeder.rate == HEAVY and elapsed >= HEAVY_SECONDS:
                    feeder.rate = LIGHT
                seen = running(ctx)
                if seen is not None and seen[1] is not None:
                    lag, size = seen[1], str(seen[2])
                    run.samples.append((round(elapsed, 1), lag))
                    if not run.sizes or run.sizes[-1] != size:
                        run.sizes.append(size)
                    run.peak = max(run.peak, lag)
                    if grew is None and lag > 0:
                        grew = elapsed
                    if grew is not None and lag == 0 and feeder.rate == LIGHT:
                        run.seconds = elapsed - grew
                        break
                time.sleep(1.0)  # the sampling interval
        run.rescales = [asdict(r) for r in records.read(ctx.store.storage, ctx.name).rescales]
    finally:
        _kill_all(ctx)
    back = f"{run.seconds:.0f} s" if run.seconds is not None else f"not back within {GIVE_UP_SECONDS:.0f} s"
    log(f"{name}: lag back at its floor after {back}; peak {run.peak} records; sizes {' -> '.join(run.sizes)}")
    return run


def _kill_all(ctx: JobContext) -> None:
    with contextlib.suppress(NotFound):  # a killed upgrade's lease: broken first
        break_lease(ctx.store.storage, ctx.name)
    for deployment in ctx.deployments.list(ctx.name):
        with contextlib.suppress(SavepointsError):
            kill(ctx, deployment.id)


def main() -> int:
    require_java()
    shutil.rmtree(WORK, ignore_errors=True)
    results = Results()
    runs: dict[str, Run] = {}
    try:
        with EmbeddedKafka() as kafka:
            runs["autoscaled"] = measure(kafka, "autoscaled", "local[1]", POLICY, 2)
            runs["fixed at 1"] = measure(kafka, "fixed-1", "local[1]", None, 2)
            runs["fixed at 4"] = measure(kafka, "fixed-4", "local[4]", None, 4)
        section = f"lag growing -> back at its floor ({HEAVY:g} events/s for {HEAVY_SECONDS:g} s, then {LIGHT:g})"
        for name, run in runs.items():
            took = f"{run.seconds:.0f} s" if run.seconds is not None else "not back"
            results.row(section, name, f"{took}; peak lag {run.peak}; ran at {' -> '.join(run.sizes)}")
        auto, low, high = (runs[k].seconds for k in ("autoscaled", "fixed at 1", "fixed at 4"))
        if auto is not None and low is not None and high is not None:
            results.row(section, "autoscaled / fixed at 1", f"{auto / low:.2f}x")
            results.row(section, "autoscaled / fixed at 4", f"{auto / high:.2f}x")
            results.targets.append(Target("autoscaled vs fixed at its starting size", auto / low, 1.0, "x"))
        for rescale in runs["autoscaled"].rescales:
            what = f"{rescale['from_size']} -> {rescale['to_size']}"
            results.row("the autoscaled run's rescales", what, f"{rescale['outcome']}, {rescale['seconds'] or 0:.0f} s")
        results.data["runs"] = {name: asdict(run) for name, run in runs.items()}
    finally:  # interrupted part-way: what was measured by then
        report(results, RESULTS)
    return 0 if all(t.passed for t in results.targets) else 1


if __name__ == "__main__":
    raise SystemExit(main())
