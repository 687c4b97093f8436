"""`make airflow`: the second way in, for people who want the UI. Runs `airflow standalone` (API server,
scheduler, DAG processor, triggerer) in a project-local AIRFLOW_HOME (.airflow) with this project's DAGs
and the plugin, on the jobs file jobs.toml (its store is the local .runs/store unless $SAVEPOINTS_STORE
says otherwise). Airflow prints the admin password it generates (also kept in
.airflow/simple_auth_manager_passwords.json.generated); the UI is at http://127.0.0.1:8080
(`make airflow AIRFLOW_PORT=8090` for another port)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from devtools import airflow_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make airflow", description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=Path(".airflow"), help="AIRFLOW_HOME (default .airflow)")
    parser.add_argument("--port", type=int, default=8080, help="the API server's port (default 8080)")
    args = parser.parse_args(argv)
    home = args.home.absolute()
    airflow_env.configure(home)
    host = os.environ.setdefault("AIRFLOW__API__HOST", "127.0.0.1")  # this machine only, unless asked otherwise
    # the workers reach the API server on the port it really listens on
    url = f"http://{'127.0.0.1' if host in ('127.0.0.1', '0.0.0.0') else host}:{args.port}"
    os.environ["AIRFLOW__API__PORT"] = str(args.port)
    os.environ.setdefault("AIRFLOW__API__BASE_URL", url)
    os.environ.setdefault("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"{url}/execution/")
    # the LocalExecutor starts this many worker processes up front (32 by default); the DAGs' tasks are
    # short (the Spark drivers run detached), so a few suffice
    os.environ.setdefault("AIRFLOW__CORE__PARALLELISM", "4")
    bin_dir = str(Path(sys.executable).parent)
    # standalone starts its components as `airflow ...` from PATH: this environment's, not another one's
    os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    airflow = str(Path(bin_dir) / "airflow")
    print(
        f"airflow standalone in {home}: DAGs from {airflow_env.DAGS_FOLDER}, jobs from "
        f"{os.environ['SAVEPOINTS_JOBS']}; the UI will be at {url}",
        flush=True,
    )
    return run_until_interrupted([airflow, "standalone"])


def run_until_interrupted(command: list[str]) -> int:
    """Run `command` in a session of its own and pass it ONE SIGINT on Ctrl-C (a second Ctrl-C kills it).
    A terminal's Ctrl-C signals the whole foreground group: standalone's scheduler would get SIGINT from
    the terminal and then SIGTERM from standalone, and that second signal leaves it waiting forever for
    its LocalExecutor workers. Signalled once, standalone stops every component within seconds."""
    process = subprocess.Popen(command, start_new_session=True)
    interrupts = 0

    def forward(signum: int, frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print("stopping airflow standalone (Ctrl-C again to kill it)", flush=True)
            process.send_signal(signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGKILL)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return process.wait()


if __name__ == "__main__":
    sys.exit(main())
