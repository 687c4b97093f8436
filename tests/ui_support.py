"""Shared by the savepoints page's tests: Airflow users and their tokens, and the savepoint DAG in the
metadata DB (what the dag-processor would have written), parsed with a given jobs file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AIRFLOW = Path(sys.executable).parent / "airflow"


def token(username: str, role: str) -> str:
    """A JWT the API server accepts, minted by the auth manager that `create_app` initialised."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=username, role=role))


def bearer(username: str, role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(username, role)}"}


def serialize_dags(jobs_file: Path, env: dict[str, str] | None = None) -> None:
    """Parse the DAGs folder with `jobs_file` and write the DAGs into the metadata DB, as the dag-processor
    does: `airflow dags reserialize` (a subprocess, so that the DAG files read this jobs file)."""
    result = subprocess.run(
        [str(AIRFLOW), "dags", "reserialize"],
        env={**os.environ, **(env or {}), "SAVEPOINTS_JOBS": str(jobs_file)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow dags reserialize failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
