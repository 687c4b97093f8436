"""JOB_ARGUMENTS_REJECTED says why (issue 53, point 4): argparse's own complaint is in the status, and a job written to
the older contract, which declared `--kafka-bootstrap-servers` as required (the runtime appended it; now the broker
reaches the driver in its conf and environment), is told what changed and how to read the broker. Without Spark."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_plugin.core.records.deployment import DeploymentStatus, State
from spark_jobs.runtime import Runner, StreamingJob, parse_args

CHANGE = (
    "the runtime no longer passes --kafka-bootstrap-servers: read the broker with kafka_bootstrap_servers(spark) "
    "(docs/writing-a-job.md, CHANGELOG.md)"
)


class _FakeSession:
    """Just enough of a SparkSession for a run that ends in the job's build."""

    sparkContext = SimpleNamespace(applicationId="local-fake", uiWebUrl=None)
    streams = SimpleNamespace(addListener=lambda listener: None, removeListener=lambda listener: None)


def _run(tmp_path: Path, build: Callable[..., Any], job_args: list[str]) -> tuple[DeploymentStatus, int]:
    common = ["--store", str(tmp_path), "--job", "j", "--deployment", "d", "--checkpoint", str(tmp_path / "c")]
    args, rest = parse_args([*common, "--trigger-interval", "1 second", "--delivery", "at-least-once", *job_args])
    runner = Runner(build, args, rest)
    code = runner.run(lambda: _FakeSession())  # type: ignore[arg-type, return-value]
    status = runner.deployments.status("j", "d")
    assert status is not None
    return status, code


def _older_contract(spark: Any, job_args: list[str]) -> StreamingJob:
    """An application of the older contract: the broker among its arguments, required."""
    parser = argparse.ArgumentParser(prog="orders_app.py")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--kafka-bootstrap-servers", required=True)
    parser.parse_args(job_args)
    raise AssertionError("argparse accepted arguments without the broker")


def test_a_job_that_still_requires_the_removed_broker_argument_is_told_the_change_and_the_fix(
    tmp_path: Path, capsys: Any
) -> None:
    status, code = _run(tmp_path, _older_contract, ["--topic", "orders"])
    assert (status.state, status.error_class, code) == (State.FAILED, "JOB_ARGUMENTS_REJECTED", 2)
    assert status.error_message == (
        "the job rejected its arguments ['--topic', 'orders'] (exit 2): orders_app.py: error: the following "
        f"arguments are required: --kafka-bootstrap-servers; {CHANGE}"
    )
    assert "the following arguments are required: --kafka-bootstrap-servers" in capsys.readouterr().err  # as before


def test_any_rejection_carries_argparse_s_complaint_and_no_hint_where_the_broker_is_not_the_matter(
    tmp_path: Path,
) -> None:
    status, code = _run(tmp_path / "a", _older_contract, ["--kafka-bootstrap-servers", "b:9092"])
    assert code == 2 and status.error_message == (
        "the job rejected its arguments ['--kafka-bootstrap-servers', 'b:9092'] (exit 2): orders_app.py: error: "
        "the following arguments are required: --topic"
    )
    # given, but refused for another reason: the complaint names it, the runtime's change is not the cause
    status, _ = _run(tmp_path / "b", _older_contract, ["--topic", "t", "--kafka-bootstrap-servers"])
    assert "expected one argument" in str(status.error_message) and CHANGE not in str(status.error_message)

    def exits(spark: Any, job_args: list[str]) -> StreamingJob:
        sys.exit("no --input given")

    status, _ = _run(tmp_path / "c", exits, [])
    assert status.error_message == "the job rejected its arguments [] (exit no --input given): no --input given"

    def exits_quietly(spark: Any, job_args: list[str]) -> StreamingJob:
        raise SystemExit(2)

    status, _ = _run(tmp_path / "d", exits_quietly, [])
    assert status.error_message == "the job rejected its arguments [] (exit 2): see the driver log"
