"""What an upgrade decides from the shape of a query's plan, with real drivers on file input and Delta tables on local
disk (the variants: shapes_app.py), input fed all along:

- a session-window job asking for blue/green toward a stateless version is refused, naming both (a session merges
  differently in two versions; rows written as they arrive leave late rows to no one), and nothing changes; the
  same job upgrades by stop/restore;
- a replay to a version whose watermark delay is shorter than the running one's starts early enough for the
  longer delay: every (user, window) is counted once, the windows right after the cutover included (started by the
  new version's horizon alone, the replay would skip records those windows need)."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from airflow_plugin.cli import main
from airflow_plugin.core.jobs.context import JobContext, Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.observe import state_of
from airflow_plugin.core.jobs.stop import running_deployment, stop
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.sinks.delta import SESSION_CONF
from airflow_plugin.core.storage import open_storage
from airflow_plugin.core.upgrades.record import Mode, Phase, Upgrades
from devtools import jvm
from devtools.feeding import BackgroundFeeder
from devtools.windowed import SMALL_DELTA_TABLE, Feeder, processed, wait_for
from spark_jobs.generate import FLUSH_USER, round_events
from spark_jobs.jobs.windowed.output import read_table, summarize
from tests.support.jobs import kill_every_deployment

pytestmark = [pytest.mark.spark, pytest.mark.slow(seconds=300)]

APP = Path(__file__).with_name("shapes_app.py")
VERSIONS = {
    "sessions": {"sessions_a": "--shape sessions", "sessions_b": "--shape sessions", "rows_b": "--shape rows"},
    "windows": {"slow": '--shape windows --delay "10 minutes"', "quick": '--shape windows --delay "1 minute"'},
}


def _jobs_file(directory: Path) -> Path:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.jars": str(jvm.link("delta") / "*.jar"),
        **SESSION_CONF,
        **SMALL_DELTA_TABLE,
    }
    tables = []
    for job, versions in VERSIONS.items():
        files = "0" if job == "sessions" else "1"  # all there is a batch; the replay's: one file (5 minutes) a batch
        args = f'"--input", "{directory / job}-in", "--max-files-per-trigger", "{files}", "--sink", "delta", '
        args += f'"--output", "{directory / job}-out"'
        declared = "\n".join(
            f'versions.{name} = {{ application = "{APP}", args = [{", ".join(f"{a!r}" for a in shlex.split(shape))}, '
            f'"--tag", "{name}"] }}'
            for name, shape in versions.items()
        )
        tables.append(
            f"""
[jobs.{job}]
trigger_interval = "1 second"
default_version = "{next(iter(versions))}"
args = [{args}]
conf = {{ {", ".join(f'"{k}" = "{v}"' for k, v in conf.items())} }}
{declared}
"""
        )
    path = directory / "jobs.toml"
    path.write_text(
        f'[defaults]\nstore = "{directory / "store"}"\ncheckpoint_root = "{directory / "checkpoints"}"\n'
        f'log_dir = "{directory / "logs"}"\n' + "".join(tables)
    )
    return path


def _status(job: JobContext, deployment: Deployment) -> DeploymentStatus:
    return job.deployments.status(job.name, deployment.id) or DeploymentStatus(State.STARTING, 0)


def _batches(job: JobContext, deployment: Deployment, at_least: int) -> None:
    wait_for(lambda: (_status(job, deployment).last_batch_id or 0) >= at_least, f"{at_least} batches", 240)


def _finish(job: JobContext, feeder: Feeder, output: Path) -> list[dict[str, object]]:
    """Flush the last windows, wait for them, stop the job: the table's rows (the flush marker's left out)."""
    feeder.flush()
    table = open_storage(str(output))
    with contextlib.suppress(TimeoutError):  # what is missing then, the comparison per window says
        wait_for(lambda: summarize(read_table(table)).events >= feeder.events, "the last windows", 180)
    stop(job)
    return [row for row in read_table(table) if row["user"] != FLUSH_USER]


def _per_window(rows: list[dict[str, object]]) -> Counter[tuple[str, float]]:
    counted: Counter[tuple[str, float]] = Counter()
    for row in rows:
        start = row["window_start"]
        assert isinstance(start, datetime)
        counted[(str(row["user"]), (start if start.tzinfo else start.replace(tzinfo=UTC)).timestamp())] += int(
            row["events"]  # type: ignore[call-overload]
        )
    return counted


def _expected(rounds: int, per_round: int) -> Counter[tuple[str, float]]:
    """Events per (user, one-minute window start) of the rounds fed."""
    counted: Counter[tuple[str, float]] = Counter()
    for number in range(rounds):
        for event in round_events(number, per_round):
            moment = datetime.fromisoformat(str(event["event_time"]).replace("Z", "+00:00")).timestamp()
            counted[(str(event["user"]), moment - moment % 60)] += 1
    return counted


@pytest.mark.timeout(1200)
def test_the_plan_decides_blue_green_and_where_a_replay_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = _jobs_file(tmp_path)
    settings = Settings(jobs_file=str(jobs)).resolve()
    cli = ["--jobs", str(jobs)]
    try:
        # sessions, and rows as they arrive: blue/green refused, naming both; stop/restore works
        job = settings.job("sessions")
        feeder = Feeder(tmp_path / "sessions-in", events_per_round=40)
        with BackgroundFeeder(feeder, interval=1.0):
            first = deploy(job, DeployRequest("sessions_a"))
            _batches(job, first, 3)
            code = main(
                ["upgrade", "sessions", "--version", "rows_b", "--mode", "blue_green", "--min-batches", "1", *cli]
            )
            said = capsys.readouterr()
            assert code == 4, said.err
            assert "the running version holds a session window (a record one version drops as late" in said.err
            assert "the new version has no windowed state: its rows are written as they arrive" in said.err
            assert [d.id for d in job.deployments.list("sessions")] == [first.id], "nothing was started"
            assert state_of(job, first) is State.RUNNING
            assert main(["upgrade", "sessions", "--version", "sessions_b", "--min-batches", "1", *cli]) == 0
            upgrade = Upgrades(job.store.storage).newest("sessions")
            assert upgrade is not None and upgrade.phase is Phase.DONE and upgrade.mode == Mode.STOP_RESTORE
            assert "holds a session window" in upgrade.modes[Mode.BLUE_GREEN]
            _batches(job, running_deployment(job), 2)
        rows = _finish(job, feeder, tmp_path / "sessions-out")
        summary = summarize(rows)
        assert summary.events == feeder.events and summary.duplicates == [], "every event once, in one session"
        assert set(summary.versions) == {"sessions_a", "sessions_b"}

        # a replay to a shorter watermark delay (10 minutes -> 1 minute), each file a batch of 5 minutes of events.
        # Input pauses from before the live savepoint until the old version took the gate, so that T is its
        # watermark at the savepoint: the windows right after T are those a replay started too late gets partial
        job = settings.job("windows")
        feeder = Feeder(tmp_path / "windows-in", events_per_round=40)
        upgrades = Upgrades(job.store.storage)
        with BackgroundFeeder(feeder, interval=1.5) as feeding:
            slow = deploy(job, DeployRequest("slow"))
            _batches(job, slow, 12)  # the offset log reaches back past the horizon and the longer delay
            argv = ["upgrade", "windows", "--version", "quick", "--mode", "replay", "--min-batches", "1", *cli]
            with feeding.idle():
                # a bound, polled: at one file a batch a loaded machine takes minutes to catch up with the feeder
                wait_for(lambda: processed(slow.checkpoint, feeder.rounds), "every file read", 400)
                process = subprocess.Popen([sys.executable, "-m", "airflow_plugin", *argv],
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
                wait_for(lambda: (_status(job, slow).gate or {}).get("role") == "blue", "the old version's gate", 400)
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0, output
            upgrade = upgrades.newest("windows")
            assert upgrade is not None and upgrade.phase is Phase.DONE and upgrade.mode == Mode.REPLAY
            replay = upgrade.replay or {}
            assert replay["cutoff_ms"] <= replay["floor_ms"] - (120 + 540) * 1000, "the horizon and 9 minutes more"
            _batches(job, running_deployment(job), 2)
        expected = _expected(feeder.rounds, feeder.events_per_round)  # before the flush marker's round
        rows = _finish(job, feeder, tmp_path / "windows-out")
        counted = _per_window(rows)
        missing = {key: n - counted[key] for key, n in expected.items() if counted[key] < n}
        extra = {key: counted[key] - n for key, n in counted.items() if n > expected[key]}
        assert not missing and not extra, f"per (user, window): missing {missing}, twice {extra}"
        assert summarize(rows).shared_windows == [], "each window from one version"
    finally:
        for name in VERSIONS:
            kill_every_deployment(settings.job(name))
