"""`make airflow`: the second way in, for people who want the UI. Runs `airflow standalone` (API server,
scheduler, DAG processor, triggerer) in a project-local AIRFLOW_HOME (.airflow) with this project's DAGs
and the plugin, on the jobs file jobs.toml (its store is the local .runs/store unless $SAVEPOINTS_STORE
says otherwise). Everything listens on 127.0.0.1 only (the API server; no task log servers). Airflow
prints the admin password it generates (also kept in .airflow/simple_auth_manager_passwords.json.generated);
the UI is at http://127.0.0.1:8080 (`make airflow AIRFLOW_PORT=8090` for another port).

When the jobs file declares a job that reads Kafka (a `kafka` table), a Kafka broker is started for it on a
free port of 127.0.0.1 ($SAVEPOINTS_KAFKA_BOOTSTRAP points every component and driver at it), its topic is
created, a round of events is produced every few seconds, and the broker is stopped when standalone ends.

The jobs' drivers are not Airflow's: a deployment made from the UI runs on after standalone ends (as it would
when a real Airflow restarts). So at shutdown this says which deployments still run and how to stop them, and
stops the ones that read the broker it is about to stop (they could not run on without it; a plain stop at a
batch boundary, so `--restore latest-state` continues them later)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.jobs.context import KAFKA_ENV, STORE_ENV, Settings
from airflow_plugin.core.jobs.deploy import live_deployments
from airflow_plugin.core.jobs.spec import load_jobs
from airflow_plugin.core.jobs.stop import stop
from airflow_plugin.core.records.deployment import State
from devtools import airflow_env, processes
from devtools.feeding import BackgroundFeeder
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import PARTITIONS, KafkaFeeder, topic_of

FEED_INTERVAL = 5.0  # seconds between rounds of events produced for a Kafka job


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
    airflow = str(Path(bin_dir) / "airflow")
    # standalone starts its components as `airflow ...` from PATH: this environment's, through a shim
    os.environ["PATH"] = os.pathsep.join([str(component_shim(home, airflow)), bin_dir, os.environ.get("PATH", "")])
    print(
        f"airflow standalone in {home}: DAGs from {airflow_env.DAGS_FOLDER}, jobs from "
        f"{os.environ['SAVEPOINTS_JOBS']}; the UI will be at {url}",
        flush=True,
    )
    with contextlib.ExitStack() as running:
        brokered = _kafka_for_jobs(running)
        code = run_until_interrupted([airflow, "standalone"])
        for line in still_running(os.environ["SAVEPOINTS_JOBS"], brokered):  # before the broker stops
            print(line, flush=True)
        return code


STOP_TIMEOUT = 60.0  # seconds a job reading the broker gets to stop at a batch boundary


def still_running(jobs_file: str, brokered: set[str]) -> list[str]:
    """What still runs once standalone ended, with how to stop it; the deployments of `brokered` jobs (they read
    the broker `make airflow` stops next) are stopped first."""
    store = os.environ.get(STORE_ENV)
    prefix = f"{STORE_ENV}={shlex.quote(store)} " if store else ""
    lines = []
    try:
        context = Settings(jobs_file=jobs_file).resolve()
        for name in sorted(context.jobs):
            job = context.job(name)
            for deployment, state in live_deployments(job):
                # a LOST one (no heartbeat) may not answer a stop request: kill ends its process
                verb = "kill" if state is State.LOST else "stop"
                stop_command = f"{prefix}savepoints {verb} {name} --jobs {shlex.quote(jobs_file)}"
                if name in brokered and state is not State.LOST:
                    try:
                        stop(job, deployment_id=deployment.id, timeout=STOP_TIMEOUT)
                        lines.append(
                            f"stopped {name}'s deployment {deployment.id}: it reads the Kafka broker that stops now "
                            "(`savepoints deploy --restore latest-state` continues it)"
                        )
                        continue
                    except SavepointsError as exc:
                        lines.append(f"could not stop {name}'s deployment {deployment.id}: {exc}")
                lines.append(
                    f"still running: {name}'s deployment {deployment.id} ({deployment.version}, {state}); its driver "
                    f"is not Airflow's and runs on: {verb} it with `{stop_command}`"
                )
    except SavepointsError as exc:
        lines.append(f"could not check for deployments still running ({jobs_file}): {exc}")
    return lines


def _kafka_for_jobs(running: contextlib.ExitStack) -> set[str]:
    """A broker, topics and a feeder for the jobs that read Kafka; all stopped when `running` closes. Returns
    the names of those jobs."""
    readers = {
        name: t
        for name, spec in load_jobs(os.environ["SAVEPOINTS_JOBS"]).items()
        if spec.kafka and (t := topic_of(spec))
    }
    topics = sorted(set(readers.values()))
    if not topics:
        return set()
    kafka = running.enter_context(EmbeddedKafka())
    os.environ[KAFKA_ENV] = kafka.bootstrap  # standalone's components and the drivers they launch inherit it
    for topic in topics:
        kafka.create_topic(topic, PARTITIONS)
        running.enter_context(BackgroundFeeder(KafkaFeeder(kafka, topic), interval=FEED_INTERVAL))
    print(
        f"Kafka broker at {kafka.bootstrap} (${KAFKA_ENV}); producing a round of events to {', '.join(topics)} "
        f"every {FEED_INTERVAL:.0f}s",
        flush=True,
    )
    return set(readers)


SHIM = """#!/bin/sh
# Written by `make airflow` (devtools/airflow_ui.py). airflow standalone starts its components as
# `airflow <command>`: this runs this environment's airflow, and the scheduler and triggerer without their
# task log servers, which would listen on every interface on the fixed ports 8793 and 8794 (on one machine
# the API server reads the task logs from their files).
case "$1" in
  scheduler|triggerer) exec "{airflow}" "$@" --skip-serve-logs ;;
esac
exec "{airflow}" "$@"
"""
REPEAT_WINDOW = 2.0  # seconds: signals this close to the first are the same Ctrl-C arriving again
STOP_GRACE = 60.0  # seconds standalone's components have to stop after the Ctrl-C


def component_shim(home: Path, airflow: str) -> Path:
    """A directory holding the `airflow` that standalone finds first on PATH."""
    directory = home / "bin"
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "airflow"
    shim.write_text(SHIM.format(airflow=airflow))
    shim.chmod(0o755)
    return directory


def run_until_interrupted(command: list[str]) -> int:
    """Run `command` in a session of its own and pass it ONE SIGINT on Ctrl-C; a Ctrl-C more than
    REPEAT_WINDOW seconds later kills it. A terminal's Ctrl-C signals the whole foreground group, and under
    `make airflow` the same Ctrl-C arrives here more than once (from the terminal, and forwarded by uv run);
    standalone's scheduler, signalled twice (SIGINT, then SIGTERM from standalone), would wait forever for
    its LocalExecutor workers. Signalled once, standalone stops every component within seconds; one that has
    not stopped STOP_GRACE seconds later is named and killed, so that standalone ends."""
    process: subprocess.Popen[bytes] | None = None
    first: float | None = None

    def forward(signum: int, frame: object) -> None:
        nonlocal first
        if process is None:  # not started yet: it will not start
            raise KeyboardInterrupt
        now = time.monotonic()
        if first is None:
            first = now
            print("stopping airflow standalone (Ctrl-C again to kill it)", flush=True)
            process.send_signal(signal.SIGINT)
        elif now - first > REPEAT_WINDOW:
            print("killing airflow standalone", flush=True)
            os.killpg(process.pid, signal.SIGKILL)

    # before the start: a handled signal is reset to its default in the child, an ignored one stays ignored
    # (a shell ignores SIGINT in what it starts in the background: standalone would never see the Ctrl-C)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    process = subprocess.Popen(command, start_new_session=True)
    forced = False
    while True:
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if first is not None and not forced and time.monotonic() - first > STOP_GRACE:
                forced = True
                kill_lingering(process.pid)


def kill_lingering(session: int) -> None:
    """Kill what still runs in standalone's session but standalone itself, each named: standalone waits for its
    components' output to end, and a component that ignored its SIGTERM would keep it waiting for ever."""
    for pid, command in sorted(session_processes(session).items()):
        if pid != session:
            print(f"{command} (pid {pid}) did not stop {STOP_GRACE:.0f} s after the Ctrl-C: killing it", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def session_processes(session: int) -> dict[int, str]:
    """The running processes of a session: pid -> command line."""
    found = {}
    for pid in processes.pids():
        fields = processes.stat_fields(pid)
        if fields is not None and fields[processes.STATE] != "Z" and int(fields[processes.SESSION]) == session:
            found[pid] = processes.command_line(pid) or "?"
    return found


if __name__ == "__main__":
    sys.exit(main())
