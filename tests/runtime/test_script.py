"""A script run as it is under the runtime (spark_jobs/runtime/script.py): the refusals without Spark, then on
the tests' session a query taken over (checkpoint, name and trigger replaced, stopped with a drain on request, the
script's awaitTermination returning), one started by toTable writing its table, and a second query refused with
nothing left running; and a refusal through the CLI's deploy and a real driver (exit 9)."""

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
from airflow_plugin.core.jobs.deployments import ControlRequest, Deployments, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from devtools.windowed import wait_for
from spark_jobs.runtime import SourceKind, parse_args
from spark_jobs.runtime.script import (
    EXIT_SCRIPT_REFUSED,
    FAILED_BEFORE_START,
    NO_QUERY,
    SECOND_QUERY,
    START_TIMEOUT,
    UNSUPPORTED,
    ScriptRunner,
    source_kind,
)
from tests.support.jobs import write_jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class _FakeSession:
    """Just enough of a SparkSession for the paths that end before a query starts."""

    sparkContext = SimpleNamespace(applicationId="local-fake", uiWebUrl=None)
    streams = SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None)


def _runner(tmp_path: Path, script: str, timeout: float = 30.0) -> ScriptRunner:
    path = tmp_path / "script.py"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    common = ["--store", str(tmp_path / "store"), "--job", "j", "--deployment", "d"]
    argv = [*common, "--checkpoint", str(tmp_path / "checkpoint"), "--trigger-interval", "1 second"]
    args, job_args = parse_args([*argv, "--delivery", "exactly-once", "--poll-interval", "0.2", "an-argument"])
    return ScriptRunner(str(path), args, job_args, timeout)


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
