"""The job runtime (spark_jobs/runtime), the windowed example jobs and the generator.

Fast tests without Spark first (argument parsing, delivery rules, error classes, status board, control
channel, generator, output reader). Then real spark-submit processes, few of them, each checked for
several things, in one ordered scenario on one input directory and one S3 store (moto server):

  1. v1 starts: STARTING -> RUNNING, batches advance; `stop` ends it at a batch boundary within the
     trigger interval + a few seconds, exit 0, STOPPED, the request id recorded;
  2. v3 on a copy of v1's checkpoint with new input: FAILED with Spark's error class, exit non-zero;
  3. v2 (state-compatible) continues v1's checkpoint; `stop` with drain processes the input written
     before the request (including the flush marker), then stops: every event counted exactly once;
and a job declaring a console sink is refused under exactly-once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_plugin.core.jobs.deployments import Deployments, new_request_id
from airflow_plugin.core.jobs.deployments import describe as describe_deployment
from airflow_plugin.core.records.deployment import ControlRequest, Deployment, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from devtools.embedded_s3 import EmbeddedS3
from spark_jobs import generate
from spark_jobs.jobs.windowed.output import committed_files, read_output, summarize
from spark_jobs.runtime import Delivery, DeliveryRefused, Runner, SinkKind, SourceKind, StreamingJob, parse_args
from spark_jobs.runtime.control import ControlChannel
from spark_jobs.runtime.delivery import check, plan
from spark_jobs.runtime.failure import describe
from spark_jobs.runtime.status import ProgressListener, StatusBoard, kafka_lag, records_read

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = ROOT / "spark_jobs" / "jobs" / "windowed"
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
JOB = "windowed"
EVENTS_PER_ROUND = 300
TRIGGER = "2 seconds"
TRIGGER_SECONDS = 2.0
STOP_SLACK = 4.0  # "a few seconds" on top of the trigger interval, on a loaded 2-core machine
LAUNCH_TIMEOUT = 120.0


# --------------------------------------------------------------------------- without Spark


def test_common_args_are_parsed_and_the_rest_goes_to_the_job_in_order() -> None:
    args, rest = parse_args(
        [
            *("--store", "s3://b/p", "--job", "j", "--deployment", "d", "--input", "in"),
            *("--checkpoint", "/c", "--trigger-interval", "500 ms", "--delivery", "exactly-once", "--output", "o"),
        ]
    )
    assert (args.store, args.job, args.deployment, args.checkpoint) == ("s3://b/p", "j", "d", "/c")
    assert args.trigger.seconds == 0.5 and args.delivery is Delivery.EXACTLY_ONCE
    assert rest == ["--input", "in", "--output", "o"]
    with pytest.raises(SystemExit):  # a missing common option is a usage error (exit 2)
        parse_args(["--store", "s", "--job", "j", "--deployment", "d", "--checkpoint", "c"])


def test_trigger_intervals() -> None:
    base = ["--store", "s", "--job", "j", "--deployment", "d", "--checkpoint", "c", "--delivery", "at-least-once"]
    assert parse_args([*base, "--trigger-interval", "1 minute"])[0].trigger.seconds == 60
    available_now = parse_args([*base, "--trigger-interval", "available-now"])[0].trigger
    assert available_now.available_now and available_now.spark_kwargs() == {"availableNow": True}
    assert parse_args([*base, "--trigger-interval", "2 seconds"])[0].trigger.spark_kwargs() == {
        "processingTime": "2000 milliseconds"
    }
    with pytest.raises(SystemExit):
        parse_args([*base, "--trigger-interval", "soon"])


@pytest.mark.parametrize(
    ("text", "seconds", "processing_time"),
    [
        ("1 hour", 3600.0, "3600000 milliseconds"),  # refused before issue 43's one grammar (no hours)
        ("2 days", 172800.0, "172800000 milliseconds"),
        ("1.5 h", 5400.0, "5400000 milliseconds"),
        ("90 seconds", 90.0, "90000 milliseconds"),
        (" 2 MIN ", 120.0, "120000 milliseconds"),
        ("500ms", 0.5, "500 milliseconds"),
        ("0.1 ms", 0.0001, "1 milliseconds"),  # never 0, which Spark takes for "as fast as possible"
    ],
)
def test_the_runtime_reads_trigger_intervals_in_the_engines_grammar(
    text: str, seconds: float, processing_time: str
) -> None:
    from airflow_plugin.core.durations import duration_seconds
    from spark_jobs.runtime.args import parse_duration, parse_trigger

    trigger = parse_trigger(text)
    assert trigger.seconds == pytest.approx(seconds) == duration_seconds(text, "trigger_interval")
    assert parse_duration(text, "state_horizon") == trigger.seconds
    assert trigger.spark_kwargs() == {"processingTime": processing_time}  # a form Spark's trigger() reads


def test_the_runtimes_seconds_options_take_plain_seconds_or_durations(capsys: pytest.CaptureFixture[str]) -> None:
    from spark_jobs.runtime.script import _parser as script_parser

    base = ["--store", "s", "--job", "j", "--deployment", "d", "--checkpoint", "c", "--delivery", "at-least-once"]
    base += ["--trigger-interval", "1 hour"]
    args = parse_args([*base, "--heartbeat-interval", "500 ms", "--poll-interval", "2"])[0]
    assert (args.heartbeat_interval, args.poll_interval, args.trigger.seconds) == (0.5, 2.0, 3600.0)
    with pytest.raises(SystemExit):
        parse_args([*base, "--poll-interval", "0"])
    assert "--poll-interval = '0' must be longer than 0" in capsys.readouterr().err
    own = script_parser().parse_known_args(["--script", "s.py", "--script-start-timeout", "1 minute"])[0]
    assert own.script_start_timeout == 60.0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("soon", "is not a duration"),
        ("5", "needs a unit"),  # as before: the runtime's durations take no bare number
        ("0 seconds", "must be longer than 0"),
        ("-1 s", "must not be negative"),
        ("1 fortnight", "has an unknown unit 'fortnight'"),
        ("1 hour 5 minutes", "is not a duration"),
    ],
)
def test_a_trigger_interval_the_grammar_refuses_is_a_usage_error_that_lists_the_forms(text: str, problem: str) -> None:
    from argparse import ArgumentTypeError

    from spark_jobs.runtime.args import parse_trigger

    with pytest.raises(ArgumentTypeError) as info:
        parse_trigger(text)
    message = str(info.value)
    assert message.startswith(f"trigger interval = {text!r} {problem}: give a number and a unit"), message
    assert '"1 hour", "2 days"' in message and message.endswith("; or available-now")


def _job(sink: SinkKind, source: SourceKind = SourceKind.FILE) -> StreamingJob:
    return StreamingJob(writer=None, sink=sink, source=source)  # type: ignore[arg-type]  # never started


@pytest.mark.parametrize("sink", [SinkKind.KAFKA, SinkKind.CONSOLE, SinkKind.MEMORY, SinkKind.FOREACH])
def test_exactly_once_refuses_sinks_known_not_to_be_idempotent(sink: SinkKind) -> None:
    with pytest.raises(DeliveryRefused, match=f"exactly-once refuses the {sink} sink"):
        check(Delivery.EXACTLY_ONCE, _job(sink))
    assert check(Delivery.AT_LEAST_ONCE, _job(sink)) == []  # at-least-once takes any sink


def test_exactly_once_rules() -> None:
    for sink in (SinkKind.FILE, SinkKind.IDEMPOTENT_FOREACH_BATCH, SinkKind.NOOP):
        assert check(Delivery.EXACTLY_ONCE, _job(sink)) == []
    with pytest.raises(DeliveryRefused, match="IDEMPOTENT_FOREACH_BATCH"):
        check(Delivery.EXACTLY_ONCE, _job(SinkKind.FOREACH_BATCH))
    with pytest.raises(DeliveryRefused, match="did not declare its sink"):
        check(Delivery.EXACTLY_ONCE, _job(SinkKind.UNKNOWN))
    with pytest.raises(DeliveryRefused, match="did not declare its source"):
        check(Delivery.EXACTLY_ONCE, _job(SinkKind.FILE, SourceKind.UNKNOWN))
    with pytest.raises(DeliveryRefused, match="rewindable"):
        check(Delivery.AT_LEAST_ONCE, _job(SinkKind.FILE, SourceKind.SOCKET))


def test_delivery_plans_their_checkpoints() -> None:
    exactly = plan(Delivery.EXACTLY_ONCE, _job(SinkKind.FILE), "s3a://b/ckpt/job/dp-1")
    assert (exactly.checkpoint, exactly.throwaway) == ("s3a://b/ckpt/job/dp-1", False)
    first = plan(Delivery.AT_MOST_ONCE, _job(SinkKind.CONSOLE, SourceKind.KAFKA), "/c/job/dp-1/")
    second = plan(Delivery.AT_MOST_ONCE, _job(SinkKind.CONSOLE, SourceKind.KAFKA), "/c/job/dp-1/")
    assert first.throwaway and first.checkpoint.startswith("/c/job/dp-1/at-most-once-")
    assert first.checkpoint != second.checkpoint and first.warnings == []  # never resumed
    assert plan(Delivery.AT_MOST_ONCE, _job(SinkKind.FILE), "/c").warnings  # a file source re-reads everything


class _Wrapped(Exception):
    def getCondition(self) -> str:  # what pyspark's StreamingQueryException answers
        return "STREAM_FAILED"


def test_failure_names_the_cause_not_the_wrapper() -> None:
    message = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE]"
        " Provided key schema does not match.\n=== Streaming Query ===\nIdentifier: [PLAN]\n\nJVM stacktrace:\n..."
    )
    failure = describe(_Wrapped(message))
    assert failure.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    assert failure.message == "[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match."
    assert describe(ValueError("boom")).error_class == "ValueError"


def test_status_board_never_overwrites_a_final_state(tmp_path: Path) -> None:
    deployments = Deployments(open_storage(str(tmp_path)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    assert board.promote(State.STARTING, State.RUNNING) and not board.promote(State.STARTING, State.RUNNING)
    board.acknowledge("rq-1", State.STOPPING)
    board.finish(State.STOPPED)
    board.update(last_batch_id=7)  # a late listener event
    board.beat()
    status = deployments.status("j", "d")
    assert status is not None
    assert (status.state, status.last_batch_id, status.handled_requests) == (State.STOPPED, None, ["rq-1"])


def test_the_listener_reports_sources_and_kafka_lag_from_sparks_progress(tmp_path: Path) -> None:
    """Spark's progress JSON (its fields as Spark names them): the sources' descriptions, and the most records
    any Kafka partition is behind, at the last batch and at the run's first."""
    deployments = Deployments(open_storage(str(tmp_path)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    listener = ProgressListener(board)

    def progress(batch: int, behind: str | None) -> dict[str, Any]:
        kafka = {"description": "KafkaV2[Subscribe[events]]", "metrics": {"maxOffsetsBehindLatest": behind}}
        if behind is None:
            kafka["metrics"] = {}
        files = {"description": "FileStreamSource[file:/in]", "metrics": {}}
        return {"id": "q", "batchId": batch, "sources": [kafka, files], "sink": {"description": "FileSink[/out]"}}

    listener.progress(progress(7, "1200"))
    listener.progress(progress(8, "300"))
    status = deployments.status("j", "d")
    assert status is not None and status.state is State.RUNNING and status.last_batch_id == 8
    assert status.sources == ["KafkaV2[Subscribe[events]]", "FileStreamSource[file:/in]"]
    assert (status.kafka_lag, status.kafka_lag_first) == (300, 1200)
    shown = describe_deployment(Deployment("d", "j", "v1", "c"), status, status.state)  # the page's and status' row
    assert shown["kafka_lag"] == 300
    assert kafka_lag(progress(9, None)["sources"]) is None and kafka_lag([]) is None


def test_the_listener_ignores_the_standby_warm_up_query(tmp_path: Path) -> None:
    """A standby runs its version's query once to warm up (runner.py) before it follows any query: that batch
    is not the deployment's and must not move its state or batch id."""
    deployments = Deployments(open_storage(str(tmp_path)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    board.update()
    listener = ProgressListener(board)
    listener.ignore("warm-up")
    listener.progress({"id": "warm-up", "batchId": 0, "numInputRows": 2000})
    listener.idle("warm-up")
    status = deployments.status("j", "d")
    assert status is not None and (status.state, status.last_batch_id) == (State.STARTING, None)
    listener.progress({"id": "q", "batchId": 21, "numInputRows": 5})
    status = deployments.status("j", "d")
    assert status is not None and (status.state, status.last_batch_id) == (State.RUNNING, 21)


def test_rows_per_second_covers_the_last_minute_and_the_state_is_reported_per_operator(tmp_path: Path) -> None:
    """A query with a watermark follows each batch of data with a no-data batch: Spark's processedRowsPerSecond
    of the last batch is then 0 while the job is busy (the page showed 0). The runtime's own figure is not."""
    deployments = Deployments(open_storage(str(tmp_path)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    now = [1000.0]
    listener = ProgressListener(board, clock=lambda: now[0])
    state = [{"operatorName": "stateStoreSave", "numRowsTotal": 40, "memoryUsedBytes": 900, "numShufflePartitions": 2}]
    for batch, rows in enumerate([600, 0, 600, 0]):  # data, then the watermark's no-data batch, every 10 s
        now[0] += 10
        listener.progress({"id": "q", "batchId": batch, "numInputRows": rows, "processedRowsPerSecond": 0.0,
                           "stateOperators": state if rows else []})  # fmt: skip
    status = deployments.status("j", "d")
    assert status.processed_rows_per_second == 0.0 and status.rows_per_second == 1200 / 40
    assert status.input_rows_total == 1200
    assert status.state_operators == [
        {"name": "stateStoreSave", "rows": 40, "memory_bytes": 900, "partitions": 2, "batch_id": 2}
    ]  # a no-data batch that reports no operator keeps the last report
    now[0] += 100  # nothing for longer than the window: the rate falls to 0
    listener.idle("q")
    idle = deployments.status("j", "d")
    assert idle.rows_per_second == 0
    assert idle.load[-1] == {"t": 1140, "batches": 0, "rows": 0, "busy_ms": 0, "backlog": None}, "measured as idle"


def test_the_listener_counts_batches_that_read_input_but_processed_none(tmp_path: Path) -> None:
    """A sink that skips batches it already holds leaves exactly this in Spark's progress: the sources' offsets
    advance, numInputRows is 0 (the batch's plan never ran). Spark's progress fields as a fresh deployment onto
    an earlier deployment's file sink reported them (pyspark 4.2)."""
    deployments = Deployments(open_storage(str(tmp_path)))
    board = StatusBoard(deployments, "j", "d", DeploymentStatus(State.STARTING, time.time()))
    listener = ProgressListener(board)

    def batch(number: int, start: dict[str, Any] | None, end: dict[str, Any], rows: int) -> dict[str, Any]:
        kafka = {"description": "KafkaV2[Subscribe[events]]", "startOffset": start, "endOffset": end, "metrics": {}}
        sink = {"description": "FileSink[file:/out]", "numOutputRows": -1}
        return {"id": "q", "batchId": number, "numInputRows": rows, "sources": [kafka], "sink": sink}

    def offsets(*values: int) -> dict[str, Any]:
        return {"events": {str(p): v for p, v in enumerate(values)}}

    listener.progress(batch(0, None, offsets(40, 40), 0))  # a first batch has no start: not judged
    assert deployments.status("j", "d").unprocessed is None
    listener.progress(batch(1, offsets(40, 40), offsets(41, 41), 0))  # a commit marker per partition: not counted
    listener.progress(batch(2, offsets(41, 41), offsets(60, 41), 0))
    status = deployments.status("j", "d")
    assert status.unprocessed == {"first": 2, "last": 2, "batches": 1, "streak": 1, "records": 19}
    assert status.skipping() is None  # one batch can be an empty input
    listener.progress(batch(3, offsets(60, 41), offsets(70, 51), 0))
    status = deployments.status("j", "d")
    assert status.unprocessed == {"first": 2, "last": 3, "batches": 2, "streak": 2, "records": 39}
    reason = status.skipping()
    assert reason is not None and "batches 2..3 advanced their sources (39 Kafka records by their offsets)" in reason
    assert "the sink FileSink[file:/out] skipped them as already written" in reason
    listener.progress(batch(4, offsets(70, 51), offsets(70, 51), 0))  # no new data (the watermark moves): kept
    assert deployments.status("j", "d").skipping() is not None
    listener.progress(batch(5, offsets(70, 51), offsets(80, 51), 10))  # processed rows: the run is not skipping now
    status = deployments.status("j", "d")
    assert status.skipping() is None and status.unprocessed["batches"] == 2 and status.unprocessed["streak"] == 0
    assert (
        records_read(
            [
                {
                    "description": "FileStreamSource[file:/in]",
                    "startOffset": '{"logOffset": 0}',
                    "endOffset": '{"logOffset": 1}',
                }
            ]
        )
        == 1
    )


def test_control_channel_hands_out_each_request_once(tmp_path: Path) -> None:
    deployments = Deployments(open_storage(str(tmp_path)))
    channel = ControlChannel(deployments, "j", "d", handled=["rq-old"])
    assert channel.next_stop() is None
    deployments.request("j", "d", ControlRequest("rq-old", "stop", requested_at=1))
    deployments.request("j", "d", ControlRequest("rq-odd", "rescale", requested_at=2))
    deployments.request("j", "d", ControlRequest("rq-new", "stop", drain=True, requested_at=3))
    request = channel.next_stop()
    assert request is not None and (request.id, request.drain) == ("rq-new", True)
    assert channel.next_stop() is None


class _FakeSession:
    """Just enough of a SparkSession for the paths that end before a query starts."""

    sparkContext = SimpleNamespace(applicationId="local-fake", uiWebUrl=None)
    streams = SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None)


def _run_without_spark(tmp_path: Path, build: Callable[..., Any]) -> tuple[DeploymentStatus, int]:
    """Runner.run on a fake session, exactly-once; the final status and the exit code."""
    common = ["--store", str(tmp_path), "--job", "j", "--deployment", "d", "--checkpoint", str(tmp_path / "c")]
    args, job_args = parse_args([*common, "--trigger-interval", "1 second", "--delivery", "exactly-once", "--flag"])
    runner = Runner(build, args, job_args)
    code = runner.run(lambda: _FakeSession())  # type: ignore[arg-type, return-value]
    status = runner.deployments.status("j", "d")
    assert status is not None
    return status, code


def test_failures_before_the_query_starts_end_failed_with_a_class_and_exit_code(tmp_path: Path) -> None:
    def rejects_args(spark: Any, job_args: list[str]) -> StreamingJob:
        assert job_args == ["--flag"]
        raise SystemExit(2)

    def breaks(spark: Any, job_args: list[str]) -> StreamingJob:
        raise ValueError("no such column")

    def console(spark: Any, job_args: list[str]) -> StreamingJob:
        return _job(SinkKind.CONSOLE, SourceKind.RATE)

    cases = [(rejects_args, "JOB_ARGUMENTS_REJECTED", 2), (breaks, "ValueError", 1)]
    cases.append((console, "DELIVERY_GUARANTEE_NOT_MET", 3))
    for index, (build, error_class, expected_code) in enumerate(cases):
        status, code = _run_without_spark(tmp_path / str(index), build)
        assert (status.state, status.error_class, code) == (State.FAILED, error_class, expected_code)
        assert status.app_id == "local-fake" and status.pid == os.getpid()


@pytest.mark.spark
def test_the_standby_warm_up_runs_one_batch_of_the_query_and_leaves_its_sink_and_session_alone(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up (runner.py) runs the version's own stateful query once, to noop on a throwaway checkpoint
    with a few state partitions: the job's sink gets nothing, no query is left running, and the session's
    partitions setting (which a fresh start of the real query takes) is as it was."""
    output = tmp_path / "out"

    def build(session: Any, job_args: list[str]) -> StreamingJob:
        deduplicated = session.readStream.format("rate").option("rowsPerSecond", 100).load().dropDuplicates(["value"])
        writer = deduplicated.writeStream.format("parquet").option("path", str(output)).outputMode("append")
        return StreamingJob(writer, SinkKind.FILE, SourceKind.RATE)

    common = ["--store", str(tmp_path / "store"), "--job", "j", "--deployment", "d", "--checkpoint", "c"]
    runner = Runner(
        build, *parse_args([*common, "--trigger-interval", "1 second", "--delivery", "at-least-once", "--standby"])
    )
    runner.spark = spark
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    try:
        with caplog.at_level("INFO", logger="spark_jobs.runtime.runner"):
            runner._warm_up_query()
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert "standby: warm-up query ran its batch 0" in caplog.text
    assert [q.name for q in spark.streams.active if q.name == "j-warm-up"] == []
    assert not output.exists() and not (tmp_path / "c").exists()


def test_a_stop_requested_before_the_start_is_honoured_without_starting(tmp_path: Path) -> None:
    Deployments(open_storage(str(tmp_path))).request("j", "d", ControlRequest("rq-early", "stop"))
    status, code = _run_without_spark(tmp_path, lambda spark, job_args: _job(SinkKind.FILE))  # writer never used
    assert (status.state, status.handled_requests, code) == (State.STOPPED, ["rq-early"], 0)


def test_generator_is_deterministic_and_atomic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.round_events(3, 50, seed=7) == generate.round_events(3, 50, seed=7)
    assert generate.round_events(3, 50, seed=7) != generate.round_events(3, 50, seed=8)
    assert generate.main(["--input", str(tmp_path), "--events", "50", "--round", "3", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["events"] == 50 and written["first_event_time"] >= "2025-01-01T00:15:00"
    assert written["last_event_time"] < "2025-01-01T00:20:00"
    assert [p.name for p in tmp_path.iterdir()] == ["events-r00003-s0.json"]  # no temp file left
    assert generate.main(["--input", str(tmp_path), "--events", "50", "--round", "3"]) == 2  # never rewritten
    assert generate.main(["--input", str(tmp_path), "--round", "4", "--flush"]) == 0
    assert "flush" in capsys.readouterr().out


def test_output_reader_counts_only_committed_files(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()

    def part(name: str, *rows: dict[str, Any]) -> str:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return json.dumps({"path": f"file://{tmp_path / name}", "action": "add"})

    row = {"user": "u1", "window_start": "2025-01-01T00:00:00.000Z", "events": 2, "version": "v1"}
    (log / "9.compact").write_text("v1\n" + part("a.json", row) + "\n")
    (log / "10").write_text("v1\n" + part("b.json", {**row, "user": "u2", "events": 3}) + "\n")
    (log / "3").write_text("v1\n" + part("old.json", {**row, "user": "u9"}) + "\n")  # folded into 9.compact
    part("uncommitted.json", row)  # a killed batch's leftover: not in the log
    assert sorted(p.name for p in committed_files(tmp_path)) == ["a.json", "b.json"]
    summary = summarize(read_output(tmp_path))
    assert (summary.events, summary.duplicates, summary.versions) == (5, [], {"v1": 2})


# --------------------------------------------------------------------------- real spark-submit processes


@dataclass
class Launch:
    """One spark-submit of a managed job, its log and what was seen of its status."""

    process: subprocess.Popen[bytes]
    log: Path
    deployments: Deployments
    deployment: str
    states: list[State] = field(default_factory=list)

    def status(self) -> DeploymentStatus | None:
        status = self.deployments.status(JOB, self.deployment)
        if status is not None and (not self.states or self.states[-1] is not status.state):
            self.states.append(status.state)
        return status

    def wait_for(
        self, condition: Callable[[DeploymentStatus], bool], what: str, timeout: float = LAUNCH_TIMEOUT
    ) -> DeploymentStatus:
        """Poll status.json until `condition`; fail with the log's tail if the process ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and condition(status):
                return status
            if self.process.poll() is not None and (status is None or not condition(status)):
                status = self.status()
                if status is not None and condition(status):
                    return status
                pytest.fail(f"job exited ({self.process.returncode}) before {what}; status {status}\n{self.tail()}")
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; status {self.status()}\n{self.tail()}")

    def request_stop(self, drain: bool = False) -> ControlRequest:
        request = ControlRequest(new_request_id(), "stop", drain=drain, requested_by="test_runtime")
        self.deployments.request(JOB, self.deployment, request)
        return request

    def exit_code(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout=timeout)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the JVM and the Python driver
            self.process.wait()


def launch(
    app: Path,
    store: str,
    deployment: str,
    checkpoint: Path,
    work: Path,
    *job_args: str,
    trigger: str = TRIGGER,
    conf: Mapping[str, str] | None = None,
) -> Launch:
    """spark-submit as the engine does it: detached in its own session, output to a log file."""
    log = work / f"{deployment}.log"
    command = [
        SPARK_SUBMIT,
        *("--master", "local[2]"),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1"),
        *("--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.log.level=WARN"),
        *(item for key, value in (conf or {}).items() for item in ("--conf", f"{key}={value}")),
        str(app),
        *("--store", store, "--job", JOB, "--deployment", deployment, "--checkpoint", str(checkpoint)),
        *("--trigger-interval", trigger, "--delivery", "exactly-once", "--heartbeat-interval", "1"),
        *job_args,
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Launch(process, log, Deployments(open_storage(store)), deployment)


@dataclass
class Scenario:
    """The shared world of the spark-submit tests: one input directory, one checkpoint, one store."""

    work: Path
    store: str
    input: Path
    checkpoint: Path
    output: Path
    fed: int = 0
    launches: list[Launch] = field(default_factory=list)

    def feed(self, round_no: int) -> None:
        self.fed += generate.write_round(self.input, round_no, EVENTS_PER_ROUND).events

    def launch(self, version: str, deployment: str, checkpoint: Path, output: Path) -> Launch:
        args = ("--input", str(self.input), "--output", str(output), "--max-files-per-trigger", "1")
        started = launch(WINDOWED / f"{version}.py", self.store, deployment, checkpoint, self.work, *args)
        self.launches.append(started)
        return started


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3) -> Iterator[Scenario]:
    bucket = f"runtime-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(bucket)
    work = tmp_path_factory.mktemp("runtime")
    world = Scenario(work, f"s3://{bucket}/store", work / "input", work / "checkpoint", work / "output")
    yield world
    for started in world.launches:
        started.kill()


@dataclass
class StoppedV1:
    launch: Launch
    first_batch: int
    advanced_to: int
    request: ControlRequest
    stop_seconds: float
    exit_code: int
    status: DeploymentStatus


@pytest.fixture(scope="module")
def stopped_v1(scenario: Scenario) -> StoppedV1:
    """v1 from scratch on rounds 0-1, one more round while it runs, then a plain stop."""
    scenario.feed(0)
    scenario.feed(1)
    job = scenario.launch("v1", "dp-v1", scenario.checkpoint, scenario.output)
    first = job.wait_for(lambda s: s.state is State.RUNNING and (s.last_batch_id or -1) >= 1, "batches 0 and 1")
    scenario.feed(2)
    advanced = job.wait_for(lambda s: (s.last_batch_id or -1) > (first.last_batch_id or 0), "the next batch")
    request = job.request_stop()
    requested = time.monotonic()
    stopped = job.wait_for(lambda s: s.state is State.STOPPED, "STOPPED")
    stop_seconds = time.monotonic() - requested
    return StoppedV1(
        job, first.last_batch_id or 0, advanced.last_batch_id or 0, request, stop_seconds, job.exit_code(), stopped
    )


@pytest.mark.spark
def test_status_goes_starting_running_and_batches_advance(stopped_v1: StoppedV1) -> None:
    job = stopped_v1.launch
    assert job.states[:2] == [State.STARTING, State.RUNNING], job.states
    assert stopped_v1.advanced_to > stopped_v1.first_batch
    status = stopped_v1.status
    assert status.query_id and status.run_id and status.app_id and status.pid
    assert status.watermark and status.watermark.startswith("2025-01-01T")
    assert status.batch_duration_ms is not None and status.batch_duration_ms > 0


@pytest.mark.spark
def test_stop_is_honoured_at_a_batch_boundary_within_the_trigger_interval(
    stopped_v1: StoppedV1, scenario: Scenario
) -> None:
    assert stopped_v1.exit_code == 0, stopped_v1.launch.tail()
    assert stopped_v1.status.state is State.STOPPED and stopped_v1.status.error_class is None
    assert stopped_v1.status.handled_requests == [stopped_v1.request.id]
    assert stopped_v1.stop_seconds <= TRIGGER_SECONDS + STOP_SLACK, stopped_v1.stop_seconds
    commits = max(int(p.name) for p in (scenario.checkpoint / "commits").iterdir() if p.name.isdigit())
    offsets = max(int(p.name) for p in (scenario.checkpoint / "offsets").iterdir() if p.name.isdigit())
    assert commits in (offsets, offsets - 1)  # C = L at a boundary; C = L-1 if the race was lost
    assert commits >= stopped_v1.status.last_batch_id  # the status never claims an uncommitted batch


@pytest.mark.spark
def test_incompatible_version_fails_with_the_spark_error_class(stopped_v1: StoppedV1, scenario: Scenario) -> None:
    """v3 on a copy of v1's checkpoint, with new input: Spark checks the state schema on the first batch."""
    copy = scenario.work / "checkpoint-v3"
    shutil.copytree(scenario.checkpoint, copy)
    scenario.feed(3)
    job = scenario.launch("v3", "dp-v3", copy, scenario.work / "output-v3")
    failed = job.wait_for(lambda s: s.state is State.FAILED, "FAILED")
    assert job.exit_code() != 0
    assert failed.error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", failed
    assert failed.error_message and "key schema" in failed.error_message
    assert "=== Streaming Query ===" not in failed.error_message  # the plan dump stays in the log


@pytest.mark.spark
def test_stop_with_drain_processes_the_written_input_exactly_once(stopped_v1: StoppedV1, scenario: Scenario) -> None:
    """v2 continues v1's checkpoint (a compatible upgrade); rounds 4-5 and the flush marker are written
    before the drain request, one file per trigger would take several intervals: drain takes them all."""
    if scenario.fed == 3 * EVENTS_PER_ROUND:  # the v3 test did not run (selected alone): feed its round
        scenario.feed(3)
    job = scenario.launch("v2", "dp-v2", scenario.checkpoint, scenario.output)
    job.wait_for(lambda s: s.state is State.RUNNING, "RUNNING")
    scenario.feed(4)
    scenario.feed(5)
    generate.write_flush(scenario.input, 6)
    drain = job.request_stop(drain=True)
    stopped = job.wait_for(lambda s: s.state is State.STOPPED, "STOPPED after the drain")
    assert job.exit_code() == 0, job.tail()
    assert stopped.handled_requests == [drain.id]
    assert State.STOPPING in job.states
    assert (stopped.last_batch_id or 0) > stopped_v1.status.last_batch_id  # batch ids keep increasing
    summary = summarize(read_output(scenario.output))
    assert summary.duplicates == []
    assert summary.events == scenario.fed == 6 * EVENTS_PER_ROUND
    assert set(summary.versions) == {"v1", "v2"}


@pytest.mark.spark
def test_exactly_once_refuses_a_console_sink_before_starting(scenario: Scenario) -> None:
    app = scenario.work / "console_job.py"
    app.write_text(
        "from spark_jobs.runtime import SinkKind, SourceKind, StreamingJob, run\n\n\n"
        "def build(spark, job_args):\n"
        "    stream = spark.readStream.format('rate').load()\n"
        "    return StreamingJob(stream.writeStream.format('console'), SinkKind.CONSOLE, SourceKind.RATE)\n\n\n"
        "if __name__ == '__main__':\n"
        "    run(build)\n"
    )
    job = launch(app, scenario.store, "dp-console", scenario.work / "checkpoint-console", scenario.work)
    scenario.launches.append(job)
    assert job.exit_code(timeout=LAUNCH_TIMEOUT) == 3
    status = job.status()
    assert status is not None and status.state is State.FAILED
    assert status.error_class == "DELIVERY_GUARANTEE_NOT_MET"
    assert "exactly-once refuses the console sink" in (status.error_message or "")
    assert "exactly-once refuses the console sink" in job.log.read_text()
    assert not (scenario.work / "checkpoint-console").exists()  # nothing was started
