"""A project-local Airflow: AIRFLOW_HOME with a migrated sqlite metadata DB, this project's DAGs folder,
no examples. For the demo and the tests; `configure` must run before anything imports airflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO / "dags"


def configure(home: Path) -> dict[str, str]:
    """Point this process (and its children) at `home`. Returns the variables set."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # the Spark provider's spark_default would otherwise not exist: local Spark, client mode
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}',
    }
    os.environ.update(env)
    # the DAGs' jobs file (they read $SAVEPOINTS_JOBS, else a jobs.toml beside them): the project's, unless given
    env["SAVEPOINTS_JOBS"] = os.environ.setdefault("SAVEPOINTS_JOBS", str(REPO / "jobs.toml"))
    return env


def migrate(home: Path) -> None:
    """`airflow db migrate` once per home (about 6 s); a marker skips it next time."""
    marker = home / ".migrated"
    if marker.exists():
        return
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy())
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed in {home}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    marker.write_text("ok\n")
