"""`make airflow`: the second way in, for people who want the UI. Runs `airflow standalone` (API server,
scheduler, DAG processor, triggerer) in a project-local AIRFLOW_HOME (.airflow) with this project's DAGs
and the plugin, on the jobs file jobs.toml (its store is the local .runs/store unless $SAVEPOINTS_STORE
says otherwise). Airflow prints the admin password it generates; the UI is at http://localhost:8080."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from devtools import airflow_env


def main() -> int:
    home = Path(".airflow").absolute()
    airflow_env.configure(home)
    os.environ.setdefault("SAVEPOINTS_JOBS", str(airflow_env.REPO / "jobs.toml"))
    os.environ.setdefault("AIRFLOW__API__HOST", "127.0.0.1")  # this machine only, unless asked otherwise
    airflow = str(Path(sys.executable).parent / "airflow")
    print(
        f"airflow standalone in {home}: DAGs from {airflow_env.DAGS_FOLDER}, jobs from {os.environ['SAVEPOINTS_JOBS']}"
    )
    os.execv(airflow, [airflow, "standalone"])


if __name__ == "__main__":
    sys.exit(main())
