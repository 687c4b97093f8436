"""The DAGs load without import errors, and their params forms follow the jobs file."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_plugin.dag_params import declared_jobs
from devtools.airflow_env import DAGS_FOLDER

DAG_IDS = {"savepoints_deploy", "savepoints_savepoint", "savepoints_retention", "savepoints_upgrade"}


@pytest.fixture(scope="module")
def dagbag(airflow_db: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_FOLDER))


def test_every_dag_imports_without_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= DAG_IDS


def test_params_forms_list_the_declared_jobs_and_versions(dagbag) -> None:
    jobs = declared_jobs()
    for dag_id in ("savepoints_deploy", "savepoints_savepoint", "savepoints_upgrade"):
        params = dagbag.get_dag(dag_id).params
        assert params.get_param("job").schema["enum"] == sorted(jobs), dag_id
    versions = dagbag.get_dag("savepoints_upgrade").params.get_param("version").schema["enum"]
    assert set(versions) == {v for spec in jobs.values() for v in spec.versions}


def test_a_job_added_to_the_jobs_file_appears_in_every_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        Path("jobs.toml").read_text()
        + '\n[jobs.another_job]\nversions.v1 = { application = "spark_jobs/jobs/windowed/v1.py" }\n'
    )
    script = (
        "from airflow.dag_processing.dagbag import DagBag; import sys; "
        f"b = DagBag(dag_folder={str(DAGS_FOLDER)!r}); assert not b.import_errors, b.import_errors; "
        "print(*sorted({d: b.get_dag(d).params.get_param('job').schema['enum'] for d in "
        "('savepoints_deploy', 'savepoints_savepoint', 'savepoints_upgrade')}.items()), sep='\\n')"
    )
    env = {**__import__("os").environ, "SAVEPOINTS_JOBS": str(jobs)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.count("another_job") == 3, out


def test_the_plugin_is_registered_through_its_entry_point(airflow_db: Path) -> None:
    import json
    import subprocess
    import sys

    airflow = Path(sys.executable).parent / "airflow"
    out = subprocess.run(
        [str(airflow), "plugins", "--output", "json"], capture_output=True, text=True, check=True
    ).stdout
    plugins = {p["name"]: p for p in json.loads(out[out.index("[") :])}
    assert "savepoints" in plugins, out
    assert "airflow_plugin" in json.dumps(plugins["savepoints"])


@pytest.mark.parametrize(("answer", "cutover"), [("Approve", "success"), ("Reject", "skipped")])
def test_an_upgrade_that_requires_approval_waits_for_a_human(airflow_db: Path, answer: str, cutover: str) -> None:
    """Airflow's human-in-the-loop approval, answered through Airflow's own REST API as the Required Actions
    UI does; the steps around it are marked successful, so no Spark is needed."""
    import threading

    from airflow.api_fastapi.app import create_app
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from fastapi.testclient import TestClient
    from sqlalchemy import select

    from devtools.dag_runs import load_dags, run_dag
    from devtools.windowed import wait_for
    from tests.support.ui_support import bearer

    load_dags()  # all imports done before the second thread touches the DB (lazy imports deadlock)
    api = TestClient(create_app(apps="core"))
    answered: list[int] = []

    def respond() -> bool:
        with create_session() as session:
            waiting = session.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == "savepoints_upgrade",
                    TaskInstance.task_id == "approve",
                    TaskInstance.state == TaskInstanceState.AWAITING_INPUT,
                )
            ).first()
            if waiting is None:
                return False
            path = f"/api/v2/dags/savepoints_upgrade/dagRuns/{waiting.run_id}/taskInstances/approve/-1/hitlDetails"
        response = api.patch(path, json={"chosen_options": [answer]}, headers=bearer("oncall", "ADMIN"))
        answered.append(response.status_code)
        return True

    human = threading.Thread(target=wait_for, args=(respond, "the approval to be asked", 120), daemon=True)
    human.start()
    result = run_dag(
        "savepoints_upgrade",
        {"job": "windowed_counts", "version": "v2", "require_approval": True},
        mark_success="^(savepoint|preflight|prestart_new|stop_old|deploy_new|health_gate)$",
    )
    human.join()
    assert answered == [200]
    assert result.tasks["approval_needed"] == "success" and result.tasks["approve"] == "success", result.tasks
    assert result.tasks["prestart_new"] == cutover and result.tasks["stop_old"] == cutover, result.tasks


def test_an_upgrade_of_a_job_another_run_is_upgrading_fails_at_once_and_changes_nothing(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two upgrade runs of one job: the other run's cutover holds the job's lease between its tasks (as its
    stop_old leaves it); this run's first changing step is refused, its rollback too, nothing is launched
    or stopped, and the other run's lease is left alone. The steps before the cutover (live savepoint,
    pre-flight) are marked successful: no Spark needed."""
    from airflow_plugin.core.jobs.spec import JOBS_ENV
    from airflow_plugin.core.lease import acquire, read_lease
    from airflow_plugin.core.storage import open_storage
    from devtools.dag_runs import run_dag
    from tests.support.jobs import write_jobs
    from tests.support.synthetic import tree

    jobs = write_jobs(tmp_path)
    monkeypatch.setenv(JOBS_ENV, str(jobs))
    store = open_storage(str(tmp_path / "store"))
    other = acquire(store, "orders", "airflow:savepoints_upgrade/manual__the-other-run", "upgrade", ttl=600)
    other.keep()
    before = tree(tmp_path)
    result = run_dag("savepoints_upgrade", {"job": "orders", "version": "v2"}, mark_success="^(savepoint|preflight)$")
    assert result.state == "failed" and result.tasks["prestart_new"] == "failed", result.tasks
    assert result.tasks["stop_old"] == "upstream_failed" and result.tasks["rollback"] == "failed", result.tasks
    assert result.returned["release_lease"]["released"] is False  # not its lease
    held = read_lease(store, "orders")
    assert held is not None and held.holder == other.record.holder
    assert tree(tmp_path) == before  # nothing launched, stopped or written
