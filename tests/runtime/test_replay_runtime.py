"""The runtime's side of upgrades that change the state (docs/architecture.md "Replay and migration"): `--seed`,
`state_horizon` in the pre-flight's status, `first_event_time`, `--initial-state` and `--migration`.

In the shared session (`spark`): the seed's files; a migration run of the windowed job's `by_country` from a
real v3 checkpoint (per_country: its state taken in by transformWithState and read back equal), and the same
run failing with MIGRATION_FAILED for each kind of bad function; per_country's deduplication state on rows made
like v3's. One spark-submit on the real broker: v3 seeded at given Kafka positions reads exactly the records
from there on, each once, and reports where its first rows began."""

from __future__ import annotations

import json
import os
from argparse import ArgumentTypeError
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest

from airflow_plugin.core.records.deployment import DeploymentStatus, State
from airflow_plugin.core.snapshots.checkpoint import KAFKA_INITIAL_OFFSETS_PREFIX, OffsetLog
from airflow_plugin.core.sources import files as file_log
from airflow_plugin.core.sources import positions
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.replay import HISTORY, plan_replay
from devtools.jvm import spark_conf
from spark_jobs import generate
from spark_jobs.jobs.windowed import by_country, v1, v3
from spark_jobs.jobs.windowed.common import JOB_CONF, STATE_HORIZON
from spark_jobs.jobs.windowed.migrations import per_country
from spark_jobs.jobs.windowed.output import read_output
from spark_jobs.runtime import Runner, StreamingJob, parse_args
from spark_jobs.runtime.initial import INITIAL_STATE_CONF
from spark_jobs.runtime.migration import MIGRATION_FAILED, OldState, StateOperator
from spark_jobs.runtime.runner import declared_replay
from spark_jobs.runtime.seed import Seed, SeedRefused, apply_seed
from tests.runtime.test_runtime import LAUNCH_TIMEOUT, launch
from tests.support.spark_kinds import unset_confs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from devtools.kafka import EmbeddedKafka


ROOT = Path(__file__).resolve().parents[2]
JOB = "windowed"
FUNCTION = "spark_jobs.jobs.windowed.migrations:per_country"
HERE = "tests.runtime.test_replay_runtime"


def _kafka_offsets(topic: str, **partitions: int) -> str:
    return json.dumps({topic: partitions}, separators=(",", ":"))


# --------------------------------------------------------------------------- without Spark


def test_a_job_declares_its_state_horizon_for_the_preflight_to_report() -> None:
    def declared(horizon: str | None) -> dict[str, int | None]:
        return declared_replay(StreamingJob(writer=None, state_horizon=horizon))  # type: ignore[arg-type]

    assert declared(STATE_HORIZON) == {"state_horizon_ms": 120_000}  # the windowed job's: window + delay
    assert declared("500 ms") == {"state_horizon_ms": 500} and declared(None) == {"state_horizon_ms": None}
    assert declared("1 hour") == {"state_horizon_ms": 3_600_000}  # the engine's grammar: hours, days, words
    with pytest.raises(ArgumentTypeError, match="state_horizon = 'two minutes' is not a duration: give"):
        declared("two minutes")


# --------------------------------------------------------------------------- the seed's files


@pytest.mark.spark
def test_a_seed_writes_the_sources_start_and_an_empty_batch_0_once(spark: SparkSession, tmp_path: Path) -> None:
    offsets = _kafka_offsets("events", **{"0": 7, "1": 3})
    assert apply_seed(spark, str(tmp_path), Seed((offsets,), 120_000)) is True
    assert (tmp_path / "sources/0/0").read_bytes() == KAFKA_INITIAL_OFFSETS_PREFIX + offsets.encode()
    version, metadata, source = (tmp_path / "offsets/0").read_text().split("\n")
    header = json.loads(metadata)
    assert (version, source, header["batchWatermarkMs"]) == ("v1", offsets, 120_000)
    # the session's confs as Spark pins them, none left null (Spark reads a missing one with its legacy default)
    assert header["conf"]["spark.sql.shuffle.partitions"] == spark.conf.get("spark.sql.shuffle.partitions")
    assert None not in header["conf"].values() and "spark.sql.streaming.stateStore.providerClass" in header["conf"]
    assert json.loads((tmp_path / "metadata").read_text())["id"]  # Spark refuses offsets without a query id
    # a restarted deployment continues its own log: the seed is not applied again
    assert apply_seed(spark, str(tmp_path), Seed((_kafka_offsets("events", **{"0": 99}),), 0)) is False
    assert (tmp_path / "offsets/0").read_text().split("\n")[2] == offsets
    with pytest.raises(SeedRefused, match=r"source\(s\) 0 \(file\).*only a Kafka source"):
        apply_seed(spark, str(tmp_path / "files"), Seed(('{"logOffset":3}',), 0))
    assert not (tmp_path / "files" / "offsets").exists()


# --------------------------------------------------------------------------- migration runs, in the shared session


@pytest.fixture(scope="module")
def job_confs(spark: SparkSession) -> Iterator[None]:
    """The windowed job sets its confs on the session (RocksDB, which transformWithState needs): unset after. What
    earlier tests' kinds left on the shared session is unset before: with their minBatchesToRetain of 2 the old
    version's offset log would no longer reach back to where a replay starts."""
    unset_confs(spark)
    yield
    for key in JOB_CONF:
        spark.conf.unset(key)


@pytest.fixture(scope="module")
def v3_checkpoint(spark: SparkSession, job_confs: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v3 on the file source, its state at its last batch: per (window, user, country) counts."""
    work = tmp_path_factory.mktemp("v3")
    for round_no in range(2):
        generate.write_round(work / "input", round_no, 60)
    job = v3.build(spark, ["--input", str(work / "input"), "--output", str(work / "output")])
    query = job.writer.option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start()
    query.awaitTermination()
    return work / "checkpoint"


def _migration_run(
    spark: SparkSession, tmp_path: Path, checkpoint: Path, function: str
) -> tuple[DeploymentStatus, int]:
    """Runner.run of by_country with `--migration`, in the shared session, as the engine launches it."""
    (tmp_path / "input").mkdir(exist_ok=True)
    batch = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    _, metadata, *sources = (checkpoint / f"offsets/{batch}").read_text().split("\n")
    seed = {"offsets": sources, "watermark_ms": json.loads(metadata)["batchWatermarkMs"]}  # what the engine passes
    request = {"function": function, "state": str(checkpoint), "batch_id": batch, "output": str(tmp_path / "initial")}
    request["seed"] = seed
    runtime = ["--store", str(tmp_path / "store"), "--job", JOB, "--deployment", "mg-1", "--checkpoint"]
    runtime += [str(tmp_path / "check"), "--trigger-interval", "1 second", "--delivery", "exactly-once"]
    job = ["--input", str(tmp_path / "input"), "--output", str(tmp_path / "output")]
    args, job_args = parse_args([*runtime, "--migration", json.dumps(request), *job])
    runner = Runner(by_country.build, args, job_args)
    try:
        code = runner.run(lambda: spark)
    finally:  # the run tells the build through the session, which outlives it here (not in an application)
        spark.conf.unset(INITIAL_STATE_CONF)
    status = runner.deployments.status(JOB, "mg-1")
    assert status is not None
    return status, code


@pytest.mark.spark
def test_a_migration_run_makes_the_initial_state_and_reads_it_back_equal(
    spark: SparkSession, v3_checkpoint: Path, tmp_path: Path
) -> None:
    status, code = _migration_run(spark, tmp_path, v3_checkpoint, FUNCTION)
    assert (status.state, status.error_class, code) == (State.STOPPED, None, 0), status.error_message
    report = status.migration or {}
    from pyspark.sql import functions as F

    old = spark.read.format("statestore").load(str(v3_checkpoint))
    windows = old.select("key.window.start", "key.country").distinct().count()
    events = old.agg(F.sum("value.count")).first()
    assert report == {
        "function": FUNCTION,
        "rows": windows,
        "keys": ["window_start", "country"],
        "compared": ["events", "seen"],
        "mismatches": 0,
    }
    initial = spark.read.parquet(str(tmp_path / "initial"))
    assert initial.agg(F.sum("events")).first()[0] == events[0] > 0  # per (user, country) counts summed


def raises(old: OldState) -> DataFrame:
    raise RuntimeError("cannot read the old state")


def wrong_schema(old: OldState) -> DataFrame:
    return per_country(old).withColumnRenamed("events", "count")


def duplicate_keys(old: OldState) -> DataFrame:
    return per_country(old).unionByName(per_country(old))


def null_keys(old: OldState) -> DataFrame:
    from pyspark.sql import functions as F

    return per_country(old).withColumn("country", F.lit(None).cast("string"))


@pytest.mark.spark
@pytest.mark.parametrize(
    ("function", "named"),
    [
        (f"{HERE}:raises", "raised RuntimeError: cannot read the old state"),
        (f"{HERE}:wrong_schema", "wrong schema: column events is missing; column count is not one"),
        (f"{HERE}:duplicate_keys", "duplicate key(s) (window_start, country): window_start="),
        (f"{HERE}:null_keys", "row(s) have a null key column country"),
        (f"{HERE}:no_such_function", "cannot be imported (AttributeError"),
        ("no_such_package.migrations:per_country", "cannot be imported (ModuleNotFoundError"),
    ],
)
def test_a_bad_migration_function_fails_the_run_naming_it(
    spark: SparkSession, v3_checkpoint: Path, tmp_path: Path, function: str, named: str
) -> None:
    status, code = _migration_run(spark, tmp_path, v3_checkpoint, function)
    assert (status.state, status.error_class, code) == (State.FAILED, MIGRATION_FAILED, 1)
    message = status.error_message or ""
    assert message.startswith(f"migration function {function}: ") and named in message, message
    assert not (tmp_path / "check" / "offsets").exists()  # nothing ran: the check comes after the function


def _read_once(spark: SparkSession, job: Callable[..., StreamingJob], work: Path, name: str) -> Path:
    """The windowed job `job` over `work/input`, a file a batch, until it has read every file: its output."""
    args = ["--input", str(work / "input"), "--output", str(work / name), "--max-files-per-trigger", "1"]
    writer = job(spark, args).writer.option("checkpointLocation", str(work / f"{name}-checkpoint"))
    writer.trigger(availableNow=True).start().awaitTermination()
    return work / name


def _by_user_and_window(rows: list[dict[str, Any]], after_ms: int) -> dict[tuple[str, str], int]:
    """Events per (user, window) of the windows ending after `after_ms`, whatever else a row is keyed by."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        if int(datetime.fromisoformat(row["window_end"].replace("Z", "+00:00")).timestamp() * 1000) > after_ms:
            key = (row["user"], row["window_end"])
            counts[key] = counts.get(key, 0) + int(row["events"])
    return counts


@pytest.mark.spark
def test_a_file_source_replay_reads_the_files_since_its_start_and_rebuilds_every_later_window(
    spark: SparkSession, job_confs: None, tmp_path: Path
) -> None:
    """v1 reads six rounds (five minutes of event time each), a file a batch; its savepoint is at the batch that
    read the fifth. The replay the engine plans for v3 (a new grouping key) from v1's checkpoint starts green after
    the files v1 had read before the batch where the state v3 needs begins; the runtime's seed makes Spark skip
    exactly those. Green then writes every window ending after the savepoint's watermark with v1's counts (per
    user, summed over country)."""
    for round_no in range(6):
        generate.write_round(tmp_path / "input", round_no, 60)
    old_output = _read_once(spark, v1.build, tmp_path, "v1")
    old = open_storage(str(tmp_path / "v1-checkpoint"))
    logged = {b: OffsetLog(old).read(b) for b in OffsetLog(old).batch_ids}
    savepoint = min(b for b, batch in logged.items() if batch.source_offsets == ['{"logOffset":4}'])
    watermark = logged[savepoint].watermark_ms
    arguments: dict[str, Any] = dict(
        horizon_ms=declared_replay(v3.build(spark, ["--input", str(tmp_path / "input"), "--output", "-"]))[
            "state_horizon_ms"
        ],
        snapshot_watermark_ms=watermark,
        snapshot_sources=positions(1, logged[savepoint].source_offsets),
        history=OffsetLog(old),
        watermarks=None,
        by_time=None,
        margin_ms=60_000,
    )
    planned = plan_replay(**arguments, missing_files=lambda uris: file_log.missing(uris, open_storage))
    start = planned.start
    assert start is not None and start.found == HISTORY and start.seed is not None and start.files, planned.reason
    read_by_v1 = [e["path"] for e in file_log.log_entries(old, "0")]
    through = start.files["0"]["through"]
    assert len(read_by_v1) == 6 and 0 <= through < 4, f"{planned.reason}: it skips some files, not all"

    green = tmp_path / "v3-checkpoint"
    assert apply_seed(spark, str(green), Seed.of(start.seed)) is True
    green_output = _read_once(spark, v3.build, tmp_path, "v3")
    green_read = [e for e in file_log.log_entries(open_storage(str(green)), "0") if e["batchId"] < 1 << 40]
    assert [e["path"] for e in green_read] == read_by_v1[through + 1 :], "green read the files after, each once"
    expected = _by_user_and_window(read_output(old_output), watermark)
    assert expected and _by_user_and_window(read_output(green_output), watermark) == expected

    # a file it must read again gone from the input (a job that cleans its source): replay is no path
    Path(urlparse(read_by_v1[-1]).path).unlink()
    refused = plan_replay(**arguments, missing_files=lambda uris: file_log.missing(uris, open_storage))
    assert refused.start is None and f"1 of them are gone from the input ({read_by_v1[-1]})" in refused.reason


@pytest.mark.spark
def test_by_country_counts_each_event_once_per_country_and_window(
    spark: SparkSession, job_confs: None, tmp_path: Path
) -> None:
    """A file a batch: round 0; round 1 in two files, its later half first (the second file's events are older
    than the watermark Spark evicts by in that batch, not than the one it drops late records by: counted, as v3
    counts them); a retry of round 1's latest event (a duplicate, not late); the flush marker that closes every
    window. Each window is emitted once, when the watermark passes it, with every event."""
    written = [generate.write_round(tmp_path / "input", round_no, 60) for round_no in (0, 1)]
    events = [json.loads(line) for w in written for line in Path(w.path).read_text().splitlines()]
    round_1 = sorted(events[60:], key=lambda event: str(event["event_time"]))
    Path(written[1].path).unlink()
    for part, name in ((round_1[30:], "a-later"), (round_1[:30], "b-earlier")):
        (tmp_path / "input" / f"events-r00001-{name}.json").write_text("".join(json.dumps(e) + "\n" for e in part))
    retried = round_1[-1]
    (tmp_path / "input" / "events-r00001-s0-retry.json").write_text(json.dumps(retried) + "\n")
    generate.write_flush(tmp_path / "input", 2)
    for order, path in enumerate(sorted((tmp_path / "input").glob("*.json"))):  # the file source reads by age
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
    job = by_country.build(spark, ["--input", str(tmp_path / "input"), "--output", str(tmp_path / "output")])
    query = job.writer.option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
    query.awaitTermination()
    rows = read_output(tmp_path / "output")
    expected: dict[tuple[str, str], int] = {}
    for event in events:
        minute = str(event["event_time"])[:16]  # "2025-01-01T00:13": the one-minute window's start
        expected[(minute, str(event["country"]))] = expected.get((minute, str(event["country"])), 0) + 1
    got = {(str(row["window_start"])[:16], row["country"]): row["events"] for row in rows}
    assert got == expected and len(rows) == len(expected)  # each window once, the retry not counted
    assert {row["version"] for row in rows} == {"by_country"}
    assert all(str(row["window_end"])[:16] > str(row["window_start"])[:16] for row in rows)


class _Rows:
    """An OldState made of rows shaped as Spark's state reader gives v3's (Kafka) operators."""

    def __init__(self, spark: SparkSession, counts: list[Any], seqs: list[Any]) -> None:
        self.operators = [StateOperator(0, "dedupeWithinWatermark", "default", [])]
        self.operators.append(StateOperator(1, "stateStoreSave", "default", []))
        self._frames = {
            "stateStoreSave": spark.createDataFrame(
                counts,
                "key struct<window: struct<start: timestamp, end: timestamp>, user: string, country: string>, "
                "value struct<count: long>",
            ),
            "dedupeWithinWatermark": spark.createDataFrame(
                seqs, "key struct<seq: long>, value struct<expiresAtMicros: long>"
            ),
        }

    def read(self, operator: str) -> DataFrame:
        return self._frames[operator]


@pytest.mark.spark
def test_per_country_sums_per_country_and_gives_each_seq_to_every_country_of_its_window(spark: SparkSession) -> None:
    start = datetime(2025, 1, 1, 0, 13, tzinfo=UTC)
    window = (start, start + timedelta(minutes=1))
    expires = int((start + timedelta(seconds=20 + 60)).timestamp() * 1_000_000)  # event time + the 1-minute delay
    counts = [((window, "u1", "DE"), (2,)), ((window, "u2", "DE"), (3,)), ((window, "u1", "NL"), (1,))]
    seqs = [((11,), (expires,)), ((12,), (expires + 1,)), ((99,), (expires + 120_000_000,))]  # 99: a later window
    rows = per_country(_Rows(spark, counts, seqs)).collect()  # type: ignore[arg-type]
    got = {(row.country, row.events, tuple(sorted(row.seen))) for row in rows}
    assert got == {("DE", 5, (11, 12)), ("NL", 1, (11, 12))}
    assert {row.window_start.replace(tzinfo=None) for row in rows} == {_local(start)}


def _local(moment: datetime) -> datetime:
    """A timestamp as pyspark returns it: naive, in the Python process's local time."""
    return datetime.fromtimestamp(moment.timestamp())


# --------------------------------------------------------------------------- a seeded start on the real broker


@pytest.mark.spark
def test_a_seeded_start_reads_exactly_from_the_seed_positions(
    kafka: EmbeddedKafka, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Records before the seed have the earliest event times: read by mistake, they would show in the output
    and in `first_rows`. The seeded watermark is the first batch's, and the data moves it no further. With a
    boundary (a replay by broker timestamps) batch 0 reads exactly the record before the start of a partition that
    holds one (partition 0 here; partition 1's boundary is its start): their event times are what the replay checks."""
    topic = new_topic(partitions=2)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for partition in (0, 1):
        times = [start + timedelta(seconds=10 * offset + partition) for offset in range(8)]
        events = [{"user": "u1", "country": "DE", "event_time": t.isoformat(), "seq": 0} for t in times]
        kafka.produce(topic, [json.dumps(event) for event in events], partition=partition)
    seed_at = {0: 3, 1: 5}
    watermark = int((start + timedelta(minutes=5)).timestamp() * 1000)  # later than every record's time - delay
    boundary_at = {0: 2, 1: 5}
    seed = {
        "offsets": [_kafka_offsets(topic, **{str(p): o for p, o in seed_at.items()})],
        "boundary": [_kafka_offsets(topic, **{str(p): o for p, o in boundary_at.items()})],
        "watermark_ms": watermark,
    }
    output, checkpoint = tmp_path / "output", tmp_path / "checkpoint"
    job_args = ("--topic", topic, "--kafka-bootstrap-servers", kafka.bootstrap, "--output", str(output))
    started = launch(
        Path(__file__).with_name("kafka_records_app.py"),
        str(tmp_path / "store"),
        "dp-seeded",
        checkpoint,
        tmp_path,
        "--seed",
        json.dumps(seed),
        *job_args,
        trigger="available-now",
        conf=spark_conf(["spark-kafka"]),
    )
    try:
        # the timeout covers the driver's start and the whole run, on a shared machine
        ended = (State.STOPPED, State.FAILED)
        status = started.wait_for(lambda s: s.state in ended, "the run's end", LAUNCH_TIMEOUT * 2)
    finally:
        started.kill()
    assert status.state is State.STOPPED, f"{status.error_class}: {status.error_message}\n{started.tail()}"
    read = [(row["partition"], row["offset"]) for row in read_output(output)]
    assert sorted(read) == [(p, o) for p in (0, 1) for o in range(boundary_at[p], 8)]  # each once, none before
    boundary = start + timedelta(seconds=10 * boundary_at[0])  # partition 0's offset 2: batch 0's one record
    first = status.first_rows
    assert first is not None and first["batch"] == 0, first
    assert {datetime.fromisoformat(first[k].replace("Z", "+00:00")) for k in ("min", "max")} == {boundary}
    batches = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    assert batches[0] == 0 and len(batches) >= 2
    logged = [json.loads((checkpoint / f"offsets/{b}").read_text().split("\n")[1]) for b in batches]
    assert {entry["batchWatermarkMs"] for entry in logged} == {watermark}
