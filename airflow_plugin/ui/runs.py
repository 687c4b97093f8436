"""The savepoint, upgrade and deploy DAGs' runs, seen from the page: trigger one for a job exactly as Airflow's
REST API and CLI do (`airflow.api.common.trigger_dag`: a real, queued DagRun in the metadata DB, triggered by
the user, its conf validated against the DAG's params), and list a job's recent ones with their state."""

from __future__ import annotations

from typing import Any

from .errors import ApiError
from .security import DEPLOY_DAG_ID, SAVEPOINT_DAG_ID, UPGRADE_DAG_ID

RECENT_RUNS_SCANNED = 200  # the newest runs of the DAG looked through for one job's


def trigger_savepoint_run(
    job: str, *, stop: bool, pin: bool, label: str, user_name: str, from_ui: bool
) -> dict[str, Any]:
    conf = {"job": job, "stop": stop, "pin": pin, "label": label, "trigger": "UI"}  # taken through the page
    return trigger_run(SAVEPOINT_DAG_ID, conf, user_name=user_name, from_ui=from_ui)


def trigger_upgrade_run(job: str, *, version: str, mode: str, user_name: str, from_ui: bool) -> dict[str, Any]:
    """The upgrade DAG for a job and version (its other fields: the form's defaults)."""
    conf = {"job": job, "version": version, "mode": mode}
    return trigger_run(UPGRADE_DAG_ID, conf, user_name=user_name, from_ui=from_ui)


def trigger_deploy_run(job: str, *, version: str, restore: str, user_name: str, from_ui: bool) -> dict[str, Any]:
    """The deploy DAG for a job, a version and where its state comes from (its other fields: the form's defaults)."""
    conf = {"job": job, "version": version, "restore": restore}
    return trigger_run(DEPLOY_DAG_ID, conf, user_name=user_name, from_ui=from_ui)


def trigger_run(dag_id: str, conf: dict[str, Any], *, user_name: str, from_ui: bool) -> dict[str, Any]:
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound, DagRunAlreadyExists
    from airflow.models import DagModel
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType

    try:
        with create_session() as session:
            run = trigger_dag(
                dag_id,
                triggered_by=DagRunTriggeredByType.UI if from_ui else DagRunTriggeredByType.REST_API,
                triggering_user_name=user_name,
                conf=conf,
                session=session,
            )
            if run is None:  # trigger_dag returns the run it created; None would mean nothing was created
                raise ApiError(500, f"Airflow created no run of {dag_id}: see the API server's log")
            paused = DagModel.get_dagmodel(dag_id, session=session).is_paused
            result = {**run_row(run), "dag_paused": bool(paused)}
    except DagNotFound:
        raise ApiError(
            404,
            f"the DAG {dag_id} is not in Airflow's database yet: check that the dag-processor runs and that "
            f"dags/{dag_id}.py has no import error (Airflow's 'Dag import errors')",
        ) from None
    except DagRunAlreadyExists as exc:
        raise ApiError(409, f"{exc}: try again") from None
    except ValueError as exc:  # ParamValidationError: the conf does not fit the DAG's params form
        raise ApiError(400, f"the DAG {dag_id} refused the request for job {conf.get('job')!r}: {exc}") from None
    return result


def run_row(run: Any) -> dict[str, Any]:
    conf = run.conf or {}
    return {
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        "state": str(run.state.value if hasattr(run.state, "value") else run.state),
        "triggered_by": getattr(run.triggered_by, "value", run.triggered_by),
        "triggering_user": run.triggering_user_name,
        "queued_at": run.queued_at.isoformat() if run.queued_at else None,
        "start_date": run.start_date.isoformat() if run.start_date else None,
        "end_date": run.end_date.isoformat() if run.end_date else None,
        "job": conf.get("job"),
        "stop": bool(conf.get("stop")),
        "pin": bool(conf.get("pin")),
        "label": conf.get("label") or "",
        "version": conf.get("version"),  # of a deploy or an upgrade
    }


def savepoint_dag_file() -> str | None:
    """Where the dag-processor found the savepoint DAG (its jobs file may be next to it), if it did."""
    from airflow.models import DagModel

    dag = DagModel.get_dagmodel(SAVEPOINT_DAG_ID)
    return str(dag.fileloc) if dag is not None and dag.fileloc else None


def recent_runs(job: str, limit: int = 10, dag_id: str = SAVEPOINT_DAG_ID) -> list[dict[str, Any]]:
    """The job's newest runs of the savepoint DAG (or `dag_id`), newest first."""
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(RECENT_RUNS_SCANNED)
        )
        return [run_row(run) for run in runs if (run.conf or {}).get("job") == job][:limit]
