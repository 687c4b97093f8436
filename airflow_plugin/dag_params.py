"""The DAGs' params forms, built from the jobs file the CLI reads: adding a job (or a version) there adds
it to every form.

Which jobs file: $SAVEPOINTS_JOBS, else `jobs.toml` in the DAG file's own folder (where `savepoints
install-dags` puts the example one). Without either, the DAG fails to import with a message saying so:
Airflow shows it among its DAG import errors."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import Param

from .core.errors import NotFound
from .core.jobs.deploy import RESTORE_HELP
from .core.jobs.spec import (
    DEFAULT_JOBS_FILE,
    DEFAULT_RESTORE,
    JOBS_ENV,
    RESTORE_MODES,
    JobSpec,
    load_jobs,
    version_order,
)


def dag_jobs_file(dag_file: str | None = None) -> str:
    """The jobs file of the DAG defined in `dag_file`; read when the DAG file is parsed, so a changed
    $SAVEPOINTS_JOBS takes effect at the next parse."""
    given = os.environ.get(JOBS_ENV)
    if given:
        if not Path(given).expanduser().is_file():
            raise NotFound(
                f"the savepoints DAGs' jobs file {given} (${JOBS_ENV}) does not exist: point {JOBS_ENV} at your "
                "jobs file in the environment of Airflow's DAG processor, scheduler, workers and API server"
            )
        return str(Path(given).expanduser().absolute())
    beside = Path(dag_file).absolute().parent / DEFAULT_JOBS_FILE if dag_file else None
    if beside is not None and beside.is_file():
        return str(beside)
    where = f"no {beside}" if beside else "no DAG file to look beside"
    raise NotFound(
        f"no jobs file for the savepoints DAGs: ${JOBS_ENV} is not set and there is {where}. Set {JOBS_ENV} to "
        "your jobs file in the environment of Airflow's DAG processor, scheduler, workers and API server, or "
        "run `savepoints install-dags DAGS_FOLDER`, which puts the example jobs.toml next to the DAGs"
    )


def declared_jobs(jobs_file: str) -> dict[str, JobSpec]:
    return load_jobs(jobs_file)


def job_param(jobs: dict[str, JobSpec], jobs_file: str) -> Param:
    names = sorted(jobs)
    return Param(
        _default_job(jobs),
        type="string",
        enum=names,
        title="Job",
        description="A job declared in " + jobs_file,
        values_display={
            name: f"{name}: {jobs[name].description}" if jobs[name].description else name for name in names
        },
    )


def version_param(jobs: dict[str, JobSpec], title: str = "Version", *, default: bool = True) -> Param:
    """A version declared in the jobs file, in natural order (v2 before v10); `default=False` leaves the choice
    to the person (an upgrade's new version: the default version is usually the one running). The default is
    the `default_version` of the job the form starts with."""
    versions = version_order({v for spec in jobs.values() for v in spec.versions})
    description = "A version of the job declared in the jobs file (a version another job lacks is refused)"
    if not default:
        return Param(type="string", enum=versions, title=title, description=description)
    first = jobs.get(_default_job(jobs))
    return Param(
        first.default_version if first else "",
        type="string",
        enum=versions,
        title=title,
        description=description,
    )


def _default_job(jobs: dict[str, JobSpec]) -> str:
    """The job a form starts with: the first by name."""
    return min(jobs, default="")


RESTORE_TITLE = "Restore from"  # the field a DAG user is told to change (operators/deployments.py)


def restore_param() -> Param:
    return Param(
        DEFAULT_RESTORE,
        type="string",
        title=RESTORE_TITLE,
        description=RESTORE_HELP,
        examples=list(RESTORE_MODES),
        minLength=1,
    )
