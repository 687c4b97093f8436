"""Driving the autoscaler's job (devtools/autoscale_app.py) from outside, for tests/e2e/test_autoscale_e2e.py and
bench/autoscale_bench.py: its jobs file (a declared job with `autoscale`, or fixed at a size), a feeder whose rate is
turned up and down while it runs (each (user, window)'s events counted as fed), the sink's counts, and what the job
reports of its load and backlog.

Events: `seq` n has event time T0 + n * EVENT_STEP and user u<n mod USERS>, so a one-minute window holds
60 / EVENT_STEP events whatever the rate, and windows close (the watermark trails the newest event by a minute) at
a pace the feed sets. Records are keyed by `seq`: the topic's partitions get even shares, and each is a read task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_plugin.core.jobs.context import JobContext
from airflow_plugin.core.reconcile import record as records
from airflow_plugin.core.reconcile.apply import CHANGED_MEANWHILE
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.snapshots.checkpoint import read_restart_point
from airflow_plugin.core.upgrades.record import Upgrades
from devtools import jvm
from devtools.kafka import EmbeddedKafka
from devtools.windowed import SPARK_UI, wait_for
from spark_jobs.generate import FLUSH_TIME, FLUSH_USER, iso
from spark_jobs.jobs.windowed.output import read_output

APP = Path(__file__).resolve().with_name("autoscale_app.py")
JOB = "autoscaled"
TOPIC_PARTITIONS = 12  # read tasks: 1, 2, 3 and 4 slots read them in 12, 6, 4 and 3 waves (capacity ~ slots)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVENT_STEP = timedelta(milliseconds=100)  # event time between consecutive events: 600 events a window
USERS = 10


def write_jobs_file(
    directory: Path,
    store: str,
    bootstrap: str,
    topic: str,
    *,
    master: str = "local[1]",
    autoscale: dict[str, Any] | None = None,
    shuffle_partitions: int = 2,
    row_ms: int = 20,
    max_offsets_per_trigger: int = 600,
    trigger: str = "5 seconds",
    job: str = JOB,
    checkpoint_root: str | None = None,
    conf: dict[str, str] | None = None,
    table: str = "",
) -> Path:
    """A jobs file declaring `job` (running v1, the app) on `master`, reading `topic`, writing `<directory>/output`;
    with `autoscale` (a table's keys and values) the loop sizes it. The trigger is longer than a batch's own cost
    (a few seconds on a loaded 2-core machine, whatever its rows): a job with little to read is busy only part of
    the time, as the autoscaler must see to scale it down. On a cluster: its `checkpoint_root` (default
    `<directory>/checkpoints`), more `conf` and more lines of the job's `table` (`deploy_mode = ...`)."""
    confs = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.jars": str(jvm.link("spark-kafka") / "*.jar"),
        **SPARK_UI,
        **(conf or {}),
    }
    args = [
        "--topic",
        topic,
        "--output",
        f"file://{directory / 'output'}",  # a scheme: in a YARN container a path without one is on HDFS
        "--max-offsets-per-trigger",
        str(max_offsets_per_trigger),
        "--row-ms",
        str(row_ms),
    ]
    if autoscale is not None:
        table += "\nautoscale = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in autoscale.items()) + " }"
    path = directory / "jobs.toml"
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / ".jobs.toml.new"  # whole or not at all: `savepoints apply` may be reading it
    staged.write_text(
        f"""
[jobs.{job}]
store = "{store}"
checkpoint_root = "{checkpoint_root or directory / "checkpoints"}"
log_dir = "{directory / "logs"}"
spark_master = "{master}"
trigger_interval = "{trigger}"
heartbeat_timeout = 30
kafka = {{ bootstrap_servers = "{bootstrap}" }}
conf = {{ {", ".join(f'"{key}" = "{value}"' for key, value in confs.items())} }}
args = [{", ".join(json.dumps(arg) for arg in args)}]
versions.v1 = {{ application = "{APP}" }}
desired = {{ version = "v1" }}
restart = {{ delay = 0 }}
{table}
"""
    )
    staged.replace(path)
    return path


class RateFeeder:
    """Produces events to `topic` at `rate` events a second (set it at any time), every `interval` seconds on a
    thread, until stopped; keeps `fed`, the events per (user, window start) that the output must count."""

    def __init__(self, kafka: EmbeddedKafka, topic: str, rate: float = 0.0, interval: float = 0.5) -> None:
        self.kafka, self.topic, self.rate, self.interval = kafka, topic, rate, interval
        self.fed: Counter[tuple[str, str]] = Counter()
        self.events = 0
        self._owed = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rate-feeder", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            last = time.monotonic()
            while not self._stop.wait(self.interval):  # the pace of the feed, not a wait for a condition
                # owed for the time that passed, which a slow produce (a loaded machine) makes longer than the
                # interval: the rate holds whatever a produce costs
                now = time.monotonic()
                self._owed += self.rate * (now - last)
                last = now
                count, self._owed = int(self._owed), self._owed - int(self._owed)
                if count:
                    self.produce(count)
        except BaseException as exc:  # the test sees it (check) rather than a silent stop of the input
            self.error = exc

    def produce(self, count: int) -> None:
        with self._lock:
            events = [self._event(self.events + i) for i in range(count)]
            self.events += count
            for event in events:
                self.fed[(str(event["user"]), str(event["event_time"])[:16])] += 1
            records = [(str(e["seq"]), json.dumps(e, separators=(",", ":"))) for e in events]
            self.kafka.produce(self.topic, records)

    def flush(self) -> None:
        """The flush marker, far in the future: the watermark passes every window fed, which the job then emits.
        Nothing is fed after it."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            event = {"user": FLUSH_USER, "country": "-", "event_time": iso(FLUSH_TIME), "seq": self.events + 10**9}
            self.kafka.produce(self.topic, [(str(event["seq"]), json.dumps(event))])

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the feeder stopped: {self.error!r}") from self.error

    @staticmethod
    def _event(seq: int) -> dict[str, object]:
        return {"user": f"u{seq % USERS}", "country": "DE", "event_time": iso(T0 + seq * EVENT_STEP), "seq": seq}

    def __enter__(self) -> RateFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def written(output: Path) -> Counter[tuple[str, str]]:
    """The events the sink committed per (user, window start), summed over rows: a (user, window) written twice
    shows as a count above what was fed."""
    counts: Counter[tuple[str, str]] = Counter()
    for row in read_output(output):
        counts[(row["user"], _minute(row["window_start"]))] += int(row["events"])
    return counts


def check_every_window_once(feeder: RateFeeder, output: Path, timeout: float = 300) -> None:
    """After a flush of the feed, every (user, window) fed is written to `output` once, with exactly the events fed
    for it; raises AssertionError naming the windows that are not."""
    feeder.flush()
    wait_for(lambda: set(written(output)) >= set(feeder.fed), "every window fed to be written", timeout=timeout)
    counts, rows = written(output), rows_per_window(output)
    wrong = {key: (counts[key], fed) for key, fed in feeder.fed.items() if counts[key] != fed}
    twice = {key: n for key, n in rows.items() if n != 1}
    assert not wrong and set(counts) == set(feeder.fed), f"(written, fed) per (user, window): {wrong}"
    assert not twice, f"rows per (user, window) written more than once: {twice}"


def rows_per_window(output: Path) -> Counter[tuple[str, str]]:
    """How many rows the sink committed for each (user, window): exactly once is one each."""
    return Counter((row["user"], _minute(row["window_start"])) for row in read_output(output))


def _minute(stamp: str) -> str:
    return iso(datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC))[:16]


def newest(ctx: JobContext) -> Deployment | None:
    listed = ctx.deployments.list(ctx.name)
    return listed[-1] if listed else None


def status_of(ctx: JobContext) -> tuple[Deployment | None, DeploymentStatus | None]:
    deployment = newest(ctx)
    return deployment, ctx.deployments.status(ctx.name, deployment.id) if deployment else None


def reconciled(ctx: JobContext) -> records.Reconciled:
    """The job's reconcile record: its rescales and the autoscaler's last recommendation."""
    return records.read(ctx.store.storage, ctx.name)


def recommended(ctx: JobContext) -> str | None:
    """The direction of the autoscaler's last recommendation (up, down, keep), None before one."""
    recommendation = reconciled(ctx).recommendation
    return None if recommendation is None else str(recommendation["direction"])


def rescale_ended(ctx: JobContext, count: int) -> Callable[[], bool]:
    """A condition: the job's `count`th rescale has its outcome recorded."""

    def ended() -> bool:
        rescales = reconciled(ctx).rescales
        return len(rescales) >= count and rescales[count - 1].outcome is not None

    return ended


def running_batches(ctx: JobContext, at_least: int) -> bool:
    """The newest deployment runs and has committed batch `at_least` or later."""
    _, status = status_of(ctx)
    return status is not None and status.state is State.RUNNING and (status.last_batch_id or 0) >= at_least


def pinned_partitions(ctx: JobContext, checkpoint: str) -> int:
    """The state's partitions as the checkpoint pins them (its newest offset log entry's conf), wherever it is."""
    return int(read_restart_point(ctx.open(checkpoint)).spark_conf["spark.sql.shuffle.partitions"])


def caught_up(ctx: JobContext) -> bool:
    """Rescaled above its first size, no upgrade under way, and the running deployment's backlog at its floor."""
    if not reconciled(ctx).rescales or Upgrades(ctx.store.storage).in_progress(ctx.name) is not None:
        return False
    deployment, status = status_of(ctx)
    if deployment is None or status is None or status.state is not State.RUNNING:
        return False
    return ctx.spec.size_of(deployment.master, deployment.spark_conf) > 1 and backlog(status) == 0


def backlog(status: DeploymentStatus | None) -> int | None:
    """The Kafka records behind at the job's last batch, as its load reports it (None before a batch)."""
    if status is None or not status.load:
        return None
    value = status.load[-1].get("backlog")
    return None if value is None else int(value)


@dataclass(frozen=True)
class Applied:
    """One `savepoints apply` run: its exit code, the steps it printed (--json), its whole output."""

    returncode: int
    jobs: list[dict[str, object]]
    output: str


class ApplyLoop:
    """`savepoints apply JOB --json` run again and again, one at a time, as the reconcile DAG runs it (every `every`
    seconds), on a thread; what each run did is kept in `runs` (and printed, for a failure's captured output)."""

    def __init__(self, jobs: Path, job: str = JOB, every: float = 3.0, log: Path | None = None) -> None:
        self.env = {**os.environ, "SAVEPOINTS_JOBS": str(jobs)}
        self.job, self.every, self.log = job, every, log
        self.runs: list[Applied] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apply-loop", daemon=True)
        self._process: subprocess.Popen[str] | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._process = subprocess.Popen(
                [sys.executable, "-m", "airflow_plugin", "apply", self.job, "--json"],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            out, _ = self._process.communicate()
            if self._stop.is_set() and self._process.returncode < 0:
                break  # ended by __exit__ mid-step: not a run that failed
            try:
                shown = json.loads(out[out.index("{") :]) if "{" in out else {}
            except ValueError:
                shown = {}
            self.runs.append(Applied(self._process.returncode, list(shown.get("jobs", [])), out))
            if self.log is not None:  # every run's whole output, its warnings with it
                with self.log.open("a") as kept:
                    kept.write(f"--- {time.strftime('%H:%M:%S')} exit {self._process.returncode}\n{out}\n")
            for job in self.runs[-1].jobs:
                said = f"{job.get('action')} - {job.get('reason')}: {job.get('outcome')}"
                print(f"{time.strftime('%H:%M:%S')} apply: {said}", flush=True)
            self._stop.wait(self.every)  # the DAG's schedule between two runs

    def actions(self) -> list[str]:
        return [str(job.get("action")) for run in self.runs for job in run.jobs]

    def carried_out(self, action: str) -> int:
        """The runs that carried `action` out: not those that, deciding again under the job's lease, found nothing
        to do any more (a utilisation right at the target, read a moment later)."""
        jobs = [job for run in self.runs for job in run.jobs]
        return sum(job.get("action") == action and job.get("outcome") != CHANGED_MEANWHILE for job in jobs)

    def __enter__(self) -> ApplyLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()  # its own apply, mid-step: the caller's clean-up kills what it launched
        self._thread.join(timeout=120)
