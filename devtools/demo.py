"""The main job (`make demo`): the core lifecycle of a stateful streaming job that reads Kafka, run through Airflow,
in a few minutes: deploy v1, a savepoint from the savepoint DAG, the retention DAG, a blue/green upgrade to v2 (its
gap printed), the exactly-once check. `make tour` (`--tour`) runs the whole lifecycle below.

A Kafka broker (KRaft, on 127.0.0.1, devtools/kafka.py) holds the job's topic; an embedded S3 server (moto)
holds the snapshot store, the job's checkpoints (through Spark's S3A) and its sink, a Delta table; a
project-local AIRFLOW_HOME (.demo/airflow) gets a migrated sqlite metadata DB; the DAGs run with `dag.test()`
(real tasks, real deferrable triggers, real spark-submit drivers in local mode): deploy v1, savepoint,
retention, upgrade to v2 blue/green (v2 beside v1, an exactly-once cutover; it prints the longest time the table
went without a commit during the upgrade, and before it), upgrade to a version that fails before its cutover
(aborted: v2 never stopped) and to one that fails after it (the rollback RESTOREs the table and puts v2 back),
upgrade to v3 (a new grouping key: replayed beside v2 from where the state it needs began), a migration whose function
returns a key twice (refused, v3 keeps running), upgrade to by_country (per country: its state migrated from
v3's), a replay refused once Kafka deleted the records it needs, stop with a savepoint, an exactly-once check of
the output against every record produced (each window written by one version), a fresh deploy onto the table
refused, and a savepoint whose Kafka records retention deleted, refused. Prints each step, check and a summary on the
terminal; what Airflow itself prints (task logs, an expected failure's traceback) goes to .demo/demo.log. Exits
non-zero if any check fails. The broker and the S3 server are stopped at the end, whatever happened."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from airflow_plugin.cli.render import source_text
from airflow_plugin.core.errors import SavepointsError
from airflow_plugin.core.guards import source as source_guard
from airflow_plugin.core.jobs.stop import kill
from devtools import airflow_env
from devtools.embedded_s3 import EmbeddedS3
from devtools.java import require_java
from devtools.kafka import EmbeddedKafka
from devtools.kafka_job import table_of
from devtools.scenario import JOB, Lifecycle  # imports airflow only when a DAG runs (after configure)

WORK = Path(".demo").absolute()
LOG = WORK / "demo.log"


def _quiet() -> None:
    """Task logs of dag.test() go to the console at INFO: keep the demo's own output readable."""
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"
    logging.basicConfig(level=logging.WARNING)
    for name in ("airflow", "py4j", "botocore", "werkzeug", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _terminal_apart_from_airflow(log: Path) -> Console:
    """The demo's own lines go to the terminal; everything else that this process (and its children) write
    to stdout and stderr, i.e. Airflow's task logs with their tracebacks, goes to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    return Console(file=terminal, highlight=False, width=None if terminal.isatty() else 160)


def _took(started: str, ended: str | None) -> str:
    if not ended:
        return "-"
    took = datetime.fromisoformat(ended.replace("Z", "+00:00")) - datetime.fromisoformat(started.replace("Z", "+00:00"))
    return f"{took.total_seconds():.1f}s"


def _summary(console: Console, lifecycle: Lifecycle, started: float) -> None:
    snapshots = Table(title="snapshots", header_style="bold")
    for column in ("id", "kind", "trigger", "status", "batch", "files", "bytes", "uploaded", "time", "kafka", "labels"):
        snapshots.add_column(column)
    manifests = lifecycle.store.list(JOB)
    checks = source_guard.assess(manifests, lifecycle.job.kafka)
    for m in manifests:
        snapshots.add_row(
            m.id,
            str(m.kind),
            str(m.trigger),
            str(m.status),
            str(m.batch_id),
            str(m.file_count),
            f"{m.total_bytes:,}",
            f"{m.uploaded_bytes:,}",
            _took(m.created_at, m.completed_at),
            source_text(checks.get(m.id)),
            ",".join(f"{k}={v}" for k, v in m.labels.items()) + (" pinned" if m.pinned else ""),
        )
    deployments = Table(title="deployments", header_style="bold")
    for column in ("id", "version", "state", "restored from", "at batch", "last batch"):
        deployments.add_column(column)
    for d in lifecycle.deployments():
        status = lifecycle.status(d.id)
        deployments.add_row(
            d.id,
            d.version,
            str(lifecycle.state(d.id)),
            d.restored_from or "- (fresh start)",
            _dash(d.restored_batch_id),
            _dash(status.last_batch_id if status else None),
        )
    runs = Table(title="DAG runs", header_style="bold")
    for column in ("dag", "state", "seconds", "tasks"):
        runs.add_column(column)
    for r in lifecycle.runs:
        runs.add_row(r.dag_id, r.state, f"{r.seconds:.1f}", ", ".join(f"{t}={s}" for t, s in r.tasks.items()))
    for table in (runs, snapshots, deployments):
        console.print()
        console.print(table)
    failures = lifecycle.failures
    console.print(
        f"\ndemo finished in {time.monotonic() - started:.0f}s: "
        + ("[green]all checks passed[/]" if not failures else f"[red]{len(failures)} check(s) failed:[/] {failures}")
    )
    console.print(f"what Airflow itself printed (task logs, tracebacks): {LOG}")


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    tour = "--tour" in (sys.argv[1:] if argv is None else argv)
    require_java()
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    console = _terminal_apart_from_airflow(LOG)
    home = WORK / "airflow"
    airflow_env.configure(home)  # before anything imports airflow
    _quiet()
    with EmbeddedS3() as s3, EmbeddedKafka() as kafka:
        s3.apply_env()
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = s3.airflow_connection()  # what the operators' hook reads
        store = s3.create_bucket("savepoints") + "/store"
        lake = s3.create_bucket("lake").replace("s3://", "s3a://", 1)
        console.print(f"[bold cyan]>>[/] embedded S3 (moto server) at {s3.endpoint}; snapshot store {store}")
        console.print(f"[bold cyan]>>[/] checkpoints in {lake}/checkpoints, the sink: a Delta table {table_of(lake)}")
        console.print(f"[bold cyan]>>[/] Kafka broker (KRaft) at {kafka.bootstrap}")
        console.print(f"[bold cyan]>>[/] Airflow metadata DB in {home} (airflow db migrate)")
        airflow_env.migrate(home)

        from devtools.scenario import Lifecycle

        lifecycle = Lifecycle(
            WORK,
            store,
            kafka,
            lake=lake,
            say=lambda text: console.print(
                Text(text) if text.startswith(" ") else Text.assemble((">> ", "bold cyan"), text)
            ),
        )
        try:
            lifecycle.run(tour=tour, rollback=True)
        except Exception as exc:  # a step that could not even run: report it like a failed check
            lifecycle.check(False, f"{type(exc).__name__}: {exc} (details in {LOG})")
        finally:
            _stop_leftovers(console, lifecycle)
        _summary(console, lifecycle, started)
    return 1 if lifecycle.failures else 0


def _stop_leftovers(console: Console, lifecycle: Lifecycle) -> None:
    """A failed step may leave a driver running: kill it so the demo never leaves processes behind."""
    if lifecycle.running():
        try:
            kill(lifecycle.job)
        except SavepointsError as exc:
            console.print(f"could not kill the leftover deployment: {exc}")


if __name__ == "__main__":
    sys.exit(main())
