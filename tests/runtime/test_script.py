"""A script run as it is under the runtime (spark_jobs/runtime/script.py): the refusals without Spark, the job's
broker in its environment, a foreachBatch declared idempotent; then on the tests' session a query taken over
(checkpoint, name and trigger replaced, stopped with a drain on request, the script's awaitTermination returning),
one started by toTable writing its table, and a second query refused with nothing left running; a foreachBatch
refused by exactly-once unless declared; and a refusal through the CLI's deploy and a real driver (exit 9)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import ControlRequest, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from devtools.windowed import wait_for
from spark_jobs.runtime import EXIT_REFUSED, Delivery, DeliveryRefused, SinkKind, SourceKind, StreamingJob, parse_args
from spark_jobs.runtime.broker import KAFKA_CONF, KAFKA_ENV
from spark_jobs.runtime.delivery import check
from spark_jobs.runtime.script import (
    EXIT_SCRIPT_REFUSED,
    FAILED_BEFORE_START,
    NO_QUERY,
    SECOND_QUERY,
    START_TIMEOUT,
    UNSUPPORTED,
    ScriptRunner,
    declaration_unused,
    declared_sink,
    source_kind,
)
from tests.support.jobs import write_jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class _FakeSession:
    """Just enough of a SparkSession for the paths that end before a query starts."""

    sparkContext = SimpleNamespace(applicationId="local-fake", uiWebUrl=None)
    streams = SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None)
    conf = SimpleNamespace(get=lambda key, default=None: default)  # the session's conf, as spark-submit set it


def _runner(tmp_path: Path, script: str, timeout: float = 30.0, foreach_batch: str | None = None) -> ScriptRunner:
    path = tmp_path / "script.py"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    common = ["--store", str(tmp_path / "store"), "--job", "j", "--deployment", "d"]
    argv = [*common, "--checkpoint", str(tmp_path / "checkpoint"), "--trigger-interval", "1 second"]
    args, job_args = parse_args([*argv, "--delivery", "exactly-once", "--poll-interval", "0.2", "an-argument"])
    return ScriptRunner(str(path), args, job_args, timeout, foreach_batch)


def _status(runner: ScriptRunner) -> DeploymentStatus:
    status = runner.deployments.status("j", "d")
    assert status is not None
    return status


def test_scripts_that_fail_end_or_wait_before_starting_a_query_are_refused(tmp_path: Path) -> None:
    cases = [
        ("import sys\nassert sys.argv[1:] == ['an-argument']\nraise ValueError('no such column')", FAILED_BEFORE_START),
        ("import sys\nsys.exit(2)", FAILED_BEFORE_START),
        ("print('a batch job, no stream')", NO_QUERY),
        ("import time\ntime.sleep(3)", START_TIMEOUT),
        ("raise AssertionError('never run')", UNSUPPORTED),
    ]
    for index, (script, error_class) in enumerate(cases):
        runner = _runner(tmp_path / str(index), script, timeout=0.5)
        if error_class == UNSUPPORTED:  # what an upgrade that changes the state asks of its new version
            runner.args = replace(runner.args, initial_state=str(tmp_path / "initial"))
        code = runner.run(lambda: _FakeSession())  # type: ignore[arg-type, return-value]
        status = _status(runner)
        assert (status.state, status.error_class, code) == (State.FAILED, error_class, EXIT_SCRIPT_REFUSED)
        assert "script.py" in str(status.error_message)


def test_a_script_gets_the_jobs_broker_in_its_environment_and_only_its_own_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43: the engine hands the broker over in the driver's conf (and, local and client mode, environment):
    the script's argv is the jobs file's arguments alone, and the conf's broker is in its environment (a driver in
    a cluster's container gets the conf, not the environment of spark-submit)."""
    monkeypatch.setenv(KAFKA_ENV, "stale:1")  # the conf wins; and the test's environment is restored after
    seen = tmp_path / "seen"
    script = (
        f"import os, sys\nopen({str(seen)!r}, 'w').write(os.environ[{KAFKA_ENV!r}] + '|' + ' '.join(sys.argv[1:]))\n"
    )
    session = _FakeSession()
    session.conf = SimpleNamespace(get=lambda key, default=None: "conf:9092" if key == KAFKA_CONF else default)
    runner = _runner(tmp_path / "script", script)
    assert runner.run(lambda: session) == EXIT_SCRIPT_REFUSED and _status(runner).error_class == NO_QUERY
    assert seen.read_text() == "conf:9092|an-argument"


def test_a_foreach_batch_the_version_declares_idempotent_is_an_idempotent_sink() -> None:
    kafka = SourceKind.KAFKA
    assert declared_sink(SinkKind.FOREACH_BATCH, "idempotent") is SinkKind.IDEMPOTENT_FOREACH_BATCH
    assert declared_sink(SinkKind.FOREACH_BATCH, None) is SinkKind.FOREACH_BATCH
    assert declared_sink(SinkKind.KAFKA, "idempotent") is SinkKind.KAFKA  # a declaration names a foreachBatch only
    with pytest.raises(DeliveryRefused, match='foreach_batch = "idempotent" on a script\'s version in the jobs file'):
        check(Delivery.EXACTLY_ONCE, StreamingJob(None, sink=SinkKind.FOREACH_BATCH, source=kafka))  # type: ignore[arg-type]
    declared = StreamingJob(None, sink=declared_sink(SinkKind.FOREACH_BATCH, "idempotent"), source=kafka)  # type: ignore[arg-type]
    assert check(Delivery.EXACTLY_ONCE, declared) == [] and declaration_unused(declared, "idempotent") is None
    unused = declaration_unused(StreamingJob(None, sink=SinkKind.DELTA, source=kafka), "idempotent")  # type: ignore[arg-type]
    assert unused is not None and "writes a delta sink, not a foreachBatch: the declaration does not apply" in unused


def test_sources_are_judged_by_the_weakest() -> None:
    assert source_kind(["kafka"]) is SourceKind.KAFKA
    assert source_kind(["FileSource[/in]", "rate"]) is SourceKind.FILE
    assert source_kind(["kafka", "textSocket"]) is SourceKind.SOCKET
    assert source_kind(["kafka", "SomethingElse"]) is SourceKind.UNKNOWN
    assert source_kind([]) is SourceKind.UNKNOWN


TAKEN_OVER = """
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("mine").getOrCreate()
rows = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
query = (
    rows.writeStream.queryName("mine").trigger(processingTime="30 seconds")
    .option("checkpointLocation", sys.argv[1] + "/own-checkpoint").start(format="noop")
)
query.awaitTermination()
open(sys.argv[1] + "/after-await", "w").write(query.name)
spark.stop()
"""

TO_TABLE = """
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
rows = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
query = rows.writeStream.format("parquet").option("path", sys.argv[1] + "/table").toTable("script_rate_rows")
query.awaitTermination()
"""

TWO_QUERIES = """
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
rows = spark.readStream.format("rate").load()
first = rows.writeStream.format("noop").start()
second = rows.writeStream.format("noop").start()
spark.streams.awaitAnyTermination()
"""


@pytest.mark.spark
def test_a_query_is_taken_over_until_stopped_and_a_second_query_is_refused(
    tmp_path: Path, spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="spark_jobs.runtime")
    runner = _runner(tmp_path, TAKEN_OVER.replace("sys.argv[1]", repr(str(tmp_path))))
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(runner.run(lambda: spark)))
    thread.start()
    deadline = time.monotonic() + 120
    while (_status_or_none(runner) or State.STARTING) is not State.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    Deployments(open_storage(str(tmp_path / "store"))).request("j", "d", ControlRequest("rq-stop", "stop", drain=True))
    thread.join(60)
    status = _status(runner)
    assert (codes, status.state, status.handled_requests) == ([0], State.STOPPED, ["rq-stop"])
    assert (tmp_path / "after-await").read_text() == "j", "awaitTermination returned; the job's query name"
    assert "draining" in caplog.text, "the stop asked for a drain: the script's writer ran once more, available-now"
    assert (tmp_path / "checkpoint" / "commits").is_dir() and not (tmp_path / "own-checkpoint").exists()
    assert any("own-checkpoint" in warning for warning in status.warnings), status.warnings
    assert any("30000" in warning and "1 second" in warning for warning in status.warnings), status.warnings
    assert spark.sparkContext._jsc is not None, "the script's spark.stop() left the session to the runtime"

    tabled = _runner(tmp_path / "table", TO_TABLE.replace("sys.argv[1]", repr(str(tmp_path / "table"))))
    thread = threading.Thread(target=lambda: codes.append(tabled.run(lambda: spark)))
    thread.start()
    try:
        wait_for(lambda: _last_batch(tabled) >= 1, "the toTable query's second batch", 120)
        Deployments(open_storage(str(tmp_path / "table" / "store"))).request("j", "d", ControlRequest("rq-2", "stop"))
        thread.join(60)
        status = _status(tabled)
        assert (codes[-1], status.state) == (0, State.STOPPED), status
        assert status.sink == f"FileSink[file:{tmp_path / 'table' / 'table'}]", "the table's files, as Spark says"
        assert (tmp_path / "table" / "checkpoint" / "commits" / "1").is_file(), "the deployment's checkpoint"
        assert spark.read.table("script_rate_rows").count() > 0, "toTable wrote the script's table"
    finally:
        spark.sql("DROP TABLE IF EXISTS script_rate_rows")

    refused = _runner(tmp_path / "two", TWO_QUERIES)
    code = refused.run(lambda: spark)
    status = _status(refused)
    assert (status.state, status.error_class, code) == (State.FAILED, SECOND_QUERY, EXIT_SCRIPT_REFUSED)
    wait_for(lambda: not spark.streams.active, "nothing left running (Spark lists a stopped query a moment)", 30)


FOREACH_BATCH = """
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()


def write(batch, batch_id):  # by batch id: a replayed batch overwrites what its first run wrote
    batch.write.mode("overwrite").parquet(f"OUTPUT/batch={batch_id}")


rows = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
rows.writeStream.foreachBatch(write).start().awaitTermination()
"""


@pytest.mark.spark
def test_a_foreach_batch_runs_exactly_once_only_when_its_version_declares_it_idempotent(
    tmp_path: Path, spark: SparkSession
) -> None:
    script = FOREACH_BATCH.replace("OUTPUT", str(tmp_path / "output"))
    refused = _runner(tmp_path / "undeclared", script)
    assert refused.run(lambda: spark) == EXIT_REFUSED
    status = _status(refused)
    assert (status.state, status.error_class) == (State.FAILED, "DELIVERY_GUARANTEE_NOT_MET")
    assert 'foreach_batch = "idempotent"' in str(status.error_message) and "a foreach-batch sink" in str(
        status.error_message
    )
    wait_for(lambda: not spark.streams.active, "nothing left running", 30)

    declared = _runner(tmp_path / "declared", script, foreach_batch="idempotent")
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(declared.run(lambda: spark)))
    thread.start()
    try:
        wait_for(lambda: _last_batch(declared) >= 1, "the declared foreachBatch's second batch", 120)
    finally:
        Deployments(open_storage(str(tmp_path / "declared" / "store"))).request("j", "d", ControlRequest("rq", "stop"))
        thread.join(60)
    status = _status(declared)
    assert (codes, status.state, status.error_class) == ([0], State.STOPPED, None), status
    assert (tmp_path / "output" / "batch=1").is_dir() and status.warnings == []


def _last_batch(runner: ScriptRunner) -> int:
    status = runner.deployments.status("j", "d")
    return -1 if status is None or status.last_batch_id is None else status.last_batch_id


def _status_or_none(runner: ScriptRunner) -> State | None:
    status = runner.deployments.status("j", "d")
    return status.state if status else None


@pytest.mark.spark
@pytest.mark.slow
def test_the_cli_exits_9_for_a_script_refused_in_its_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.py").write_text("raise ValueError('no such column: wrod')\n")
    extra = '[jobs.broken]\nversions.v1 = { script = "broken.py" }\n'
    jobs = str(write_jobs(tmp_path, extra=extra))
    assert main(["deploy", "broken", "--jobs", jobs]) == 9
    assert FAILED_BEFORE_START in capsys.readouterr().err
    [deployment] = Deployments(open_storage(str(tmp_path / "store"))).list("broken")
    status = Deployments(open_storage(str(tmp_path / "store"))).status("broken", deployment.id)
    assert status is not None and status.state is State.FAILED and "broken.py" in str(status.error_message)
