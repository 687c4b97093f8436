"""Declared jobs kept as the jobs file says, every 5 minutes: each job with `desired` is deployed, restarted after
a failure (within its restart budget), upgraded to its declared version or stopped (`savepoints apply`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_plugin.dag_params import dag_jobs_file, declared_jobs
from airflow_plugin.operators import ApplyJobOperator

JOBS_FILE = dag_jobs_file(__file__)
DECLARED = sorted(name for name, spec in declared_jobs(JOBS_FILE).items() if spec.desired is not None)

with DAG(
    dag_id="savepoints_reconcile",
    description=__doc__.splitlines()[0],
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one loop at a time: a second would only be refused by each job's lease
    tags=["savepoints"],
    params={"dry_run": Param(False, type="boolean", title="Dry run: only print each job's step")},
    doc_md=__doc__,
):
    ApplyJobOperator.partial(task_id="apply", jobs_file=JOBS_FILE, dry_run="{{ params.dry_run }}", retries=0).expand(
        job=DECLARED
    )
