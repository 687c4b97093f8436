"""Shared by the savepoints page's tests: Airflow users and their tokens, the savepoint DAG in the metadata
DB (what the dag-processor would have written), parsed with a given jobs file, a deployment as its records say
(no driver), and a whole running Airflow (API server, scheduler, DAG processor) for the browser test."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from airflow_plugin.core.jobs.deployments import Deployments
from airflow_plugin.core.jobs.spec import JOBS_ENV
from airflow_plugin.core.records.deployment import Deployment, DeploymentStatus, State
from airflow_plugin.core.storage import open_storage
from devtools.ports import free_port

AIRFLOW = Path(sys.executable).parent / "airflow"
# how long a browser test's actions and checks (playwright's `expect`, 5 s by default) wait: seconds on 2 busy cores
BROWSER_WAIT_MS = 60_000
# how long one HTTP request to a test's Airflow may take: its API server's first answers (a token) took over 10 s
# while both cores ran Spark
HTTP_WAIT_S = BROWSER_WAIT_MS / 1000


def token(username: str, role: str) -> str:
    """A JWT the API server accepts, minted by the auth manager that `create_app` initialised."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=username, role=role))


def bearer(username: str, role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(username, role)}"}


def recorded_deployment(store: str, job: str, state: State, checkpoints: Path) -> Deployment:
    """A deployment of `job` as the store records it, with a heartbeat of `state` written now and no driver (a jobs
    file with a long `heartbeat_timeout` keeps it in that state however long the test takes)."""
    deployment = Deployment(f"dp-20261129T000000000Z-{job}", job, "v1", str(checkpoints / job))
    records = Deployments(open_storage(store))
    records.put(deployment)
    records.write_status(job, deployment.id, DeploymentStatus(state, time.time()))
    return deployment


def serialize_dags(jobs_file: Path, env: dict[str, str] | None = None) -> None:
    """Parse the DAGs folder with `jobs_file` and write the DAGs into the metadata DB, as the dag-processor
    does: `airflow dags reserialize` (a subprocess, so that the DAG files read this jobs file). Airflow skips a
    DAG written less than `min_serialized_dag_update_interval` (30 s) ago: an earlier test's `dag.test()` would
    keep its params (the repository's jobs) when this follows it that soon, so the interval is 0 here."""
    result = subprocess.run(
        [str(AIRFLOW), "dags", "reserialize"],
        env={
            **os.environ,
            **(env or {}),
            JOBS_ENV: str(jobs_file),
            "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow dags reserialize failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


class AirflowStack:
    """A real Airflow on 127.0.0.1: `airflow api-server` (with the plugin), `airflow scheduler`
    (LocalExecutor) and `airflow dag-processor`, in a fresh AIRFLOW_HOME with its own sqlite DB and
    SimpleAuthManager users `admin` and `viewer` (passwords in `passwords`). Each process runs in its own
    session and is stopped by its process group id; their logs stay in `home/logs-*.txt`."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.passwords = {"admin": "admin-" + secrets.token_hex(4), "viewer": "viewer-" + secrets.token_hex(4)}
        home.mkdir(parents=True, exist_ok=True)
        (home / "passwords.json").write_text(json.dumps(self.passwords))
        self.env = {
            **os.environ,
            **env,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # a worker's calls to the execution API wait out a busy machine instead of failing the task
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> AirflowStack:
        self.run("db", "migrate")
        commands = {
            "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            "scheduler": ["scheduler", "--skip-serve-logs"],  # no log server on 0.0.0.0:8793: logs are local files
            "dag-processor": ["dag-processor"],
        }
        try:
            for name, args in commands.items():
                with (self.home / f"logs-{name}.txt").open("wb") as log:
                    command = [str(AIRFLOW), *args]
                    self.processes[name] = subprocess.Popen(
                        command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, *args: str) -> str:
        result = subprocess.run([str(AIRFLOW), *args], env=self.env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        return result.stdout

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.home / f"logs-{name}.txt"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
