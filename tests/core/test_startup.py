"""A real local deployment of the example job, launched by the engine: it reports each stage of its start
(launch, Spark session, first batch) while the caller waits, and everything its driver listens on is
bound to loopback (the Spark UI would otherwise listen on every interface)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.stop import kill
from devtools.windowed import Feeder, write_jobs_file
from tests.support.sockets import listening, not_loopback, process_group

pytestmark = [pytest.mark.spark]


class RecordingProgress:
    """Keeps every stage text in order (a Progress, as the CLI's spinner receives them)."""

    def __init__(self) -> None:
        self.stages: list[str] = []
        self.finished = 0

    def start(self, description: str, total_bytes: int, total_files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def stage(self, text: str) -> None:
        if not self.stages or self.stages[-1] != text:
            self.stages.append(text)

    def finish(self) -> None:
        self.finished += 1


def test_a_local_deployment_reports_its_start_and_listens_on_loopback_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)  # the engine's default, not the test session's
    jobs_file = write_jobs_file(tmp_path, str(tmp_path / "store"))
    Feeder(tmp_path / "input").round()
    progress = RecordingProgress()
    job = Settings(jobs_file=str(jobs_file), progress=progress).resolve().job("windowed")
    deployment = deploy(job, DeployRequest("v1"))
    try:
        stages = progress.stages
        order = [
            next((i for i, text in enumerate(stages) if marker in text), None)
            for marker in ("launching deployment", "creating its Spark session", "waiting for the first batch")
        ]
        assert None not in order and order == sorted(order), stages
        assert progress.finished >= 1, "the stages were never ended"
        addresses = listening(process_group(deployment.launcher["pid"]))
        assert addresses, "the driver listens on nothing: was the Spark UI disabled?"
        assert not_loopback(addresses) == set(), addresses
    finally:
        kill(job)
