"""One operation per job at a time, through real processes: the job lease (core/lease.py) makes a second
`savepoints deploy` of a job, or a deploy while a stop runs, fail at once with exit 4 naming the holder,
and nothing of the first is touched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.lease import read_lease
from airflow_plugin.core.storage import open_storage
from devtools.windowed import wait_for
from tests.support.jobs import STUBBORN_JOB, write_jobs

pytestmark = pytest.mark.slow


def _savepoints(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "airflow_plugin", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=240)
    return process.returncode, out, err


@pytest.fixture
def stub_jobs(tmp_path: Path) -> str:
    app = tmp_path / "stubborn.py"
    app.write_text(STUBBORN_JOB)
    return str(write_jobs(tmp_path, application=str(app)))


def _kill_all(jobs: str) -> None:
    """Whatever a failed test left: a lease of a killed command, then the stub driver."""
    subprocess.run([sys.executable, "-m", "airflow_plugin", "lease", "break", "orders", "--jobs", jobs], check=False)
    subprocess.run([sys.executable, "-m", "airflow_plugin", "kill", "orders", "--jobs", jobs], check=False)


def test_two_deploys_of_one_job_started_together_give_exactly_one_deployment(tmp_path: Path, stub_jobs: str) -> None:
    racers = [_savepoints("deploy", "orders", "--jobs", stub_jobs, "--json") for _ in range(2)]
    try:
        results = [_finish(process) for process in racers]
        assert sorted(code for code, _, _ in results) == [0, 4], results
        refused = next(err for code, _, err in results if code == 4)
        # refused by the lease while the other deployed, or by the deployment it left running
        assert "is busy:" in refused or "already has deployment" in refused, refused
        winner = next(json.loads(out) for code, out, _ in results if code == 0)
        deployments = Deployments(open_storage(str(tmp_path / "store"))).list("orders")
        assert [d.id for d in deployments] == [winner["deployment"]]
        assert read_lease(open_storage(str(tmp_path / "store")), "orders") is None  # released
    finally:
        _kill_all(stub_jobs)


def test_a_deploy_while_a_stop_runs_is_refused_naming_the_stop(tmp_path: Path, stub_jobs: str) -> None:
    code, out, err = _finish(_savepoints("deploy", "orders", "--jobs", stub_jobs, "--json"))
    assert code == 0, err
    running = json.loads(out)["deployment"]
    store = open_storage(str(tmp_path / "store"))
    stopping = _savepoints("stop", "orders", "--jobs", stub_jobs, "--timeout", "10")  # the stub never stops
    try:
        wait_for(lambda: (lease := read_lease(store, "orders")) is not None and lease.operation == "stop", "the stop")
        code, _, err = _finish(_savepoints("deploy", "orders", "--jobs", stub_jobs, "--version", "v2"))
        assert code == 4 and "job orders is busy:" in err and "for stop" in err, err
        assert [d.id for d in Deployments(store).list("orders")] == [running]  # nothing new, nothing stopped
        assert _finish(stopping)[0] == 10  # the stop timed out and gave the lease back
        assert read_lease(store, "orders") is None
    finally:
        if stopping.poll() is None:
            stopping.kill()
        _kill_all(stub_jobs)
    assert Deployments(store).status("orders", running).error_class == "KILLED"  # nothing left running
