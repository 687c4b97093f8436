"""The DAGs' params forms, built from the jobs file the CLI reads: adding a job (or a version) there adds
it to every form. The file is $SAVEPOINTS_JOBS, else the project's jobs.toml next to this package."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import Param

from .core.jobs.deploy import RESTORE_MODES
from .core.jobs.spec import JOBS_ENV, JobSpec, load_jobs

PROJECT_JOBS_FILE = Path(__file__).resolve().parents[1] / "jobs.toml"


def dag_jobs_file() -> str:
    """Read when a DAG file is parsed, so a changed $SAVEPOINTS_JOBS takes effect at the next parse."""
    return os.environ.get(JOBS_ENV) or str(PROJECT_JOBS_FILE)


def declared_jobs(jobs_file: str | None = None) -> dict[str, JobSpec]:
    return load_jobs(jobs_file or dag_jobs_file())


def job_param(jobs: dict[str, JobSpec]) -> Param:
    names = sorted(jobs)
    return Param(
        names[0] if names else "",
        type="string",
        enum=names,
        title="Job",
        description="A job declared in " + dag_jobs_file(),
        values_display={
            name: f"{name}: {jobs[name].description}" if jobs[name].description else name for name in names
        },
    )


def version_param(jobs: dict[str, JobSpec], title: str = "Version") -> Param:
    versions = sorted({v for spec in jobs.values() for v in spec.versions})
    defaults = sorted({spec.default_version for spec in jobs.values() if spec.default_version})
    return Param(
        defaults[0] if defaults else (versions[0] if versions else ""),
        type="string",
        enum=versions,
        title=title,
        description="A version of the job declared in the jobs file (a version another job lacks is refused)",
    )


def restore_param() -> Param:
    return Param(
        "latest-state",
        type="string",
        title="Restore from",
        description="none (fresh start), latest-state, latest-savepoint, or a snapshot id (sp-... / ck-...)",
        examples=list(RESTORE_MODES),
        minLength=1,
    )
