"""Job runtime benchmark: what does running a query under spark_jobs.runtime cost, and how fast does a
stop request take effect?

    uv run python -m bench.runtime_bench

1. Throughput: the windowed job v1 over a fixed input (FILES files of EVENTS_PER_FILE events, built once
   under .bench/ and reused), available-now trigger with MAX_FILES_PER_TRIGGER files per batch, run
   (a) bare: the job's own writer, started and awaited, and (b) under the runtime (Runner: status board,
   listener, heartbeat, control polling, status.json in a local store), in ONE SparkSession, alternating
   bare/managed so that JVM warm-up and machine noise hit both alike. Median rows/s of REPEATS runs each
   after one warm-up run each. Target: the runtime costs <= 3%.
2. Stop latency: a control request written -> STOPPED in status.json, as the engine sees it (polling
   the store every 20 ms), for several trigger intervals, the request placed at a random phase of the
   trigger while a feeder keeps batches busy. In-process (Runner on the same session, several
   repetitions) and through real spark-submit processes (the engine's way). Target: <= interval + 2 s.

Prints a table with PASS/MISS per target and writes the same to .bench/runtime.json. Exit code 0 even
when a target is missed; non-zero only when the benchmark itself could not run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_plugin.core.jobs.deployments import Deployments, new_request_id
from airflow_plugin.core.records.deployment import ControlRequest, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from bench.report import Results, Target, log, report
from devtools.spark import local_spark
from spark_jobs import generate
from spark_jobs.jobs.windowed import v1
from spark_jobs.jobs.windowed.output import read_output, summarize
from spark_jobs.runtime import Delivery, Runner, RuntimeArgs, parse_trigger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
INPUT_DIR = BENCH_DIR / "runtime-input"  # built once, reused while the recipe is the same
INPUT_RECIPE = BENCH_DIR / "runtime-input.json"
WORK_DIR = BENCH_DIR / "runtime-run"  # recreated on every run
RESULTS = BENCH_DIR / "runtime.json"

JOB = "bench"
SHUFFLE_PARTITIONS = 4
FILES = 24
EVENTS_PER_FILE = 50_000
MAX_FILES_PER_TRIGGER = 2  # 12 batches per run: the per-batch costs (listener, status write) count
REPEATS = 6  # pairs
STOP_INTERVALS = (1.0, 2.0, 5.0)
STOP_REPEATS = 3
SUBMIT_STOP_INTERVALS = (2.0,)
SUBMIT_STOP_REPEATS = 2
FEED_EVENTS = 2_000
STATUS_POLL = 0.02

OVERHEAD_LIMIT = 0.03
STOP_SLACK_LIMIT = 2.0


# ---------------------------------------------------------------- input


def prepare_input() -> int:
    """The fixed throughput input; rebuilt only if its recipe changed. Returns the number of events."""
    recipe = {"files": FILES, "events_per_file": EVENTS_PER_FILE, "generator_seed": 0}
    total = FILES * EVENTS_PER_FILE
    if INPUT_RECIPE.exists() and json.loads(INPUT_RECIPE.read_text()) == recipe and INPUT_DIR.is_dir():
        return total
    shutil.rmtree(INPUT_DIR, ignore_errors=True)
    log(f"writing the input: {FILES} files x {EVENTS_PER_FILE} events")
    for round_no in range(FILES):
        generate.write_round(INPUT_DIR, round_no, EVENTS_PER_FILE)
    INPUT_RECIPE.write_text(json.dumps(recipe))
    return total


def runtime_args(deployment: str, checkpoint: Path, trigger: str) -> RuntimeArgs:
    return RuntimeArgs(
        store=str(WORK_DIR / "store"),
        job=JOB,
        deployment=deployment,
        checkpoint=str(checkpoint),
        trigger=parse_trigger(trigger),
        delivery=Delivery.EXACTLY_ONCE,
        heartbeat_interval=2.0,
        poll_interval=1.0,
    )


def job_args(input_dir: Path, output: Path, max_files: int) -> list[str]:
    return ["--input", str(input_dir), "--output", str(output), "--max-files-per-trigger", str(max_files)]


# ---------------------------------------------------------------- throughput


def bare_run(spark: SparkSession, name: str) -> float:
    """The same query without the runtime: build, set checkpoint and trigger, start, await."""
    run_dir = WORK_DIR / name
    started = time.monotonic()
    job = v1.build(spark, job_args(INPUT_DIR, run_dir / "output", MAX_FILES_PER_TRIGGER))
    query = (
        job.writer.queryName(name)
        .option("checkpointLocation", str(run_dir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.monotonic() - started


def managed_run(spark: SparkSession, name: str) -> float:
    """The same query under the runtime, on the same session."""
    run_dir = WORK_DIR / name
    args = runtime_args(name, run_dir / "checkpoint", "available-now")
    started = time.monotonic()
    code = Runner(v1.build, args, job_args(INPUT_DIR, run_dir / "output", MAX_FILES_PER_TRIGGER)).run(lambda: spark)
    seconds = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"managed run {name} ended with exit code {code}")
    return seconds


def output_events(name: str) -> int:
    return summarize(read_output(WORK_DIR / name / "output")).events


class CpuClock:
    """CPU seconds of the JVM (from /proc, Linux) plus this Python process: the work a run cost, less
    disturbed than wall time by other programs on a shared machine."""

    def __init__(self, spark: SparkSession) -> None:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
        self._stat = Path(f"/proc/{pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def now(self) -> float | None:
        if not self._stat.exists():
            return None
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        jvm = (int(fields[11]) + int(fields[12])) / self._tick  # utime, stime
        return jvm + time.process_time()


@dataclass
class Run:
    seconds: float
    cpu: float | None


def measured(clock: CpuClock, run: Callable[[], float]) -> Run:
    before = clock.now()
    seconds = run()
    after = clock.now()
    return Run(seconds, after - before if after is not None and before is not None else None)


def throughput(spark: SparkSession, results: Results) -> None:
    """Pairs of (bare, managed) runs, order alternating; the cost is the median of the per-pair ratios,
    so slow drifts of the machine cancel out within each pair."""
    events = prepare_input()
    clock = CpuClock(spark)
    runs: dict[str, Callable[[SparkSession, str], float]] = {"bare": bare_run, "managed": managed_run}
    for kind, run in runs.items():
        log(f"warm-up: {kind}")
        run(spark, f"warmup-{kind}")
    measurements: dict[str, list[Run]] = {"bare": [], "managed": []}
    for repeat in range(REPEATS):
        order = ["bare", "managed"] if repeat % 2 == 0 else ["managed", "bare"]
        for kind in order:
            result = measured(clock, lambda kind=kind, repeat=repeat: runs[kind](spark, f"{kind}-{repeat}"))
            measurements[kind].append(result)
            cpu = f", CPU {result.cpu:.1f} s" if result.cpu is not None else ""
            log(f"{kind} run {repeat}: {result.seconds:.2f} s = {events / result.seconds:,.0f} rows/s{cpu}")
    same = {output_events(f"{kind}-0") for kind in runs}
    if len(same) != 1:
        raise RuntimeError(f"bare and managed runs wrote different outputs: {same} events")
    bare, managed = measurements["bare"], measurements["managed"]
    wall_cost = statistics.median(m.seconds / b.seconds for b, m in zip(bare, managed, strict=True)) - 1
    cpu_cost = None
    if all(r.cpu for r in bare + managed):
        cpu_cost = statistics.median(m.cpu / b.cpu for b, m in zip(bare, managed, strict=True)) - 1  # type: ignore[operator]
    spread = (max(r.seconds for r in bare) - min(r.seconds for r in bare)) / statistics.median(r.seconds for r in bare)
    batches = -(-FILES // MAX_FILES_PER_TRIGGER)
    section = f"throughput ({events:,} events, {batches} batches, {REPEATS} pairs)"
    for kind, values in measurements.items():
        rates = [events / r.seconds for r in values]
        samples = ", ".join(f"{r:,.0f}" for r in rates)
        results.row(section, f"{kind} rows/s (median)", f"{statistics.median(rates):,.0f}  ({samples})")
    results.row(section, "runtime cost, wall time", f"{wall_cost * 100:+.1f}%  (median of per-pair ratios)")
    if cpu_cost is not None:
        results.row(section, "runtime cost, CPU time", f"{cpu_cost * 100:+.1f}%  (JVM + Python, per-pair median)")
    results.row(section, "noise: spread of bare runs", f"{spread * 100:.0f}% of their median")
    results.targets.append(
        Target("runtime throughput cost (wall)", wall_cost * 100, OVERHEAD_LIMIT * 100, "%", f"noise {spread:.0%}")
    )
    results.data["throughput"] = {
        "events": events,
        "batches": batches,
        "bare": [asdict(r) for r in bare],
        "managed": [asdict(r) for r in managed],
        "wall_cost": wall_cost,
        "cpu_cost": cpu_cost,
        "bare_spread": spread,
    }


# ---------------------------------------------------------------- stop latency


class Feeder:
    """Writes a small round every `every` seconds so that triggers have work when the stop arrives."""

    def __init__(self, input_dir: Path, every: float) -> None:
        self._input = input_dir
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._round = 0

    def feed(self) -> None:
        generate.write_round(self._input, self._round, FEED_EVENTS)
        self._round += 1

    def __enter__(self) -> Feeder:
        self.feed()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self.feed()


def wait_status(
    deployments: Deployments, deployment: str, condition: Callable[[DeploymentStatus], bool], timeout: float = 180.0
) -> DeploymentStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = deployments.status(JOB, deployment)
        if status is not None and condition(status):
            return status
        time.sleep(STATUS_POLL)
    raise RuntimeError(f"{deployment}: timed out; last status {deployments.status(JOB, deployment)}")


def request_and_time_stop(deployments: Deployments, deployment: str, interval: float, rng: random.Random) -> float:
    """Once RUNNING with a batch done: a random trigger phase, the request, then poll for STOPPED."""
    wait_status(deployments, deployment, lambda s: s.state is State.RUNNING and s.last_batch_id is not None)
    time.sleep(rng.uniform(0, interval))  # place the request at a random phase of the trigger
    deployments.request(JOB, deployment, ControlRequest(new_request_id(), "stop", requested_by="bench"))
    requested = time.monotonic()
    status = wait_status(deployments, deployment, lambda s: s.state in (State.STOPPED, State.FAILED))
    if status.state is not State.STOPPED:
        raise RuntimeError(f"{deployment} ended {status.state}: {status.error_class} {status.error_message}")
    return time.monotonic() - requested


def stop_in_process(spark: SparkSession, interval: float, repeat: int, rng: random.Random) -> float:
    name = f"stop-{interval:g}s-{repeat}"
    run_dir = WORK_DIR / name
    args = runtime_args(name, run_dir / "checkpoint", f"{interval:g} seconds")
    runner = Runner(v1.build, args, job_args(run_dir / "input", run_dir / "output", 1))
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run(lambda: spark)), daemon=True)
    with Feeder(run_dir / "input", interval / 2):
        thread.start()
        latency = request_and_time_stop(runner.deployments, name, interval, rng)
    thread.join(timeout=60)
    if outcome != [0]:
        raise RuntimeError(f"{name}: the runner ended with {outcome}")
    return latency


def stop_spark_submit(interval: float, repeat: int, rng: random.Random) -> float:
    """The engine's way: a detached spark-submit, status and control through the store."""
    name = f"submit-stop-{interval:g}s-{repeat}"
    run_dir = WORK_DIR / name
    run_dir.mkdir(parents=True)
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        *("--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1"),
        *("--conf", f"spark.sql.shuffle.partitions={SHUFFLE_PARTITIONS}", "--conf", "spark.log.level=WARN"),
        str(ROOT / "spark_jobs" / "jobs" / "windowed" / "v1.py"),
        *("--store", str(WORK_DIR / "store"), "--job", JOB, "--deployment", name),
        *("--checkpoint", str(run_dir / "checkpoint"), "--trigger-interval", f"{interval:g} seconds"),
        *("--delivery", "exactly-once", *job_args(run_dir / "input", run_dir / "output", 1)),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    deployments = Deployments(open_storage(str(WORK_DIR / "store")))
    with Feeder(run_dir / "input", interval / 2), (run_dir / "spark-submit.log").open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            latency = request_and_time_stop(deployments, name, interval, rng)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if code != 0:
        raise RuntimeError(f"{name}: spark-submit exited {code}; see {run_dir / 'spark-submit.log'}")
    return latency


def stop_latency(spark: SparkSession, results: Results) -> None:
    rng = random.Random(20261121)
    section = "stop latency (request -> STOPPED in status.json)"
    data: dict[str, Any] = {}
    cases: list[tuple[str, float, Callable[[int], float], int]] = [
        ("in-process", interval, lambda r, i=interval: stop_in_process(spark, i, r, rng), STOP_REPEATS)
        for interval in STOP_INTERVALS
    ] + [
        ("spark-submit", interval, lambda r, i=interval: stop_spark_submit(i, r, rng), SUBMIT_STOP_REPEATS)
        for interval in SUBMIT_STOP_INTERVALS
    ]
    for how, interval, measure, repeats in cases:
        latencies = []
        for repeat in range(repeats):
            latencies.append(measure(repeat))
            log(f"stop {how}, trigger {interval:g} s: {latencies[-1]:.2f} s")
        worst = max(latencies)
        samples = ", ".join(f"{v:.2f}" for v in latencies)
        results.row(section, f"{how}, trigger {interval:g} s", f"max {worst:.2f} s  ({samples})")
        results.targets.append(
            Target(f"stop latency {how}, trigger {interval:g} s", worst, interval + STOP_SLACK_LIMIT, "s")
        )
        data[f"{how}-{interval:g}s"] = latencies
    results.data["stop_latency_seconds"] = data


# ---------------------------------------------------------------- report


def main() -> int:
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results = Results()
    spark = local_spark("runtime-bench", SHUFFLE_PARTITIONS)
    try:
        throughput(spark, results)
        stop_latency(spark, results)
    finally:
        spark.stop()
    report(results, RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
