"""Two upgrade DAG runs of one job started together, each in its own process with its own Airflow (its own
metadata DB: two schedulers, or two people, acting on one store), against a running v1 driver of the
windowed job, events fed all along. One begins its upgrade first and holds the job's lease for all of it; the
other is refused at its beginning, naming the winner's upgrade, and records, launches and stops nothing (its
recovery has nothing to do). The winner upgrades by stop/restore (a file sink takes one writer: no
blue/green). One v2 runs, and every event is counted exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.context import Settings
from airflow_plugin.core.jobs.deploy import DeployRequest, deploy
from airflow_plugin.core.jobs.deployments import Deployments, observed_state
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.jobs.stop import kill, stop
from airflow_plugin.core.records.deployment import State
from airflow_plugin.core.upgrades.record import Phase, Upgrades
from devtools.feeding import BackgroundFeeder
from devtools.windowed import Feeder, processed, wait_for, wait_output_complete, write_jobs_file
from spark_jobs.jobs.windowed.output import read_output, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ONE_RUN = r"""
import json, sys
from pathlib import Path
from devtools import airflow_env
airflow_env.configure(Path(sys.argv[1]))
from devtools.dag_runs import run_dag
result = run_dag("savepoints_upgrade", json.loads(sys.argv[2]))
print("RESULT " + json.dumps({"state": result.state, "run_id": result.run_id, "tasks": result.tasks}))
"""


def own_airflow(home: Path, migrated: Path) -> Path:
    """An Airflow home with a copy of the session's migrated metadata DB."""
    home.mkdir(parents=True)
    with sqlite3.connect(migrated / "airflow.db") as source, sqlite3.connect(home / "airflow.db") as copy:
        source.backup(copy)
    (home / ".migrated").write_text("ok\n")
    return home


def result_of(output: str) -> dict[str, Any]:
    [line] = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.timeout(900)
def test_two_upgrade_runs_at_once_one_cuts_over_the_other_is_refused_and_no_event_is_lost(
    tmp_path: Path, s3_server: Any, s3_store: str, airflow_db: Path
) -> None:
    jobs_file = write_jobs_file(tmp_path, s3_store)
    job = Settings(jobs_file=str(jobs_file)).resolve().job("windowed")
    records = Deployments(job.store.storage)
    feeder = Feeder(tmp_path / "input", events_per_round=200)
    feeder.round()
    try:
        v1 = deploy(job, DeployRequest("v1"))
        wait_for(lambda: processed(v1.checkpoint, feeder.rounds), "v1 to process its first round")

        env = {**os.environ, JOBS_ENV: str(jobs_file)}
        env["AIRFLOW_CONN_AWS_DEFAULT"] = s3_server.airflow_connection()
        conf = json.dumps({"job": "windowed", "version": "v2", "min_batches": 5, "kafka_lag_must_fall": False})
        with BackgroundFeeder(feeder, interval=1.0):
            runs = [
                subprocess.Popen(
                    [sys.executable, "-c", ONE_RUN, str(own_airflow(tmp_path / f"airflow-{n}", airflow_db)), conf],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=REPO,
                    env=env,
                )
                for n in (1, 2)
            ]
            outputs = [run.communicate(timeout=800)[0] for run in runs]
        results = [result_of(output) for output in outputs]
        states = sorted(r["state"] for r in results)
        assert states == ["failed", "success"], [(r["state"], r["tasks"]) for r in results]
        winner, loser = sorted(results, key=lambda r: r["state"] != "success")
        loser_output = outputs[results.index(loser)]

        assert loser["tasks"]["begin"] == "failed" and loser["tasks"]["launch"] == "upstream_failed", loser
        [upgrade] = Upgrades(job.store.storage).list("windowed")  # the loser recorded none
        assert upgrade.request_id.startswith(f"airflow:savepoints_upgrade/{winner['run_id']}/")
        assert upgrade.phase is Phase.DONE and upgrade.mode == "stop_restore", upgrade
        assert upgrade.id in loser_output, "the refusal names the winning upgrade"
        deployments = records.list("windowed")
        assert [d.version for d in deployments] == ["v1", "v2"], "one v2, started by the winner alone"
        states_now = [observed_state(d, records.status("windowed", d.id)) for d in deployments]
        assert states_now == [State.STOPPED, State.RUNNING]

        feeder.flush()
        v2 = deployments[1]
        wait_for(lambda: processed(v2.checkpoint, feeder.rounds), "v2 to process everything")
        wait_output_complete(tmp_path / "output", feeder.events)
        stop(job)
        summary = summarize(read_output(tmp_path / "output"))
        assert summary.events == feeder.events, "every event counted exactly once"
        assert summary.duplicates == []
    finally:
        for deployment in records.list("windowed"):
            with contextlib.suppress(SavepointsError):
                kill(job, deployment.id)
