"""Driving the example windowed job from outside, for the demo, the tests and the benchmarks: a jobs file
for a scratch directory, a feeder of event rounds, and conditions to poll (a batch has read the n-th input
file; the output holds every event)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from airflow_plugin.core.jobs.context import JobContext
from airflow_plugin.core.records.deployment import State
from airflow_plugin.core.storage import open_storage
from spark_jobs.generate import write_flush, write_poison, write_round
from spark_jobs.jobs.windowed.output import read_output, summarize

REPO = Path(__file__).resolve().parents[1]
APPS = REPO / "spark_jobs/jobs/windowed"
VERSIONS = ("v1", "v2", "v3", "regrouped", "poisoned")
SPARK_UI = {"spark.ui.enabled": "true", "spark.ui.port": "0"}  # each driver's UI on a free port


# Delta replays its log in 50 tasks by default (spark.databricks.delta.snapshotPartitions), meant for a
# cluster: the example tables are small and the machine has 2 cores
SMALL_DELTA_TABLE = {"spark.databricks.delta.snapshotPartitions": "2"}


def write_jobs_file(
    directory: Path,
    store: str,
    *,
    job: str = "windowed",
    trigger: str = "1 second",
    apps: Path = APPS,
    versions: tuple[str, ...] = VERSIONS,
    partitions: int = 3,
    source_args: tuple[str, ...] = ("--input", "input"),
    conf: dict[str, str] | None = None,
    table: str = "",
    checkpoint_root: str = "checkpoints",
    sink_args: tuple[str, ...] = ("--output", "output"),
    migrating: dict[str, tuple[str, str]] | None = None,
) -> Path:
    """A jobs file whose job reads `<directory>/input` (or what `source_args` say), writes `<directory>/output`,
    keeps logs (and checkpoints, unless `checkpoint_root` says where) under `directory`, and declares the
    example versions (the windowed job's, or those in `apps`). `conf` adds Spark confs, `table` lines to the
    job's table (its `kafka`), `sink_args` where the output goes instead (`--sink delta --output s3a://...`),
    `migrating` versions that migrate the state: name -> (the application's name in `apps`, its function)."""
    declared = "\n".join(
        [f'versions.{v} = {{ application = "{apps / v}.py" }}' for v in versions]
        + [
            f'versions.{v} = {{ application = "{apps / app}.py", migrate = "{function}" }}'
            for v, (app, function) in (migrating or {}).items()
        ]
    )
    confs = {"spark.sql.shuffle.partitions": str(partitions), **SPARK_UI, **(conf or {})}
    args = ", ".join(f'"{arg}"' for arg in (*source_args, *sink_args))
    path = directory / "jobs.toml"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"""
[defaults]
store = "{store}"
checkpoint_root = "{checkpoint_root}"
log_dir = "logs"
heartbeat_timeout = 30

[jobs.{job}]
description = "events per user and minute"
trigger_interval = "{trigger}"
default_version = "v1"
args = [{args}]
conf = {{ {", ".join(f'"{key}" = "{value}"' for key, value in confs.items())} }}
{table}
{declared}
retention.checkpoint = {{ keep_last = 2 }}
retention.savepoint = {{ keep_last = 5 }}
"""
    )
    return path


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def batches(checkpoint: str, log: str) -> list[int]:
    """Batch ids in a metadata log (`offsets`, `commits`) of a checkpoint: a local path or an S3 location."""
    names = (info.key.removeprefix(f"{log}/") for info in open_storage(checkpoint).list(f"{log}/"))
    return sorted(int(name) for name in names if name.isdigit())


def processed(checkpoint: str, files_fed: int) -> bool:
    """The latest committed batch has read the `files_fed`-th input file (file source logOffset)."""
    commits = batches(checkpoint, "commits")
    if not commits:
        return False
    lines = open_storage(checkpoint).read(f"offsets/{commits[-1]}").decode().splitlines()
    return json.loads(lines[2]).get("logOffset", -1) >= files_fed - 1


class Feeder:
    """Writes rounds of events (and the flush marker that closes the last windows) into the input."""

    def __init__(self, input_dir: Path, events_per_round: int = 300) -> None:
        self.input_dir, self.events_per_round = input_dir, events_per_round
        self.rounds = self.events = 0
        input_dir.mkdir(parents=True, exist_ok=True)

    def round(self) -> None:
        self.events += write_round(self.input_dir, self.rounds, self.events_per_round).events
        self.rounds += 1

    def poison(self) -> None:
        """One poison event (an ordinary event to every version but `poisoned`) as the next round."""
        self.events += write_poison(self.input_dir, self.rounds).events
        self.rounds += 1

    def flush(self) -> None:
        write_flush(self.input_dir, self.rounds)
        self.rounds += 1


@contextmanager
def feeding_version(job: JobContext, feed: Feeder, version: str, every: float = 3.0) -> Iterator[None]:
    """While the block runs, feed a round whenever the job's newest deployment is of `version`, RUNNING and caught up
    with what was fed: an upgrade's health gate counts the new version's batches, which need new input."""
    done = threading.Event()

    def keep_feeding() -> None:
        while not done.wait(every):
            newest = job.deployments.list(job.name)[-1]
            status = job.deployments.status(job.name, newest.id)
            running = newest.version == version and status is not None and status.state is State.RUNNING
            if running and processed(newest.checkpoint, feed.rounds):
                feed.round()

    feeder = threading.Thread(target=keep_feeding, name="feeding", daemon=True)
    feeder.start()
    try:
        yield
    finally:
        done.set()
        feeder.join()


def output_complete(output: Path, events: int) -> bool:
    """After the flush marker, the windows close in the no-data batch that follows its batch."""
    return summarize(read_output(output)).events >= events


def wait_output_complete(output: Path, events: int) -> None:
    wait_for(lambda: output_complete(output, events), "the last windows to be emitted")
