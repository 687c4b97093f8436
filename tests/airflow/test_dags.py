"""The DAGs load without import errors, their params forms follow the jobs file, and `savepoints
install-dags` puts them into a DAGs folder where they load with no Airflow setting at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_plugin.cli import main
from airflow_plugin.dag_params import dag_jobs_file, declared_jobs
from devtools.airflow_env import DAGS_FOLDER

DAG_IDS = {
    "savepoints_deploy",
    "savepoints_savepoint",
    "savepoints_retention",
    "savepoints_upgrade",
    "savepoints_reconcile",
}


@pytest.fixture(scope="module")
def dagbag(airflow_db: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_FOLDER))


def test_every_dag_imports_without_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) >= DAG_IDS


def test_params_forms_list_the_declared_jobs_and_versions(dagbag) -> None:
    jobs = declared_jobs(dag_jobs_file())
    for dag_id in ("savepoints_deploy", "savepoints_savepoint", "savepoints_upgrade"):
        params = dagbag.get_dag(dag_id).params
        assert params.get_param("job").schema["enum"] == sorted(jobs), dag_id
    versions = dagbag.get_dag("savepoints_upgrade").params.get_param("version").schema["enum"]
    assert set(versions) == {v for spec in jobs.values() for v in spec.versions}


def test_forms_list_versions_in_natural_order_and_start_with_the_declared_default(tmp_path: Path) -> None:
    """Issue 45: by name, v10 came before v2, and the form's default was the smallest default by name of any
    job. Now natural order, and the default is the default_version of the job the form starts with."""
    from airflow_plugin.dag_params import job_param, version_param

    versions = "".join(f'versions.{v} = {{ application = "job.py" }}\n' for v in ("v10", "v2", "v1"))
    (tmp_path / "jobs.toml").write_text(
        f'[defaults]\ncheckpoint_root = "c"\n[jobs.alpha]\ndefault_version = "v10"\n{versions}'
        f'[jobs.beta]\ndefault_version = "v2"\n{versions}'
    )
    jobs = declared_jobs(str(tmp_path / "jobs.toml"))
    assert job_param(jobs, "jobs.toml").value == "alpha"
    deploy = version_param(jobs)
    assert deploy.schema["enum"] == ["v1", "v2", "v10"] and deploy.value == "v10"  # alpha's, not min("v10", "v2")
    assert version_param(jobs, "New version", default=False).schema["enum"] == ["v1", "v2", "v10"]


def parse_dags(folder: Path, monkeypatch: pytest.MonkeyPatch, jobs_file: Path | None) -> Any:
    """Airflow's DagBag of `folder` with $SAVEPOINTS_JOBS set to `jobs_file` (None: unset); the DAG files read
    it when parsed, and a DagBag parses them afresh."""
    from airflow.dag_processing.dagbag import DagBag

    if jobs_file is None:
        monkeypatch.delenv("SAVEPOINTS_JOBS", raising=False)
    else:
        monkeypatch.setenv("SAVEPOINTS_JOBS", str(jobs_file))
    return DagBag(dag_folder=str(folder))


def defaults(dag: Any) -> dict[str, Any]:
    """Each param's default; '<none>' when it has none."""
    return {
        name: "<none>" if type(dag.params.get_param(name).value).__name__ == "ArgNotSet" else value
        for name, value in dag.params.dump().items()
    }


def test_a_job_added_to_the_jobs_file_appears_in_every_form(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        Path("jobs.toml").read_text()
        + '\n[jobs.another_job]\nversions.v1 = { application = "spark_jobs/jobs/windowed/v1.py" }\n'
    )
    bag = parse_dags(DAGS_FOLDER, monkeypatch, jobs)
    assert bag.import_errors == {}
    for dag_id in ("savepoints_deploy", "savepoints_savepoint", "savepoints_upgrade"):
        assert "another_job" in bag.get_dag(dag_id).params.get_param("job").schema["enum"], dag_id


def test_without_a_jobs_file_the_dags_import_error_says_what_to_do(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "savepoints_deploy.py").write_text((DAGS_FOLDER / "savepoints_deploy.py").read_text())
    [message] = parse_dags(tmp_path, monkeypatch, None).import_errors.values()
    assert "no jobs file for the savepoints DAGs" in message, message
    assert "SAVEPOINTS_JOBS" in message and "savepoints install-dags DAGS_FOLDER" in message
    [missing] = parse_dags(tmp_path, monkeypatch, tmp_path / "gone.toml").import_errors.values()
    assert f"jobs file {tmp_path / 'gone.toml'} ($SAVEPOINTS_JOBS) does not exist" in missing, missing


def test_install_dags_puts_dags_and_jobs_into_a_dags_folder_where_they_load(
    airflow_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    assert main(["install-dags", str(dags)]) == 0
    out = capsys.readouterr().out
    assert f"added     {dags / 'savepoints' / 'savepoints_upgrade.py'}" in out, out
    folder = dags / "savepoints"
    assert (folder / "jobs.toml").read_text() == Path("jobs.toml").read_text()
    assert (folder / ".airflowignore").read_text() == ".runs/\n"

    bag = parse_dags(dags, monkeypatch, None)  # no Airflow setting: the DAGs read the jobs.toml beside them
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == DAG_IDS
    jobs = bag.get_dag("savepoints_deploy").params.get_param("job").schema["enum"]
    assert jobs == ["kafka_counts", "windowed_counts"]

    (folder / "jobs.toml").write_text((folder / "jobs.toml").read_text() + "\n# mine\n")
    (folder / "savepoints_deploy.py").write_text("# an old copy\n")
    capsys.readouterr()  # what parsing printed
    assert main(["install-dags", str(dags), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["dags"]["savepoints_deploy.py"] == "updated" and again["dags"]["savepoints_upgrade.py"] == "unchanged"
    assert again["jobs_file_kept"] is True and (folder / "jobs.toml").read_text().endswith("# mine\n")

    (tmp_path / "a-file").touch()
    assert main(["install-dags", str(tmp_path / "a-file")]) == 2
    assert "airflow config get-value core dags_folder" in capsys.readouterr().err


def test_the_forms_open_ready_to_send_and_show_no_internal_field(dagbag: Any) -> None:
    """Airflow's trigger form marks a field required unless its type allows null, and refuses to send while a
    required field is empty; a field it should not show does not belong in params."""
    savepoint = dagbag.get_dag("savepoints_savepoint")
    assert set(savepoint.params) == {"job", "stop", "pin", "label"}  # trigger=UI comes with the page's conf
    assert "null" in savepoint.params.get_param("label").schema["type"] and defaults(savepoint)["label"] is None
    for dag_id in DAG_IDS:
        dag = dagbag.get_dag(dag_id)
        for name, default in defaults(dag).items():
            required = "null" not in dag.params.get_param(name).schema.get("type", [])
            if required and (dag_id, name) != ("savepoints_upgrade", "version"):
                assert default not in (None, "", "<none>"), (dag_id, name, default)
    # the new version of an upgrade is the person's choice: no default (the default version usually runs)
    assert defaults(dagbag.get_dag("savepoints_upgrade"))["version"] == "<none>"


def test_the_deploy_dag_the_operator_and_the_cli_share_one_default_for_where_the_state_comes_from(dagbag: Any) -> None:
    """Issue 43: the deploy DAG continued from the latest state while `savepoints deploy` and DeployJobOperator
    started empty. One default now: a job with history continues, a fresh start is asked for by name."""
    from airflow_plugin.cli.parser import parse
    from airflow_plugin.core.jobs.deploy import DEFAULT_RESTORE, RESTORE_HELP, DeployRequest
    from airflow_plugin.operators import DeployJobOperator

    restore = dagbag.get_dag("savepoints_deploy").params.get_param("restore")
    assert restore.value == DEFAULT_RESTORE == "latest-state" and restore.description == RESTORE_HELP
    assert DeployJobOperator(task_id="t", job="orders").restore == DEFAULT_RESTORE == DeployRequest().restore
    assert parse(["deploy", "orders"]).restore == DEFAULT_RESTORE
    assert RESTORE_HELP.startswith("latest-state (the default: a job with history continues from its latest state")
    assert "or none: start empty (of a job with state it says which state, at which batch" in RESTORE_HELP


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


class Human:
    """A person who answers a task's human-in-the-loop request through Airflow's own REST API, as the Required
    Actions UI does, once the task waits for it (in a thread: call `start` before running the DAG)."""

    def __init__(self, dag_id: str, task_id: str, answer: str) -> None:
        import threading

        from airflow.api_fastapi.app import create_app
        from fastapi.testclient import TestClient

        from devtools.dag_runs import load_dags
        from devtools.windowed import wait_for

        load_dags()  # all imports done before the second thread touches the DB (lazy imports deadlock)
        self.dag_id, self.task_id, self.answer = dag_id, task_id, answer
        self.api = TestClient(create_app(apps="core"))
        self.answered: list[int] = []
        self.thread = threading.Thread(target=wait_for, args=(self._respond, "the approval to be asked", 120))
        self.thread.daemon = True

    def _respond(self) -> bool:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState
        from sqlalchemy import select

        from tests.support.ui_support import bearer

        with create_session() as session:
            waiting = session.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == self.dag_id,
                    TaskInstance.task_id == self.task_id,
                    TaskInstance.state.in_([TaskInstanceState.AWAITING_INPUT, TaskInstanceState.DEFERRED]),
                )
            ).first()
            if waiting is None:
                return False
            path = f"/api/v2/dags/{self.dag_id}/dagRuns/{waiting.run_id}/taskInstances/{self.task_id}/-1/hitlDetails"
            self.asked = self.api.get(path, headers=bearer("oncall", "ADMIN")).json()
        response = self.api.patch(path, json={"chosen_options": [self.answer]}, headers=bearer("oncall", "ADMIN"))
        self.answered.append(response.status_code)
        return True

    def start(self) -> Human:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join()
        assert self.answered == [200], "the person's answer was not taken"


@pytest.mark.parametrize(("answer", "cutover"), [("Approve", "success"), ("Reject", "skipped")])
def test_an_upgrade_that_requires_approval_waits_for_a_human(airflow_db: Path, answer: str, cutover: str) -> None:
    """Airflow's human-in-the-loop approval, answered through Airflow's own REST API as the Required Actions
    UI does; the steps around it are marked successful, so no Spark is needed."""
    from devtools.dag_runs import run_dag

    human = Human("savepoints_upgrade", "approve", answer).start()
    result = run_dag(
        "savepoints_upgrade",
        {"job": "windowed_counts", "version": "v2", "require_approval": True},
        mark_success="^(begin|launch|catch_up|cutover|retire|confirm)$",
    )
    human.join()
    assert result.tasks["approval_needed"] == "success" and result.tasks["approve"] == "success", result.tasks
    assert result.tasks["launch"] == cutover and result.tasks["cutover"] == cutover, result.tasks


USER_DAG = """
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_plugin.operators import UpgradeJobOperator

with DAG("upgrade_my_job", schedule=None, catchup=False) as dag:
    UpgradeJobOperator(
        task_id="upgrade",
        job="orders",
        version="v2",
        approve=True,
        approval_timeout=timedelta(hours=2),
        jobs_file="{jobs}",
        aws_conn_id=None,
        spark_conn_id=None,
    )

if __name__ == "__main__":
    at = datetime.fromisoformat(sys.argv[1])
    print("STATE", dag.test(logical_date=at, run_after=at).state)
"""


@pytest.mark.parametrize("answer", ["Approve", "Reject"])
def test_the_upgrade_operator_asks_a_person_before_it_launches_anything(
    airflow_db: Path, tmp_path: Path, answer: str
) -> None:
    """Issue 44: `UpgradeJobOperator(approve=True)` stops once its pre-flight passed, before any launch, and asks in
    Airflow's Required Actions with the plan in front of the person, the job's lease kept meanwhile. Approved, the
    approval is recorded (a retry does not ask again) and the launch goes on; rejected, the upgrade is aborted and
    the lease released, nothing launched. The upgrade's record is seeded where its pre-flight leaves it (no Spark):
    its old deployment is gone, so an approved launch fails and aborts too, after the approval is recorded."""
    import os
    import subprocess
    import sys
    from datetime import UTC, datetime

    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.lease import acquire, airflow_holder, read_lease
    from airflow_plugin.core.upgrades.record import Phase, Upgrade, Upgrades, new_upgrade_id
    from airflow_plugin.core.upgrades.steps import LEASE_SECONDS, upgrade_holder
    from tests.support.jobs import write_jobs

    jobs = write_jobs(tmp_path)
    ctx = Settings(jobs_file=str(jobs)).resolve().job("orders")
    at = datetime(2026, 11, 28, 12, tzinfo=UTC)
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=at, run_after=at)
    upgrade = Upgrade(
        id=new_upgrade_id(),
        job="orders",
        to_version="v2",
        mode="stop_restore",
        old_version="v1",
        savepoint="sp-20261128T000000Z-0001",
        modes={"stop_restore": "its sink takes no second writer"},
        request_id=f"airflow:upgrade_my_job/{run_id}/upgrade/-1",
    )
    upgrade.move(Phase.LAUNCHING, "pre-flight passed")
    upgrades = Upgrades(ctx.store.storage)
    upgrades.put(upgrade)
    holder = upgrade_holder(upgrade.id, airflow_holder("upgrade_my_job", run_id))  # the run's begin kept it
    acquire(ctx.store.storage, "orders", holder, "upgrade", LEASE_SECONDS).keep()
    dags = tmp_path / "dags"  # the user's DAGs folder: dag.test() runs a DAG of the process's bundle
    dags.mkdir()
    (dags / "upgrade_my_job.py").write_text(USER_DAG.format(jobs=jobs))
    human = Human("upgrade_my_job", "upgrade", answer).start()
    run = subprocess.run(
        [sys.executable, str(dags / "upgrade_my_job.py"), at.isoformat()],
        env={**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    human.join()

    assert human.asked["subject"] == "Launch v2 of orders?", human.asked
    assert "from v1 to **v2**, mode **stop_restore** (its sink takes no second writer)" in human.asked["body"]
    record = upgrades.get("orders", upgrade.id)
    notes = [entry["note"] for entry in record.history]
    assert any(note.startswith("waits up to 7200s for a person to approve the launch") for note in notes), notes
    assert record.phase is Phase.ABORTED and record.new_deployment is None, record.history
    assert "STATE failed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]  # the upgrade did not go through
    if answer == "Approve":
        assert record.approved_by == "oncall" and "launch approved by oncall" in notes, notes
        assert notes.index("launch approved by oncall") < len(notes) - 2  # the launch was tried, then aborted
    else:
        assert record.approved_by is None and record.error == "launch rejected by oncall", record.error
    assert read_lease(ctx.store.storage, "orders") is None  # released: nobody holds the job


def test_an_upgrade_of_a_job_another_run_is_upgrading_fails_at_once_and_changes_nothing(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two upgrade runs of one job: the other one holds the job's lease between its steps; this run's begin is
    refused at once (no upgrade recorded, no savepoint taken), its recovery has nothing to do, nothing is
    launched or stopped, and the other run's lease is left alone. No Spark is needed."""
    from airflow_plugin.core.jobs.spec import JOBS_ENV
    from airflow_plugin.core.lease import acquire, read_lease
    from airflow_plugin.core.storage import open_storage
    from devtools.dag_runs import run_dag
    from tests.support.jobs import write_jobs
    from tests.support.synthetic import tree

    jobs = write_jobs(tmp_path)
    monkeypatch.setenv(JOBS_ENV, str(jobs))
    store = open_storage(str(tmp_path / "store"))
    other = acquire(store, "orders", "upgrade:up-20261124T000000000Z-0001", "upgrade", ttl=600)
    other.keep()
    before = tree(tmp_path)
    result = run_dag("savepoints_upgrade", {"job": "orders", "version": "v2"})
    assert result.state == "failed" and result.tasks["begin"] == "failed", result.tasks
    assert "job orders is busy: upgrade:up-20261124T000000000Z-0001 for upgrade" in result.pushed["begin"]["error"]
    assert result.tasks["launch"] == "upstream_failed" and result.tasks["recover"] == "success", result.tasks
    assert result.returned["recover"]["phase"] == "none"  # no upgrade was begun
    held = read_lease(store, "orders")
    assert held is not None and held.holder == other.record.holder
    assert tree(tmp_path) == before  # nothing launched, stopped or written


def test_install_dags_refuses_a_local_store_under_an_executor_whose_tasks_run_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example jobs file keeps its store in a local path: on Celery or Kubernetes workers each would have its
    own. Refused, nothing written; a jobs file with a store on S3 ($SAVEPOINTS_JOBS, or one already there) installs."""
    dags = tmp_path / "dags"
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor,CeleryExecutor")
    monkeypatch.delenv("SAVEPOINTS_JOBS", raising=False)
    assert main(["install-dags", str(dags)]) == 4
    err = capsys.readouterr().err
    assert "in a local path, but Airflow's executor (CeleryExecutor) runs tasks on other machines" in err, err
    assert 'store = "s3://bucket/prefix"' in err and "SAVEPOINTS_JOBS" in err and not dags.exists()

    shared = tmp_path / "shared.toml"
    shared.write_text(Path("jobs.toml").read_text().replace('store = ".runs/store"', 'store = "s3://lake/store"'))
    assert "s3://lake/store" in shared.read_text(), "the example's store line"
    monkeypatch.setenv("SAVEPOINTS_JOBS", str(shared))
    assert main(["install-dags", str(dags)]) == 0
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    monkeypatch.delenv("SAVEPOINTS_JOBS")
    assert main(["install-dags", str(tmp_path / "local")]) == 0, "a local executor: the example as it is"


@pytest.mark.slow
def test_the_reconcile_dag_deploys_a_declared_job_then_keeps_it(
    airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46: the reconcile DAG maps `savepoints apply` over the jobs that declare `desired`; its first run
    deploys the declared version (a stand-in driver through a real spark-submit), the next finds it as declared."""
    from airflow_plugin.core.jobs.context import Settings
    from airflow_plugin.core.jobs.deployments import State
    from airflow_plugin.core.jobs.observe import state_of
    from airflow_plugin.core.jobs.spec import JOBS_ENV
    from devtools.dag_runs import run_dag
    from tests.support.jobs import POLITE_JOB, kill_every_deployment, write_jobs

    app = tmp_path / "polite.py"
    app.write_text(POLITE_JOB)
    jobs = write_jobs(tmp_path, application=str(app), extra='desired = { version = "v2" }')
    monkeypatch.setenv(JOBS_ENV, str(jobs))
    job = Settings(jobs_file=str(jobs)).resolve().job("orders")
    try:
        first = run_dag("savepoints_reconcile", {})
        assert first.succeeded and first.returned["apply"]["action"] == "DEPLOY", (first.tasks, first.returned)
        [deployment] = job.deployments.list("orders")
        assert deployment.version == "v2" and state_of(job, deployment) is State.RUNNING
        again = run_dag("savepoints_reconcile", {})
        assert again.succeeded and again.returned["apply"]["action"] == "NOTHING", again.returned
        assert [d.id for d in job.deployments.list("orders")] == [deployment.id]
    finally:
        kill_every_deployment(job)
