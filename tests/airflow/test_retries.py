"""A task Airflow retries after its worker died mid-operation: the retry takes over what the dead try made
(task_request_id), so the job ends with one deployment and one COMPLETED snapshot, never two. The dead
try runs in its own process, killed with SIGKILL; the retry runs the same task instance again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.records.manifest import SnapshotStatus
from airflow_plugin.core.snapshots.store import SnapshotStore
from airflow_plugin.core.storage import open_storage
from devtools.windowed import wait_for
from tests.support.jobs import POLITE_JOB, STUBBORN_JOB, write_jobs
from tests.support.synthetic import write_checkpoint

# One try of a task instance (dag d, run r, the task given): what Airflow's worker would run.
TRY = r"""
import sys
from types import SimpleNamespace
from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow_plugin.operators.deployments import DeployJobOperator, StopJobOperator
from airflow_plugin.operators.snapshots import SavepointOperator
task, jobs = sys.argv[1], sys.argv[2]
kind = {"deploy": DeployJobOperator, "savepoint": SavepointOperator, "stop": StopJobOperator}[task]
options = {"stop": {"savepoint": True}}.get(task, {})
operator = kind(task_id=task, job="orders", jobs_file=jobs, aws_conn_id=None, spark_conn_id=None, **options)
ti = SimpleNamespace(dag_id="d", run_id="r", task_id=task, map_index=-1)
context = {"ti": ti, "outlet_events": OutletEventAccessors()}
print(operator.execute(context))
"""


def _try(task: str, jobs: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", TRY, task, jobs], stdout=subprocess.PIPE, text=True)


def _retry(task: str, jobs: str) -> str:
    done = subprocess.run([sys.executable, "-c", TRY, task, jobs], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_retried_deploy_takes_over_the_driver_its_dead_try_launched(tmp_path: Path) -> None:
    app = tmp_path / "stubborn.py"
    app.write_text(STUBBORN_JOB)
    jobs = str(write_jobs(tmp_path, application=str(app)))
    records = Deployments(open_storage(str(tmp_path / "store")))
    first = _try("deploy", jobs)
    try:
        wait_for(lambda: any(d.launcher for d in records.list("orders")), "the first try to launch the driver")
        first.send_signal(signal.SIGKILL)  # the worker dies; spark-submit runs in its own session and goes on
        first.wait()
        [launched] = records.list("orders")
        retried = _retry("deploy", jobs)
        assert launched.id in retried
        assert [d.id for d in records.list("orders")] == [launched.id]  # one deployment, not two
    finally:
        subprocess.run([sys.executable, "-m", "airflow_plugin", "kill", "orders", "--jobs", jobs], check=False)


@pytest.fixture
def running_orders(tmp_path: Path) -> Iterator[tuple[str, SnapshotStore]]:
    """Job orders with a RUNNING deployment (a heartbeat kept fresh) over a real checkpoint layout."""
    jobs = str(write_jobs(tmp_path))
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    checkpoint = write_checkpoint(tmp_path / "ckpt", batches=40, partitions=8)
    records = Deployments(store.storage)
    records.put(Deployment("dp-20261123T000000000Z-0001", "orders", "v1", str(checkpoint)))
    done = threading.Event()

    def heartbeat() -> None:
        while not done.is_set():
            status = DeploymentStatus(State.RUNNING, time.time(), pid=os.getpid(), last_batch_id=39)
            records.write_status("orders", "dp-20261123T000000000Z-0001", status)
            done.wait(0.5)

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    yield jobs, store
    done.set()
    beating.join()


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [0.0, 0.8])
def test_a_retried_savepoint_leaves_one_completed_snapshot(
    running_orders: tuple[str, SnapshotStore], kill_after: float
) -> None:
    jobs, store = running_orders
    first = _try("savepoint", jobs)
    wait_for(lambda: bool(store.list("orders")), "the first try to start its snapshot")
    time.sleep(kill_after)  # a kill at different points of the copy: before, during, after the commit
    first.send_signal(signal.SIGKILL)
    first.wait()
    _retry("savepoint", jobs)
    manifests = store.list("orders")
    completed = [m for m in manifests if m.status is SnapshotStatus.COMPLETED]
    assert len(completed) == 1, [(m.id, m.status) for m in manifests]
    assert completed[0].request_id == "airflow:d/r/savepoint/-1"
    assert all(
        m.status is SnapshotStatus.FAILED and "abandoned" in (m.error or "") for m in manifests if m not in completed
    )


@pytest.mark.slow
@pytest.mark.parametrize("killed_when", [State.STOPPING, State.STOPPED])
def test_a_retried_stop_with_savepoint_finishes_the_stop_its_dead_try_asked_for(
    tmp_path: Path, killed_when: State
) -> None:
    """Killed while the job stops, or after it stopped but before its savepoint was done: the retry does not
    find 'nothing running' and fail, it finishes that stop and leaves one COMPLETED savepoint."""
    app = tmp_path / "polite.py"
    app.write_text(POLITE_JOB)
    jobs = str(write_jobs(tmp_path, application=str(app)))
    store = SnapshotStore(open_storage(str(tmp_path / "store")))
    records = Deployments(store.storage)
    _retry("deploy", jobs)
    [deployment] = records.list("orders")
    first = _try("stop", jobs)

    def reached() -> bool:
        status = records.status("orders", deployment.id)
        return status is not None and status.state is killed_when

    wait_for(reached, f"the deployment to be {killed_when}", timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait()
    retried = _retry("stop", jobs)
    completed = [m for m in store.list("orders") if m.status is SnapshotStatus.COMPLETED]
    assert len(completed) == 1, [(m.id, m.status) for m in store.list("orders")]
    assert completed[0].deployment == deployment.id and completed[0].id in retried
    assert records.get("orders", deployment.id).retired_at
    assert [d.id for d in records.list("orders")] == [deployment.id]
