"""Driving the example Kafka job (the windowed job's versions reading a topic, spark_jobs/jobs/windowed/common.py)
from outside, for the demo, the tests and the benchmark: a jobs file for a scratch directory and a broker, a
feeder that produces rounds of events (with a few producer retries: records sent twice, counted once), and a
condition to poll (the job has committed a batch that reached every record produced)."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

from airflow_plugin.core.jobs.spec import JobSpec
from airflow_plugin.core.sinks import delta as delta_sink
from airflow_plugin.core.sources.kafka import kafka_positions
from airflow_plugin.core.storage import Storage, open_storage
from devtools import jvm, windowed
from devtools.kafka import EmbeddedKafka
from devtools.windowed import batches
from spark_jobs.generate import flush_event, poison_event, round_events

VERSIONS = ("v1", "v2", "v3", "poisoned")
# versions whose state is made by a migration function: per country, from v3's per user and country; and the
# same with a migration that returns one key twice (devtools/broken_migration.py: the upgrade must stop)
MIGRATING = {
    "by_country": ("by_country", "spark_jobs.jobs.windowed.migrations:per_country"),
    "by_country_broken": ("by_country", "devtools.broken_migration:twice"),
}
JOB = "kafka_counts"
PARTITIONS = 3
DUPLICATES_PER_ROUND = 5  # records of each round sent a second time, as a retrying producer would


def write_jobs_file(
    directory: Path,
    store: str,
    bootstrap: str,
    topic: str,
    *,
    shuffle_partitions: int = 3,
    max_offsets_per_trigger: int = 2000,
    lake: str | None = None,
    preflight_timeout: float | None = None,
    heartbeat_timeout: str | None = None,
) -> Path:
    """The windowed job's jobs file (devtools/windowed.py) for job `kafka_counts` reading `topic` on `bootstrap`:
    its `kafka` table, and the Kafka connector's jars as the repository's jobs.toml names them (a glob of
    devtools/jvm.py's links, which spark-submit expands). With a `lake` (`s3a://bucket`), the production stack:
    checkpoints under `<lake>/checkpoints` and the output a Delta table, `table_of(lake)` (a local directory as
    the lake: the same on local disk)."""
    groups = ["spark-kafka", *(("s3a",) if lake and lake.startswith("s3a://") else ()), *(("delta",) if lake else ())]
    on_lake: dict[str, Any] = {}  # else the file sink and the checkpoints beside the jobs file
    if lake:
        on_lake = {
            "checkpoint_root": f"{lake}/checkpoints",
            "sink_args": ("--sink", "delta", "--output", table_of(lake)),
        }
    return windowed.write_jobs_file(
        directory,
        store,
        job=JOB,
        versions=VERSIONS,
        migrating=MIGRATING,
        source_args=("--topic", topic, "--max-offsets-per-trigger", str(max_offsets_per_trigger)),
        conf={
            "spark.sql.shuffle.partitions": str(shuffle_partitions),
            "spark.jars": ",".join(str(jvm.link(group) / "*.jar") for group in groups),
            **({**delta_sink.SESSION_CONF, **windowed.SMALL_DELTA_TABLE} if lake is not None else {}),
        },
        table=f'kafka = {{ bootstrap_servers = "{bootstrap}" }}'
        + (f"\npreflight_timeout = {preflight_timeout:g}" if preflight_timeout else "")
        + (f'\nheartbeat_timeout = "{heartbeat_timeout}"' if heartbeat_timeout else ""),
        **on_lake,
    )


def table_of(lake: str) -> str:
    """The Delta table the job writes on a lake."""
    return f"{lake}/output"


class KafkaFeeder:
    """Produces rounds of events to a topic (keyed by user) and keeps count: `events` distinct events (what
    the output must count), `produced` records (with the retried ones), `ends` each partition's next offset."""

    def __init__(self, kafka: EmbeddedKafka, topic: str, events_per_round: int = 100) -> None:
        self.kafka, self.topic, self.events_per_round = kafka, topic, events_per_round
        self.rounds = self.events = self.produced = 0
        self.ends: dict[int, int] = {}
        self.poisoned: dict[int, int] = {}  # `ends` once the latest poison event was produced

    def _produce(self, events: list[dict[str, object]]) -> None:
        records = [(str(e["user"]), json.dumps(e, separators=(",", ":"))) for e in events]
        for partition, offset in self.kafka.produce(self.topic, records):
            self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)
        self.produced += len(records)
        self.rounds += 1

    def round(self) -> None:
        events = round_events(self.rounds, self.events_per_round)
        self.events += len(events)
        self._produce(events + events[:DUPLICATES_PER_ROUND])

    def poison(self) -> None:
        """One poison event (an ordinary event to every version but `poisoned`) as the next round."""
        self.events += 1
        self._produce([poison_event(self.rounds)])
        self.poisoned = dict(self.ends)

    def flush(self) -> None:
        """The flush marker: far in the future, it closes every window (and is never counted)."""
        self._produce([flush_event(self.rounds)])


def committed_offsets(checkpoint: str) -> dict[int, int]:
    """Per partition, the next offset after the latest committed batch (from offsets/N, as the engine parses it)."""
    commits = batches(checkpoint, "commits")
    return _logged_offsets(checkpoint, commits[-1]) if commits else {}


def began_at(checkpoint: str) -> dict[int, int]:
    """Per partition, where the latest committed batch began: the end of the batch before it ({} for none)."""
    commits = batches(checkpoint, "commits")
    return _logged_offsets(checkpoint, commits[-1] - 1) if commits and commits[-1] > 0 else {}


def _logged_offsets(checkpoint: str, batch: int) -> dict[int, int]:
    try:
        lines = open_storage(checkpoint).read(f"offsets/{batch}").decode().splitlines()
    except FileNotFoundError:  # a restored checkpoint begins with the batch it was restored at
        return {}
    found: dict[int, int] = {}
    for position in kafka_positions(int(lines[0][1:]), lines[2:]):
        for partitions in position.offset.values():
            found |= {int(p): int(o) for p, o in partitions.items()}
    return found


def processed(checkpoint: str, ends: dict[int, int]) -> bool:
    """The latest committed batch has read every record up to `ends` (partition -> next offset)."""
    done = committed_offsets(checkpoint)
    return all(done.get(partition, 0) >= end for partition, end in ends.items())


def topic_of(spec: JobSpec) -> str | None:
    """The topic an example Kafka job reads: its `--topic` argument in the jobs file."""
    args = [*spec.args, *(arg for version in spec.versions.values() for arg in version.args)]
    return next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--topic"), None)


def commit_gaps(table: Storage, start: float, end: float, history: float = 300.0) -> tuple[float, float]:
    """The longest time the Delta table went without a commit between `start` and `end` (epoch seconds: an
    upgrade), and the longest between two commits in the `history` seconds before (the job's own rhythm)."""
    commits = delta_sink.commit_times(table)
    before = [t for t in commits if start - history <= t < start]
    during = [t for t in commits if start <= t <= end]
    return longest_gap([*before[-1:], *during, end]), longest_gap(before)


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in pairwise(sorted(times))), default=0.0)
